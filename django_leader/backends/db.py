"""Leases in a Django database: SQLite, PostgreSQL, MySQL/MariaDB.

Each operation is decided by ONE conditional ``UPDATE`` (a missing row is created by an
``INSERT`` that does nothing on conflict); the number of rows it touched is the answer. The
expiry test and the new expiry use the database server's clock (``statement_timestamp()``,
``UTC_TIMESTAMP(6)``, SQLite's ``'now'``), never this process's.

Lease operations run on a connection of their own (one per thread), so they commit at once
even when called inside the caller's ``transaction.atomic()``, and every call is bounded by a
connect/statement timeout shorter than the renew deadline. After an error the connection is
dropped and the next call reconnects: that is how the backend rides out a database restart.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.utils import Error as DjangoDBError
from django.db.utils import InterfaceError, OperationalError, load_backend
from django.utils.dateparse import parse_datetime

from ..conf import get_settings, lock_delay
from ..exceptions import BackendUnavailable, LeadershipLost
from ..lease import EventKind, Lease, clock
from .base import Backend

logger = logging.getLogger("django_leader")

#: Seconds a private connection may sit idle before it is checked (is_usable()) on reuse.
IDLE_CHECK = 10.0

#: The least time, in seconds, a fenced transaction is given by the server before it is
#: aborted, however little of the lease is left (see :meth:`DatabaseBackend.fenced`).
FENCE_FLOOR = 1.0

#: Every DatabaseBackend, so that a forked child can drop what it inherited.
_instances: weakref.WeakSet[DatabaseBackend] = weakref.WeakSet()
#: Every open private connection wrapper, of every thread (weakly: one whose thread ended
#: goes as it always did).
_wrappers: weakref.WeakSet[Any] = weakref.WeakSet()
#: Strong references taken just before a fork (see _before_fork).
_pinned: list[Any] = []


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
    for backend in list(_instances):
        _inherited.append(backend._local)
        backend._local = threading.local()


_inherited: list[Any] = []
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )

_COLUMNS = (
    "name",
    "holder",
    "previous_holder",
    "token",
    "transitions",
    "acquired_at",
    "renewed_at",
    "expires_at",
)


class _Dialect:
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


class _PostgreSQL(_Dialect):
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


class _MySQL(_Dialect):
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


class _SQLite(_Dialect):
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


_DIALECTS: dict[str, type[_Dialect]] = {
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


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_datetime(value)
        if value is None:
            return None
    if value.tzinfo is None:  # MySQL and SQLite columns hold naive UTC
        value = value.replace(tzinfo=dt_timezone.utc)
    return value


class DatabaseBackend(Backend):
    """Leases in the ``Lease`` table of ``DJANGO_LEADER["DATABASE"]`` (default ``"default"``)."""

    def __init__(self, database: str | None = None, *, timeout: float | None = None) -> None:
        conf = get_settings()
        self.alias = database or conf.database
        if self.alias not in connections.settings:
            raise DatabaseError(f"unknown database alias {self.alias!r}")
        self.history = conf.history
        self.history_database = self.alias if conf.history else None
        self.timeout = timeout or conf.timing.call_timeout
        vendor = connections[self.alias].vendor
        if vendor not in _DIALECTS:
            raise NotImplementedError(f"django_leader has no SQL for database vendor {vendor!r}")
        self.vendor = vendor
        self.dialect = _DIALECTS[vendor]()
        self._local = threading.local()
        _instances.add(self)
        from ..models import Lease as LeaseRow
        from ..models import LeaseCandidate, LeaseEvent

        ops = connections[self.alias].ops
        self._table = ops.quote_name(LeaseRow._meta.db_table)
        self._events = ops.quote_name(LeaseEvent._meta.db_table)
        self._candidates = ops.quote_name(LeaseCandidate._meta.db_table)
        self._select = ", ".join(_COLUMNS)

    def __repr__(self) -> str:
        return f"<DatabaseBackend {self.alias!r} ({self.vendor})>"

    # -- connection -----------------------------------------------------------------------
    def _connection(self) -> Any:
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
            settings_dict["OPTIONS"] = self.dialect.timeout_options(options, self.timeout)
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

    def close(self) -> None:
        wrapper = getattr(self._local, "wrapper", None)
        if wrapper is not None:
            self._local.wrapper = None
            with suppress(DjangoDBError):
                wrapper.close()

    @contextmanager
    def _cursor(self, atomic: bool) -> Iterator[Any]:
        """A cursor on the private connection; errors become BackendUnavailable."""
        wrapper = self._connection()
        try:
            if atomic:
                wrapper.ensure_connection()
                wrapper.set_autocommit(False)
            try:
                with wrapper.cursor() as cursor:
                    yield cursor
                if atomic:
                    wrapper.commit()
            except BaseException:
                if atomic:
                    with suppress(DjangoDBError):
                        wrapper.rollback()
                raise
            finally:
                if atomic and wrapper.connection is not None:
                    wrapper.set_autocommit(True)
        except DjangoDBError as exc:
            self.close()  # reconnect on the next call
            message = str(exc).strip() or type(exc).__name__
            if self.vendor == "sqlite" and connections[self.alias].in_atomic_block:
                message += (
                    " (SQLite allows one writer: this thread's own transaction.atomic() on "
                    "the same database holds the lock a lease operation needs; take the "
                    "lease outside the transaction, or use PostgreSQL/MySQL)"
                )
            if (
                "no such table" in message
                or "doesn't exist" in message
                or ("does not exist" in message and "relation" in message)
            ):
                message += " (did you run `manage.py migrate django_leader`?)"
            raise BackendUnavailable(f"database {self.alias!r}: {message}") from exc

    # -- operations -----------------------------------------------------------------------
    def _row(self, row: Sequence[Any] | None) -> Lease | None:
        if row is None:
            return None
        name, holder, previous, token, transitions, acquired, renewed, expires = row[:8]
        return Lease(
            name=name,
            holder=holder,
            token=int(token),
            transitions=int(transitions),
            acquired_at=_aware(acquired),
            renewed_at=_aware(renewed),
            expires_at=_aware(expires),
            previous_holder=previous or "",
        )

    def _update(self, cursor: Any, sql: str, params: list[Any], name: str) -> Lease | None:
        """Run a conditional UPDATE of the row ``name``; return the row it changed, or None."""
        if self.dialect.returning:
            cursor.execute(f"{sql} RETURNING {self._select}", params)
            rows = cursor.fetchall()  # drain: SQLite completes the statement only then
            return self._row(rows[0] if rows else None)
        cursor.execute(sql, params)
        if cursor.rowcount != 1:
            return None
        cursor.execute(f"SELECT {self._select} FROM {self._table} WHERE name = %s", [name])
        return self._row(cursor.fetchone())

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        d = self.dialect
        now, expiry, ttl_param = d.now(), d.expiry(), d.ttl_param(ttl)
        # previous_holder is assigned first: MySQL evaluates SET left to right.
        update = (
            f"UPDATE {self._table} SET previous_holder = holder, holder = %s, "
            f"token = token + 1, transitions = transitions + 1, acquired_at = {now}, "
            f"renewed_at = {now}, expires_at = {expiry} "
            # Expiry alone decides: release() ends the term now, force_release() does not
            # (the holder may not know yet), so nobody is let in while it might still act.
            f"WHERE name = %s AND expires_at <= {now}"
        )
        with self._cursor(atomic=True) as cursor:
            lease = self._update(cursor, update, [holder, ttl_param, name], name)
            if lease is None:
                # No row: a new name, or a row deleted by hand (SPEC rule 7).
                top, released = 0, False
                if self.history:
                    cursor.execute(
                        f"SELECT token, kind FROM {self._events} WHERE name = %s "
                        "ORDER BY token DESC, id DESC LIMIT 1",
                        [name],
                    )
                    last = cursor.fetchone()
                    if last is not None:
                        # A term that ended in release() leaves nobody believing it leads.
                        top, released = int(last[0]), last[1] == EventKind.RELEASED
                if top > 0 and not released:
                    # The history knows the name: its row was deleted, and its last holder
                    # may still believe it leads. Re-create the row held by nobody until
                    # the lock-delay is over; the token continues from the history.
                    delay = lock_delay(ttl)
                    insert = d.insert_ignore(
                        self._table,
                        ", ".join(_COLUMNS),
                        f"%s, '', '', %s, 0, {now}, {now}, {expiry}",
                    )
                    cursor.execute(insert, [name, top, d.ttl_param(delay)])
                    if cursor.rowcount == 1:
                        logger.warning(
                            "lease %r: its row was missing (deleted by hand?) although its "
                            "history goes up to token %d; re-created held by nobody, no one "
                            "may take it for the lock-delay of %.1fs (DJANGO_LEADER"
                            "['LOCK_DELAY']), until any holder that still believes it leads "
                            "has passed its deadline",
                            name,
                            top,
                            delay,
                            extra={"lease": name, "token": top},
                        )
                        return None, None
                else:
                    # A new name: token 1; a deleted row whose last term was released:
                    # the next token after the history's; with HISTORY=False (nothing to
                    # continue from, should the row ever be deleted) the server clock in
                    # microseconds, which is past every token issued before.
                    if self.history:
                        seed, seed_params = "%s", [top + 1]
                    else:
                        seed, seed_params = d.clock_seed()
                    insert = d.insert_ignore(
                        self._table,
                        ", ".join(_COLUMNS),
                        f"%s, %s, '', {seed}, 1, {now}, {now}, {expiry}",
                    )
                    cursor.execute(insert, [name, holder, *seed_params, ttl_param])
                    if cursor.rowcount == 1:
                        cursor.execute(
                            f"SELECT {self._select} FROM {self._table} WHERE name = %s", [name]
                        )
                        lease = self._row(cursor.fetchone())
            if lease is None:
                cursor.execute(
                    f"SELECT {self._select} FROM {self._table} "
                    f"WHERE name = %s AND holder <> '' AND expires_at > {now}",
                    [name],
                )
                return None, self._row(cursor.fetchone())
            if self.history:
                taken_over = bool(lease.previous_holder)
                self._insert_event(
                    cursor,
                    "taken_over" if taken_over else "acquired",
                    lease,
                    detail=f"lease of {lease.previous_holder} had expired" if taken_over else "",
                )
        return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        d = self.dialect
        sql = (
            f"UPDATE {self._table} SET renewed_at = {d.now()}, expires_at = {d.expiry()} "
            f"WHERE name = %s AND holder = %s AND token = %s AND expires_at > {d.now()}"
        )
        params = [d.ttl_param(ttl), lease.name, lease.holder, lease.token]
        with self._cursor(atomic=not d.returning) as cursor:
            return self._update(cursor, sql, params, lease.name)

    def release(self, lease: Lease) -> bool:
        sql = (
            f"UPDATE {self._table} SET previous_holder = holder, holder = '', "
            f"expires_at = {self.dialect.now()} WHERE name = %s AND holder = %s AND token = %s"
        )
        with self._cursor(atomic=True) as cursor:
            cursor.execute(sql, [lease.name, lease.holder, lease.token])
            released = cursor.rowcount == 1
            if released and self.history:
                self._insert_event(cursor, EventKind.RELEASED, lease)
        return released

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        # The term is not cut short: the holder hears of this at its next renewal, and until
        # the term ends nobody else may take the lease (it might still act on it).
        sql = (
            f"UPDATE {self._table} SET previous_holder = holder, holder = '' "
            "WHERE name = %s AND holder <> ''"
        )
        with self._cursor(atomic=True) as cursor:
            row = self._update(cursor, sql, [name], name)
            if row is None:
                return None
            released = Lease(
                name=row.name,
                holder=row.previous_holder,
                token=row.token,
                acquired_at=row.acquired_at,
                renewed_at=row.renewed_at,
                expires_at=row.expires_at,
                transitions=row.transitions,
            )
            if self.history:
                self._insert_event(cursor, "forced_release", released, detail=detail, actor=actor)
        return released

    def read(self, name: str) -> Lease | None:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                f"SELECT {self._select}, {self.dialect.now()} FROM {self._table} "
                f"WHERE name = %s AND holder <> '' AND expires_at > {self.dialect.now()}",
                [name],
            )
            row = cursor.fetchone()
        lease = self._row(row)
        if lease is not None:
            lease.read_at = _aware(row[len(_COLUMNS)])
        return lease

    def names(self) -> list[str]:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(f"SELECT name FROM {self._table} ORDER BY name")
            return [row[0] for row in cursor.fetchall()]

    # -- candidates -----------------------------------------------------------------------
    def announce(self, name: str, identity: str, ttl: float) -> None:
        d = self.dialect
        now, table = d.now(), self._candidates
        upsert = d.upsert(
            table,
            "name, identity, seen_at, expires_at",
            f"%s, %s, {now}, {d.expiry()}",
            "name, identity",
            ["seen_at", "expires_at"],
        )
        with self._cursor(atomic=False) as cursor:
            cursor.execute(upsert, [name, identity, d.ttl_param(ttl)])
            # Candidates that stopped without a word (crashed): gone once expired.
            cursor.execute(f"DELETE FROM {table} WHERE name = %s AND expires_at <= {now}", [name])

    def withdraw(self, name: str, identity: str) -> None:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                f"DELETE FROM {self._candidates} WHERE name = %s AND identity = %s",
                [name, identity],
            )

    def candidates(self, name: str) -> list[str] | None:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                f"SELECT identity FROM {self._candidates} "
                f"WHERE name = %s AND expires_at > {self.dialect.now()} ORDER BY identity",
                [name],
            )
            return sorted(row[0] for row in cursor.fetchall())

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        if not self.history:
            return
        try:
            self.write_event(kind, lease, detail=detail)
        except BackendUnavailable as exc:
            logger.warning(
                "could not record %s event for %r: %s",
                kind,
                lease.name,
                exc,
                extra={"lease": lease.name, "holder": lease.holder, "token": lease.token},
            )

    def write_event(
        self,
        kind: str,
        lease: Lease,
        *,
        detail: str = "",
        actor: str = "",
        at: datetime | None = None,
    ) -> None:
        """Insert one history row, stamped ``at`` (default: the database server's now)."""
        with self._cursor(atomic=False) as cursor:
            self._insert_event(cursor, kind, lease, detail=detail, actor=actor, at=at)

    def _insert_event(
        self,
        cursor: Any,
        kind: str,
        lease: Lease,
        *,
        detail: str = "",
        actor: str = "",
        at: datetime | None = None,
    ) -> None:
        # Only an acquisition names the holder before it (the one whose lease expired).
        previous = lease.previous_holder if kind in ("acquired", "taken_over") else ""
        params = [lease.name, kind, lease.holder, lease.token, previous, detail[:1000], actor[:255]]
        if at is None:
            stamp = self.dialect.now()
        else:
            stamp = "%s"
            params.insert(5, self._connection().ops.adapt_datetimefield_value(at))
        cursor.execute(
            f"INSERT INTO {self._events} "
            "(name, kind, holder, token, previous_holder, at, detail, actor) "
            f"VALUES (%s, %s, %s, %s, %s, {stamp}, %s, %s)",
            params,
        )

    # -- fencing --------------------------------------------------------------------------
    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        """One transaction on the lease's database (the caller's own connection).

        It first locks the lease row and checks that ``lease.holder`` still holds it with
        ``lease.token``, unexpired by the server's clock; else ``LeadershipLost``. While the
        transaction is open, nobody can take the lease over (their ``UPDATE`` waits on the
        row lock), so the writes inside commit only under this token.

        The transaction is bounded by the lease (SPEC rule 6): no statement of it starts
        after the local deadline, nor does it commit then (``LeadershipLost``, rolled back),
        and the server is told to end it should it still run or sit idle once the lease is
        over (the lease's time left, at least ``FENCE_FLOOR`` (1 s), set again at most
        ``FENCE_FLOOR`` apart): a holder frozen or cut off inside keeps the row locked no
        longer than that. SQLite cannot do this last part (see docs/database-backend.md).

        Outside an outer ``atomic()`` block, a connection that failed before is checked and
        replaced if the server dropped it, and one that fails inside is closed, so that the
        next call reconnects.
        """
        lease.check()
        connection = connections[self.alias]
        outermost = not connection.in_atomic_block
        if outermost:
            _recycle(connection)
        fence = _Fence(self.dialect, connection, lease)
        now = self.dialect.now()
        where = f"name = %s AND holder = %s AND token = %s AND expires_at > {now}"
        params = [lease.name, lease.holder, lease.token]
        try:
            with transaction.atomic(using=self.alias), connection.execute_wrapper(fence):
                with connection.cursor() as cursor:
                    if self.vendor == "sqlite":
                        # SQLite has no row locks: a write takes the database's RESERVED lock,
                        # which keeps every other writer out until this transaction ends.
                        cursor.execute(
                            f"UPDATE {self._table} SET token = token WHERE {where}", params
                        )
                        held = cursor.rowcount == 1
                    else:
                        cursor.execute(
                            f"SELECT 1 FROM {self._table} WHERE {where} FOR UPDATE", params
                        )
                        held = cursor.fetchone() is not None
                if not held:
                    raise LeadershipLost(
                        f"lease {lease.name!r} is no longer held by {lease.holder} with token "
                        f"{lease.token}"
                    )
                yield
                fence.check("commit")
        except (OperationalError, InterfaceError):
            # The connection may be dead (the server restarted, killed it, or ended this
            # transaction): a new one for the next call.
            if outermost:
                with suppress(DjangoDBError):
                    connection.close()
            raise
        finally:
            if fence.saved and connection.connection is not None:
                with suppress(DjangoDBError), connection.cursor() as cursor:
                    self.dialect.unbound_transaction(cursor, fence.saved)


def _recycle(connection: Any) -> None:
    """Close Django's ``connection`` if it failed before and the server no longer answers
    on it (as ``close_if_unusable_or_obsolete()`` does between requests, without closing a
    healthy connection for its age): the next statement then reconnects."""
    if connection.connection is None or not connection.errors_occurred:
        return
    if connection.is_usable():
        connection.errors_occurred = False
    else:
        with suppress(DjangoDBError):
            connection.close()


class _Fence:
    """The execute wrapper of a fenced transaction: before each statement, refuse it once
    the local deadline has passed, and (re)set the server's bounds on the transaction."""

    def __init__(self, dialect: _Dialect, connection: Any, lease: Lease) -> None:
        self.dialect = dialect
        self.connection = connection
        self.lease = lease
        self.armed_at: float | None = None
        #: What the dialect must restore once the transaction is over (MySQL: variables).
        self.saved: dict[str, Any] = {}

    def check(self, what: str) -> None:
        if not self.lease.held:
            raise LeadershipLost(
                f"lease {self.lease.name!r} (token {self.lease.token}): local deadline passed "
                f"inside fenced(), refusing to {what}; the transaction is rolled back"
            )

    def arm(self, raw_cursor: Any) -> None:
        self.armed_at = clock()
        seconds = max(FENCE_FLOOR, self.lease.time_left())
        with self.connection.wrap_database_errors:
            self.dialect.bound_transaction(raw_cursor, self.connection, seconds, self.saved)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.check("run a statement")
        if self.armed_at is None or clock() - self.armed_at >= FENCE_FLOOR:
            self.arm(context["cursor"].cursor)
        result = execute(sql, params, many, context)
        if clock() - self.armed_at >= FENCE_FLOOR:  # type: ignore[operator]
            self.arm(context["cursor"].cursor)  # a long statement: bound the idle after it
        return result
