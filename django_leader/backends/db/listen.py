"""The database backend's wake-ups: PostgreSQL ``LISTEN``/``NOTIFY``.

A release notifies the name's channel in its own transaction; :class:`DatabaseWakeups`
listens on one connection per process shared by every watch. The listening connection
is a private one (the store's timeouts and TCP keepalives, see
:class:`~django_leader.backends.db.connection.PrivateConnection`), used by the hub's
thread only; psycopg 3.2+ (``Connection.notifies(timeout=…)``) and psycopg2 are
supported. SQLite and MySQL/MariaDB cannot push: candidates poll.
"""

from __future__ import annotations

import select
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any

from django.db import connections

from ...exceptions import BackendUnavailable
from ...forksafe import ForkSafeLock
from ..base import Watch
from ..wakeups import WakeHub, channel
from .connection import PrivateConnection, pooled
from .dialect import Dialect
from .tables import LeaseTables


class PostgresListener:
    """A :class:`~django_leader.backends.wakeups.Transport` over ``LISTEN``."""

    def __init__(self, alias: str, dialect: Dialect, timeout: float) -> None:
        self._private = PrivateConnection(alias, dialect, timeout)
        self._raw: Any = None

    @classmethod
    def for_alias(cls, alias: str, dialect: Dialect, timeout: float) -> PostgresListener | None:
        """A listener for database ``alias``, or None if its driver cannot wait for
        notifications with a timeout (psycopg 3 before 3.2)."""
        if connections[alias].vendor != "postgresql":
            return None
        try:
            import psycopg
        except ImportError:
            return cls(alias, dialect, timeout)  # psycopg2: select() and poll()
        version = tuple(int(part) for part in psycopg.__version__.split(".")[:2])
        return cls(alias, dialect, timeout) if version >= (3, 2) else None

    def connect(self) -> None:
        self.close()
        wrapper = self._private.open(self._private.get())
        if pooled(self._private.alias):
            raise ConnectionError("behind a transaction pooler, LISTEN hears nothing")
        self._raw = wrapper.connection

    def _execute(self, sql: str) -> None:
        wrapper = self._private.get()
        with wrapper.cursor() as cursor:
            cursor.execute(sql)

    def subscribe(self, names: Iterable[str]) -> None:
        for name in names:  # a digest: a safe identifier (see wakeups.channel)
            self._execute(f'LISTEN "{name}"')

    def unsubscribe(self, names: Iterable[str]) -> None:
        for name in names:
            self._execute(f'UNLISTEN "{name}"')

    def wait(self, timeout: float) -> list[str]:
        raw = self._raw
        if raw is None:
            raise ConnectionError("not connected")
        if hasattr(raw, "notifies") and callable(raw.notifies):  # psycopg 3
            # Return with the first one (a list comprehension alone would wait out the
            # timeout); any others come with the next call.
            return [notify.channel for notify in raw.notifies(timeout=timeout, stop_after=1)]
        readable, _, _ = select.select([raw], [], [], timeout)  # psycopg2
        if readable:
            raw.poll()
        got = [notify.channel for notify in raw.notifies]
        raw.notifies.clear()
        return got

    def close(self) -> None:
        self._raw = None
        self._private.close()


class DatabaseWakeups:
    """The wake-ups of the leases in ``tables``: pushed where the dialect can notify
    (PostgreSQL), on one listening connection per process with the store's ``timeout``."""

    def __init__(self, tables: LeaseTables, timeout: float) -> None:
        self.tables = tables
        self.timeout = timeout
        self._hub: WakeHub | None = None
        self._hub_lock = ForkSafeLock()  # one hub, however many threads watch at once
        self._probe_lock = ForkSafeLock()  # one connection finds out about a pooler

    def watch(self, name: str, callback: Callable[[], None], identity: str | None) -> Watch | None:
        """Call ``callback`` when the channel of ``name`` (or of ``identity``) is notified;
        None where the database cannot push."""
        if self.tables.dialect.notify is None:
            return None
        if pooled(self.tables.alias) is None:
            self._find_out_pooled()
        if pooled(self.tables.alias):
            return None  # LISTEN needs a session of its own: candidates poll
        hub = self._wake_hub()
        if hub is None:
            return None
        return hub.watch_lease(self.tables.channel_prefix, name, identity, callback)

    def _find_out_pooled(self) -> None:
        """Connect once, so that the connection tells whether a transaction pooler is in
        the way. The caller is a campaign's or a ``lock()`` caller's thread, not a store
        worker: it keeps no connection of its own afterwards (twenty Electors starting
        together would otherwise hold twenty connections for as long as they campaign),
        and one thread at a time asks (the others wait for its answer)."""
        with self._probe_lock:
            if pooled(self.tables.alias) is not None:
                return
            connected_before = self.tables.connect().connection is not None
            try:
                with suppress(BackendUnavailable), self.tables.cursor(atomic=False):
                    pass
            finally:
                if not connected_before:
                    self.tables.disconnect()

    def wake(self, name: str, identity: str | None = None) -> None:
        """Notify the channel of ``name`` (or of ``identity``), where the database can."""
        notify = self.tables.dialect.notify
        if notify is None:
            return
        with self.tables.cursor(atomic=False) as cursor:
            cursor.execute(
                f"SELECT {notify}", [channel(self.tables.channel_prefix, name, identity)]
            )

    def _wake_hub(self) -> WakeHub | None:
        with self._hub_lock:
            hub = self._hub
            if hub is None or not hub.usable():
                alias, dialect = self.tables.alias, self.tables.dialect
                transport = PostgresListener.for_alias(alias, dialect, self.timeout)
                if transport is None:
                    return None
                hub = self._hub = WakeHub(transport, f"leader-listen:{alias}")
            return hub
