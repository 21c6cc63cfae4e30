"""The SQL that differs between database vendors, for the database backend.

The server's clock (``statement_timestamp()``, ``UTC_TIMESTAMP(6)``, SQLite's ``'now'``),
expiries, upserts, connection timeouts and the server-side bounds of a fenced transaction;
and :class:`StoreNow`, the same clock as a Django query expression.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime


class Dialect:
    """The few SQL fragments that differ between vendors: the server clock and upserts."""

    returning = True  # UPDATE ... RETURNING

    def now(self) -> str:
        raise NotImplementedError

    def expiry(self) -> str:
        """SQL for *server now + ttl*; takes one parameter, see :meth:`ttl_param`."""
        raise NotImplementedError

    def ttl_param(self, ttl: float) -> Any:
        raise NotImplementedError

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        raise NotImplementedError

    def upsert(self, table: str, columns: str, values: str, key: str, update: list[str]) -> str:
        """``INSERT``, or on a conflict on the unique ``key`` columns, set the ``update``
        columns to the values that were to be inserted."""
        sets = ", ".join(f"{column} = excluded.{column}" for column in update)
        return (
            f"INSERT INTO {table} ({columns}) VALUES ({values}) "
            f"ON CONFLICT ({key}) DO UPDATE SET {sets}"
        )

    def timeout_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the server's clock in microseconds since the epoch:
        the first token of a name when there is no history to continue from."""
        raise NotImplementedError

    def bound_transaction(
        self, cursor: Any, connection: Any, seconds: float, saved: dict[str, Any]
    ) -> None:
        """Have the server end the open transaction of ``connection`` (a Django connection;
        ``cursor``: a DB-API cursor of it), killing the session if it must, should it still
        run a statement, or sit idle, ``seconds`` from now (see :meth:`DatabaseBackend.fenced`).
        ``saved`` is kept across the calls for one transaction: what must be restored after
        it (see :meth:`unbound_transaction`)."""

    def unbound_transaction(self, cursor: Any, saved: dict[str, Any]) -> None:
        """Restore what :meth:`bound_transaction` saved."""


class _PostgreSQL(Dialect):
    # statement_timestamp(), not now(): inside a caller's transaction (fenced()) now() is
    # the time that transaction began.
    def now(self) -> str:
        return "statement_timestamp()"

    def expiry(self) -> str:
        return "statement_timestamp() + %s * interval '1 microsecond'"

    def ttl_param(self, ttl: float) -> Any:
        return round(ttl * 1_000_000)

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING"

    def timeout_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        ms = max(100, round(timeout * 1000))
        options = dict(options)
        options.pop("pool", None)  # a private connection, never one borrowed from a pool
        options.setdefault("connect_timeout", max(2, math.ceil(timeout)))
        # A cut network leaves sent data unacknowledged: give up on it after `timeout`.
        options.setdefault("tcp_user_timeout", ms)
        options.setdefault("keepalives", 1)
        options.setdefault("keepalives_idle", max(1, math.ceil(timeout)))
        options.setdefault("keepalives_interval", 1)
        options.setdefault("keepalives_count", 3)
        extra = (
            f"-c statement_timeout={ms} -c lock_timeout={ms} "
            f"-c idle_in_transaction_session_timeout={max(ms * 4, 1000)}"
        )
        options["options"] = f"{options.get('options', '')} {extra}".strip()
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        return "(extract(epoch from clock_timestamp()) * 1000000)::bigint", []

    def bound_transaction(
        self, cursor: Any, connection: Any, seconds: float, saved: dict[str, Any]
    ) -> None:
        # Local to the transaction: they end with it, nothing to restore. The idle timeout
        # ends the session of a holder frozen or cut off between two statements; the
        # statement and lock timeouts a statement of it that runs or waits too long.
        ms = str(math.ceil(seconds * 1000))
        names = ["statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"]
        if connection.pg_version >= 170000 and not saved:
            # Counted from when it is first set (PostgreSQL ignores later changes while its
            # timer runs): set once, at the start of the transaction, to the lease's time left.
            names.append("transaction_timeout")
            saved["transaction_timeout"] = None  # nothing to restore: a marker
        cursor.execute(
            "SELECT " + ", ".join(f"set_config('{name}', %s, true)" for name in names),
            [ms] * len(names),
        )


class _MySQL(Dialect):
    returning = False

    def now(self) -> str:
        return "UTC_TIMESTAMP(6)"

    def expiry(self) -> str:
        return "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND)"

    def ttl_param(self, ttl: float) -> Any:
        return round(ttl * 1_000_000)

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT IGNORE INTO {table} ({columns}) VALUES ({values})"

    def upsert(self, table: str, columns: str, values: str, key: str, update: list[str]) -> str:
        sets = ", ".join(f"{column} = VALUES({column})" for column in update)
        return f"INSERT INTO {table} ({columns}) VALUES ({values}) ON DUPLICATE KEY UPDATE {sets}"

    def timeout_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        options = dict(options)
        seconds = max(1, math.ceil(timeout))  # the drivers take whole seconds, at least 1
        options.setdefault("connect_timeout", seconds)
        # libmysqlclient tries a timed-out read three times in all, so its effective bound
        # is three times the option; MariaDB Connector/C (client version 3.x) gives up after
        # one. Either way no less than 1 s per try.
        tries = 1 if _mariadb_client() else 3
        options.setdefault("read_timeout", max(1, math.ceil(timeout / tries)))
        options.setdefault("write_timeout", seconds)
        # A lease statement waiting on a row lock gives up on the server too, not only in
        # the client (InnoDB's default wait is 50 s). Both MySQL and MariaDB know it.
        options.setdefault("init_command", f"SET SESSION innodb_lock_wait_timeout = {seconds}")
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        # NOW(6) and UNIX_TIMESTAMP() both use the session time zone, which cancels out.
        return "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)", []

    def bound_transaction(
        self, cursor: Any, connection: Any, seconds: float, saved: dict[str, Any]
    ) -> None:
        # Session variables (there is no SET LOCAL): saved once, restored by
        # unbound_transaction(). MariaDB checks idle_transaction_timeout (and MySQL
        # wait_timeout) before reading each command, so a change applies to the open
        # transaction; these take whole seconds (max_statement_time takes fractions).
        if connection.mysql_is_mariadb:
            names = ["idle_transaction_timeout", "max_statement_time", "innodb_lock_wait_timeout"]
        else:
            names = ["wait_timeout", "innodb_lock_wait_timeout"]
        if not saved:
            cursor.execute("SELECT " + ", ".join(f"@@SESSION.{name}" for name in names))
            saved.update(zip(names, cursor.fetchone(), strict=True))
        whole = max(1, math.ceil(seconds))
        values = {name: whole for name in names}
        if "max_statement_time" in values:
            values["max_statement_time"] = round(seconds, 3)  # type: ignore[assignment]
        cursor.execute(
            "SET " + ", ".join(f"SESSION {name} = %s" for name in names),
            [values[name] for name in names],
        )

    def unbound_transaction(self, cursor: Any, saved: dict[str, Any]) -> None:
        if saved:
            cursor.execute(
                "SET " + ", ".join(f"SESSION {name} = %s" for name in saved), list(saved.values())
            )


class _SQLite(Dialect):
    # Doubled %: Django's cursor treats the SQL as a format string when it has params.
    _FORMAT = "'%%Y-%%m-%%d %%H:%%M:%%f'"

    def now(self) -> str:
        return f"strftime({self._FORMAT}, 'now')"

    def expiry(self) -> str:
        return f"strftime({self._FORMAT}, 'now', %s)"

    def ttl_param(self, ttl: float) -> Any:
        return f"+{ttl:.3f} seconds"

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT OR IGNORE INTO {table} ({columns}) VALUES ({values})"

    def timeout_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        options = dict(options)
        options["timeout"] = min(float(options.get("timeout", timeout)), timeout)
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        # SQLite's clock is this machine's (SQLite runs in this process), and its own
        # 'now' has only millisecond resolution: this process's clock, in microseconds.
        return "%s", [time.time_ns() // 1000]


DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": _PostgreSQL,
    "mysql": _MySQL,
    "sqlite": _SQLite,
}


def _mariadb_client() -> bool:
    """Whether mysqlclient is built on MariaDB Connector/C (client version 3.x), whose
    read_timeout is not tried three times as libmysqlclient's (5.x, 8.x, 9.x) is."""
    try:
        from MySQLdb import _mysql
    except ImportError:  # pragma: no cover - another MySQL driver
        return False
    try:
        return int(_mysql.get_client_info().split(".")[0]) < 5
    except (AttributeError, ValueError):  # pragma: no cover
        return False


def aware(value: Any) -> datetime | None:
    """A datetime the database returned, made aware (UTC): MySQL and SQLite columns hold
    naive UTC, SQLite may give a string."""
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_datetime(value)
        if value is None:
            return None
    if value.tzinfo is None:  # MySQL and SQLite columns hold naive UTC
        value = value.replace(tzinfo=dt_timezone.utc)
    return value


class StoreNow(Now):
    """The database server's clock as the database backend reads it, as a Django query
    expression (``DatabaseBackend.now_expression()``).

    MySQL's ``CURRENT_TIMESTAMP`` follows the session time zone, while lease columns hold
    naive UTC: use ``UTC_TIMESTAMP(6)`` there.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)
