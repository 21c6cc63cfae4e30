"""PostgreSQL ``LISTEN``/``NOTIFY`` for the database backend's wake-ups.

The listening connection is a private one (the store's timeouts and TCP keepalives, see
:class:`~django_leader.backends.db_connection.PrivateConnection`), used by the hub's thread
only; psycopg 3.2+ (``Connection.notifies(timeout=…)``) and psycopg2 are supported.
"""

from __future__ import annotations

import select
from collections.abc import Iterable
from typing import Any

from django.db import connections

from .db_connection import PrivateConnection
from .sql import Dialect


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
        wrapper = self._private.get()
        wrapper.ensure_connection()
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
