"""The database backend's private connections.

Lease operations run on a connection of their own (one per thread), so they commit at once
even when called inside the caller's ``transaction.atomic()``, and every call is bounded by
a connect/statement timeout shorter than the renew deadline. A forked child drops the
connections it inherited (they are the parent's sockets) and opens its own.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import weakref
from contextlib import suppress
from typing import Any

from django.db import connections
from django.db.utils import Error as DjangoDBError
from django.db.utils import load_backend

from .dialect import Dialect

logger = logging.getLogger("django_leader")

#: Seconds a private connection may sit idle before it is checked (is_usable()) on reuse.
IDLE_CHECK = 10.0

#: Every PrivateConnection, so that a forked child can drop what it inherited.
_instances: weakref.WeakSet[PrivateConnection] = weakref.WeakSet()
#: Every open private connection wrapper, of every thread (weakly: one whose thread ended
#: goes as it always did).
_wrappers: weakref.WeakSet[Any] = weakref.WeakSet()
#: Strong references taken just before a fork (see _before_fork).
_pinned: list[Any] = []
#: Database alias -> whether its connections go through a transaction pooler (PgBouncer),
#: as the first private connection found out (absent: not known yet).
_POOLED: dict[str, bool] = {}


def pooled(alias: str) -> bool | None:
    """Whether database ``alias`` is reached through a transaction pooler: session settings
    do not stick, LISTEN hears nothing (None: no private connection made yet)."""
    return _POOLED.get(alias)


def _before_fork() -> None:
    # A forked child keeps only the forking thread: Python frees the thread-local data of
    # every other thread in the child, and a connection freed there says goodbye to the
    # server (MySQL's COM_QUIT, PostgreSQL's Terminate) on the socket it shares with the
    # parent, which ends the parent's session. Pin them all across the fork.
    _pinned[:] = list(_wrappers)


def _after_fork_in_parent() -> None:
    _pinned.clear()


def _after_fork_in_child() -> None:
    # The parent's sockets are not this process's to use, nor to close (closing would
    # end the parent's session): forget them, keeping them referenced, and start afresh.
    _inherited.append(list(_pinned))
    _pinned.clear()
    for private in list(_instances):
        _inherited.append(private._local)
        private._local = threading.local()


_inherited: list[Any] = []
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class PrivateConnection:
    """A connection of the lease store's own to database ``alias``, one per thread, with
    the store's timeouts (``dialect.timeout_options``) and autocommit: lease operations
    commit at once, even inside the caller's ``transaction.atomic()``."""

    def __init__(self, alias: str, dialect: Dialect, timeout: float) -> None:
        self.alias = alias
        self.dialect = dialect
        self.timeout = timeout
        self._local = threading.local()
        _instances.add(self)

    def get(self) -> Any:
        """This thread's private connection wrapper, created on first use.

        One idle for longer than :data:`IDLE_CHECK` is checked before use (a database
        restart, a server-side idle timeout or a proxy may have dropped it), so the call
        after an idle spell does not fail on a dead socket.
        """
        wrapper = getattr(self._local, "wrapper", None)
        now = time.monotonic()
        if (
            wrapper is not None
            and wrapper.connection is not None
            and now - getattr(self._local, "used_at", now) > IDLE_CHECK
            and not wrapper.is_usable()
        ):
            self.close()
            wrapper = None
        self._local.used_at = now
        if wrapper is None:
            settings_dict = copy.deepcopy(connections[self.alias].settings_dict)
            options = dict(settings_dict.get("OPTIONS") or {})
            # Lease statements want plain READ COMMITTED, whatever the project uses: under
            # REPEATABLE READ/SERIALIZABLE racing acquirers would fail instead of waiting.
            options.pop("isolation_level", None)
            settings_dict["OPTIONS"] = self.dialect.timeout_options(
                options, self.timeout, startup=not _POOLED.get(self.alias, False)
            )
            settings_dict["DJANGO_LEADER_OPTIONS"] = options  # before the bounds
            settings_dict["ATOMIC_REQUESTS"] = False
            settings_dict["AUTOCOMMIT"] = True
            settings_dict["CONN_MAX_AGE"] = None
            settings_dict["CONN_HEALTH_CHECKS"] = False
            wrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
                settings_dict, self.alias
            )
            self._local.wrapper = wrapper
            _wrappers.add(wrapper)
        return wrapper

    def open(self, wrapper: Any) -> Any:
        """``wrapper`` (from :meth:`get`), connected. Behind a transaction pooler (PgBouncer
        refuses the session settings sent at connect, or drops them), the store's bounds
        cannot be session settings: the connection is marked ``django_leader_pooled`` and
        every call sets them in its own transaction (see ``LeaseTables.cursor``)."""
        if wrapper.connection is not None:
            return wrapper
        try:
            wrapper.ensure_connection()
        except DjangoDBError as exc:
            if _POOLED.get(self.alias) or not self.dialect.startup_refused(exc):
                raise
            self._pooled("refused the session settings sent at connect")
            wrapper.settings_dict["OPTIONS"] = self.dialect.timeout_options(
                wrapper.settings_dict["DJANGO_LEADER_OPTIONS"], self.timeout, startup=False
            )
            wrapper.ensure_connection()
        if not _POOLED.get(self.alias) and not self.dialect.session_bounded(wrapper, self.timeout):
            self._pooled("dropped the session settings sent at connect")
        wrapper.django_leader_pooled = _POOLED.setdefault(self.alias, False)
        return wrapper

    def _pooled(self, why: str) -> None:
        if not _POOLED.get(self.alias):
            logger.warning(
                "database %r: the server %s: a transaction pooler (PgBouncer?). The lease "
                "store's timeouts are set in every transaction instead, and LISTEN/NOTIFY "
                "wake-ups are off: waiting candidates poll every RETRY_INTERVAL",
                self.alias,
                why,
            )
        _POOLED[self.alias] = True

    def close(self) -> None:
        wrapper = getattr(self._local, "wrapper", None)
        if wrapper is not None:
            self._local.wrapper = None
            with suppress(DjangoDBError):
                wrapper.close()
