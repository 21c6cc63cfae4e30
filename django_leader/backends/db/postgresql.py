"""PostgreSQL's SQL for the database backend (psycopg 3 or psycopg2)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

from ...exceptions import BackendUnavailable
from .dialect import Dialect, Key

#: Seconds past the server's statement_timeout after which a call is cancelled from the
#: client (only a commit waiting for a synchronous standby runs that long).
CANCEL_AFTER = 0.25
#: What PostgreSQL says when a commit's wait for a synchronous standby is cancelled.
SYNC_CANCELLED = "canceling wait for synchronous replication"


def _sync_cancels(raw: Any) -> list[str]:
    """The sync-wait cancellations heard on ``raw`` (a psycopg 3 or psycopg2 connection),
    listened for from the first call on."""
    heard: list[str] | None = getattr(raw, "_django_leader_sync_cancels", None)
    if heard is None:
        heard = []
        if hasattr(raw, "add_notice_handler"):  # psycopg 3

            def listen(diagnostic: Any) -> None:
                message = str(diagnostic.message_primary or "")
                if SYNC_CANCELLED in message:
                    heard.append(message)

            raw.add_notice_handler(listen)
        raw._django_leader_sync_cancels = heard
    return heard


def _collect(raw: Any, heard: list[str]) -> None:
    """psycopg2 keeps notices in ``raw.notices``: move the sync-wait ones to ``heard``."""
    notices = getattr(raw, "notices", None)
    if isinstance(notices, list):
        heard.extend(str(n).strip() for n in notices if SYNC_CANCELLED in str(n))
        notices.clear()


class _Canceller:
    """One thread for every connection of the process: at each armed deadline not disarmed
    in time, it asks the server to cancel what that connection runs."""

    def __init__(self) -> None:
        self._armed: dict[int, tuple[float, Any]] = {}
        self._next = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, raw: Any, seconds: float) -> int:
        with self._wake:
            self._next += 1
            self._armed[self._next] = (time.monotonic() + seconds, raw)
            self._wake.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="leader-pg-cancel", daemon=True
                )
                self._thread.start()
            return self._next

    def disarm(self, armed: int) -> None:
        with self._wake:
            self._armed.pop(armed, None)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [k for k, (at, _) in self._armed.items() if at <= now]
                late = [self._armed.pop(k)[1] for k in due]
                soonest = min((at for at, _ in self._armed.values()), default=now + 1.0)
                if not late:
                    self._wake.wait(max(0.01, min(1.0, soonest - now)))
            for raw in late:
                with suppress(Exception):
                    cancel = getattr(raw, "cancel_safe", None) or raw.cancel
                    cancel()


_CANCELLER = _Canceller()


class PostgreSQLDialect(Dialect):
    """``statement_timestamp()``, ``ON CONFLICT``, data-modifying ``WITH``, ``NOTIFY``."""

    writes_in_one_statement = True
    notify = "pg_notify(%s, '')"
    # The cluster's system identifier and the WAL timeline: a promoted standby, a failback
    # and a point-in-time restore each start a new timeline. Readable by any role.
    server_identity = (
        "((SELECT system_identifier FROM pg_control_system())::text || ':' || "
        "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
    )
    replication = (
        "SELECT (SELECT count(*) FROM pg_stat_replication), "
        "current_setting('synchronous_standby_names') <> '' AND "
        "current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply')"
    )

    # statement_timestamp(), not now(): inside a caller's transaction (fenced()) now() is
    # the time that transaction began.
    def now(self) -> str:
        return "statement_timestamp()"

    def expiry(self) -> str:
        return "statement_timestamp() + %s * interval '1 microsecond'"

    def ttl_param(self, ttl: float) -> Any:
        return round(ttl * 1_000_000)

    def time_param(self, connection: Any, value: datetime) -> Any:
        return value  # aware: a naive one would be read in the session's time zone

    def read_time(self, column: str) -> str:
        # Django's loader of timestamptz is pure Python (a third of the client's time in a
        # 10,000-lease batch renewal), and with USE_TZ = False gives naive times in the
        # session's time zone (TIME_ZONE); an integer is read in C, and is an instant.
        # extract() gives a numeric: exact to the microsecond.
        return f"(extract(epoch from {column}) * 1000000)::bigint"

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING"

    def timeout_options(
        self, options: dict[str, Any], timeout: float, *, startup: bool = True
    ) -> dict[str, Any]:
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
        if startup:
            extra = (
                f"-c statement_timeout={ms} -c lock_timeout={ms} "
                f"-c idle_in_transaction_session_timeout={max(ms * 4, 1000)}"
            )
            options["options"] = f"{options.get('options', '')} {extra}".strip()
        return options

    def startup_refused(self, exc: Exception) -> bool:
        return "unsupported startup parameter" in str(exc)  # PgBouncer's refusal

    def session_bounded(self, wrapper: Any, seconds: float) -> bool:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'")
            (setting,) = cursor.fetchone()
        return int(setting) == max(100, round(seconds * 1000))

    @contextmanager
    def bounded_call(self, wrapper: Any, seconds: float) -> Iterator[None]:
        # statement_timeout stops at the commit: a commit waiting for a synchronous standby
        # that is gone waits for ever. Cancelled from here, it returns "committed locally",
        # with a warning: such a write does not count (it may not survive a failover).
        raw = wrapper.connection
        unconfirmed = self.watch_commit(raw)
        armed = _CANCELLER.arm(raw, seconds + CANCEL_AFTER)
        try:
            yield
        finally:
            _CANCELLER.disarm(armed)
        said = unconfirmed()
        if said is not None:
            raise BackendUnavailable(
                "the synchronous standby did not confirm a lease write within "
                f"{seconds + CANCEL_AFTER:g}s ({said}): it does not count (a failover "
                "could lose it)"
            )

    def cancel_later(self, raw: Any, seconds: float) -> Callable[[], None]:
        armed = _CANCELLER.arm(raw, seconds)
        return lambda: _CANCELLER.disarm(armed)

    def watch_commit(self, raw: Any) -> Callable[[], str | None]:
        heard = _sync_cancels(raw)
        before = len(heard)

        def unconfirmed() -> str | None:
            _collect(raw, heard)
            return heard[-1] if len(heard) > before else None

        return unconfirmed

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

    def batch_size(self, connection: Any) -> int | None:
        return None  # arrays: any number in one statement

    def among(self, values: Sequence[str]) -> tuple[str, list[Any]]:
        return "= ANY(%s::text[])", [list(values)]

    def renew_rows(
        self, cursor: Any, table: str, select: str, keys: list[Key], ttl: float
    ) -> list[Sequence[Any]]:
        # Locked first (FOR NO KEY UPDATE, as an UPDATE locks), then updated: the lock
        # re-checks the condition on the row's newest version, so the UPDATE that
        # follows in the same statement changes only rows that meet it.
        lock = "FOR NO KEY UPDATE OF l SKIP LOCKED"
        sql = (
            "WITH b (b_name, b_holder, b_token) AS (SELECT * FROM "
            "unnest(%s::text[], %s::text[], %s::bigint[])), "
            "mine AS MATERIALIZED (SELECT l.name AS m_name, l.holder AS m_holder, "
            f"l.token AS m_token FROM {table} l JOIN b "
            "ON l.name = b.b_name AND l.holder = b.b_holder AND l.token = b.b_token "
            f"WHERE l.expires_at > {self.now()} {lock}) "
            f"UPDATE {table} SET renewed_at = {self.now()}, expires_at = {self.expiry()} "
            "FROM mine WHERE name = m_name AND holder = m_holder AND token = m_token "
            f"AND expires_at > {self.now()} RETURNING {select}"
        )
        names = [key[0] for key in keys]
        holders = [key[1] for key in keys]
        tokens = [key[2] for key in keys]
        cursor.execute(sql, [names, holders, tokens, self.ttl_param(ttl)])
        rows: list[Sequence[Any]] = cursor.fetchall()
        return rows
