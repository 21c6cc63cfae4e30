"""The ZooKeeper store's base: its settings, its session (connected within the call
bound), the calls every operation makes (a kazoo call waited for, a znode read or made)
and the znode paths.

:class:`Ensemble` is what the other modules of the package build on: the ensemble's clock
(:mod:`.clock`) subclasses it, the lease operations (:mod:`.leases`, :mod:`.renewal`) and
the candidates (:mod:`.candidates`) subclass that; the store marker (:mod:`.losses`), the
watch thread (:mod:`.watches`) and the beat's slot records (:mod:`.slots`) are handed one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

from ...conf import ZooKeeperSettings, get_settings
from ...exceptions import BackendUnavailable
from ...forksafe import ForkSafeLock
from ..base import Backend, Watch
from ..history import HistoryWriter, WrittenAfterwards
from .layout import Held, digest, encode_name
from .session import DEFAULT_SESSION_TIMEOUT, Session, default_zookeeper

logger = logging.getLogger("django_leader")


class WakeUpHub(Protocol):
    """The watch thread of a backend (:class:`.watches.Hub`), as the rest of it uses it."""

    def watch(self, name: str, identity: str | None, callback: Callable) -> Watch: ...

    def rearm(self, name: str, identity: str) -> None: ...

    def state_changed(self, state: str) -> None: ...

    def stop(self) -> None: ...


class Ensemble(WrittenAfterwards, Backend):
    """A ZooKeeper ensemble's session, paths and clock, shared by every operation of
    :class:`~.backend.ZooKeeperBackend`."""

    def __init__(
        self,
        *,
        timeout: float | None = None,
        root: str | None = None,
        hosts: str | None = None,
        session_timeout: float | None = None,
    ) -> None:
        conf = get_settings()
        base = conf.zookeeper or default_zookeeper()
        self.conf = ZooKeeperSettings(
            hosts=hosts or base.hosts,
            root=root or base.root,
            session_timeout=session_timeout or base.session_timeout,
            connect_timeout=base.connect_timeout,
            auth=base.auth,
            acl=base.acl,
            tls=base.tls,
        )
        self.timeout = timeout or conf.timing.call_timeout
        self.root = self.conf.root
        self.history_database = conf.database if conf.history else None
        self._history = HistoryWriter(conf.database) if conf.history else None
        self._lock = ForkSafeLock()  # a child forked while a thread held it gets it free
        self._current: Session | None = None
        self._default_timeout = float(
            self.conf.session_timeout or max(conf.timing.ttl, DEFAULT_SESSION_TIMEOUT)
        )
        #: (ensemble ms, time.monotonic()) of the latest write seen: the clock estimate.
        self._clock: tuple[int, float] | None = None
        #: (name, holder, token) -> what we know of the lease znode we wrote.
        self._versions: dict[tuple[str, str, int], Held] = {}
        #: (name, identity) -> path of our candidate node.
        self._mine: dict[tuple[str, str], str] = {}
        self._made: set[str] = set()
        self._hub: WakeUpHub | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"<ZooKeeperBackend {self.conf.hosts!r} {self.root!r}>"

    # -- connection -------------------------------------------------------------------------
    def _session(self) -> Session:
        """This backend's session, connected within the call bound, else
        BackendUnavailable (the client keeps reconnecting in the background)."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():  # (not reset by another thread meanwhile)
                    self._forked()
        with self._lock:
            session = self._current
            if session is None:
                session = self._current = Session(
                    self.conf, self._default_timeout, self._state_changed
                )
        if not session.client.connected:
            bound = self.conf.connect_timeout or self.timeout
            session.started.wait(bound)
            if not session.client.connected:
                raise BackendUnavailable(
                    f"zookeeper {self.conf.hosts!r}: not connected (session state "
                    f"{session.client.state})"
                )
        return session

    def _forked(self) -> None:
        """In a forked child: the parent's sessions are the parent's (their threads did not
        come along, and closing them would end the parent's session): start afresh. Under
        ``_lock``, which the child has free even if a thread of the parent held it at the
        fork (:class:`~django_leader.forksafe.ForkSafeLock`)."""
        self._pid = os.getpid()
        self._current = None
        self._hub = None
        self._versions.clear()
        self._mine.clear()

    @property
    def client(self) -> Any:
        return self._session().client

    def _state_changed(self, state: str) -> None:
        hub = self._hub
        if hub is not None:
            hub.state_changed(state)

    def _wait(self, result: Any, deadline: float | None = None) -> Any:
        """The outcome of a kazoo async call within the call bound (or by ``deadline``, a
        ``time.monotonic()`` time, for the calls of a batch sent together)."""
        from kazoo.exceptions import (
            ConnectionClosedError,
            ConnectionLoss,
            OperationTimeoutError,
            SessionExpiredError,
        )
        from kazoo.handlers.threading import KazooTimeoutError

        timeout = self.timeout if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return result.get(timeout=timeout)
        except KazooTimeoutError as exc:
            raise BackendUnavailable(
                f"zookeeper {self.conf.hosts!r}: no answer within {self.timeout:g}s"
            ) from exc
        except (
            ConnectionLoss,
            SessionExpiredError,
            ConnectionClosedError,
            OperationTimeoutError,
        ) as exc:
            raise BackendUnavailable(f"zookeeper {self.conf.hosts!r}: {exc!r}") from exc

    def _get(self, client: Any, path: str) -> tuple[dict[str, Any], Any] | None:
        """``(data, stat)`` of ``path``, or None if it does not exist."""
        return self._read_result(client.get_async(path))

    def _read_result(
        self, result: Any, deadline: float | None = None
    ) -> tuple[dict[str, Any], Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._wait(result, deadline)
        except NoNodeError:
            return None
        return (json.loads(raw) if raw else {}), stat

    def _ensure(self, client: Any, path: str, *, anew: bool = False) -> None:
        """Create ``path`` (and its parents) if missing; remembered once made. ``anew``:
        it was found missing (the store was wiped): forget that it was made."""
        if anew:
            self._made.discard(path)
        elif path in self._made:
            return
        from kazoo.exceptions import NodeExistsError

        with suppress(NodeExistsError):
            self._wait(client.create_async(path, b"", makepath=True))
        self._made.add(path)

    # -- paths ------------------------------------------------------------------------------
    def _name_path(self, name: str) -> str:
        return f"{self.root}/names/{encode_name(name)}"

    def _lease_path(self, name: str) -> str:
        return f"{self._name_path(name)}/lease"

    def _queue_path(self, name: str) -> str:
        return f"{self._name_path(name)}/queue"

    def _bell_path(self, name: str, identity: str | None) -> str:
        return f"{self._name_path(name)}/bells/{digest(identity) if identity else 'all'}"

    # -- the store marker -------------------------------------------------------------------
    def _forget_made(self) -> None:
        """The store lost state: whatever we made (parents, session markers) may be gone."""
        self._made.clear()

    # -- health and the end ----------------------------------------------------------------
    def ping(self, timeout: float) -> float:
        """Connect (within ``timeout``) and return the session timeout the ensemble granted
        (seconds); BackendUnavailable if it does not answer. For the system check: one
        read, no write."""
        with self._lock:
            session = self._current
            if session is None:
                session = self._current = Session(
                    self.conf, self._default_timeout, self._state_changed
                )
        session.started.wait(timeout)
        if not session.client.connected:
            raise BackendUnavailable(
                f"zookeeper {self.conf.hosts!r}: no answer within {timeout:g}s"
            )
        self._wait(session.client.exists_async(self.root))
        return session.granted or self._default_timeout

    def close(self) -> None:
        """kazoo's connection is shared by threads: nothing per thread."""

    def shutdown(self) -> None:
        """End every session (its ephemeral leases and candidacies go at once) and the
        watch thread. The backend reconnects if used again."""
        with self._lock:
            sessions = [self._current] if self._current is not None else []
            self._current = None
            hub, self._hub = self._hub, None
        if hub is not None:
            hub.stop()
        for session in sessions:
            try:
                session.client.stop()
                session.client.close()
            except Exception:  # pragma: no cover - best effort
                logger.debug("closing a ZooKeeper session failed", exc_info=True)
        self._versions.clear()
        self._mine.clear()
        self._made.clear()
