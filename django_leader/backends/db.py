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

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DatabaseError, connections
from django.db.utils import Error as DjangoDBError

from ..conf import get_settings, lock_delay
from ..exceptions import BackendUnavailable
from ..lease import EventKind, Lease
from .base import Backend, Watch
from .db_connection import PrivateConnection, migration_state
from .db_fence import FENCE_FLOOR, fenced_transaction
from .partial import answers
from .sql import DIALECTS, StoreNow, aware
from .wakeups import WakeHub, channel

if TYPE_CHECKING:
    from ..election import Candidate
    from .db_slots import DatabaseSlots

__all__ = ["FENCE_FLOOR", "DatabaseBackend", "migration_state"]

logger = logging.getLogger("django_leader")

#: Leases renewed by one statement of :meth:`DatabaseBackend.renew_many` on MySQL/MariaDB
#: and SQLite (PostgreSQL renews any number in one).
BATCH = 1000

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


class DatabaseBackend(Backend):
    """Leases in the ``Lease`` table of ``DJANGO_LEADER["DATABASE"]`` (default ``"default"``)."""

    def __init__(self, database: str | None = None, *, timeout: float | None = None) -> None:
        conf = get_settings()
        self.alias = database or conf.database
        if self.alias not in connections.settings:
            raise DatabaseError(f"unknown database alias {self.alias!r}")
        self.history = conf.history
        self.history_database = self.alias if conf.history else None
        #: The lease rows are this store: the ``Lease`` table of this alias.
        self.rows_database: str | None = self.alias
        self.timeout = timeout or conf.timing.call_timeout
        vendor = connections[self.alias].vendor
        if vendor not in DIALECTS:
            raise NotImplementedError(f"django_leader has no SQL for database vendor {vendor!r}")
        self.vendor = vendor
        self.dialect = DIALECTS[vendor]()
        self._private = PrivateConnection(self.alias, self.dialect, self.timeout)
        from ..models import Lease as LeaseRow
        from ..models import LeaseCandidate, LeaseEvent

        ops = connections[self.alias].ops
        self._table = ops.quote_name(LeaseRow._meta.db_table)
        self._events = ops.quote_name(LeaseEvent._meta.db_table)
        self._candidates = ops.quote_name(LeaseCandidate._meta.db_table)
        # The columns of a Lease, then who a standing hand-over request names.
        now = self.dialect.now()
        self._select = ", ".join(_COLUMNS) + (
            f", CASE WHEN handover_until > {now} THEN handover_to ELSE '' END"
        )
        self._hub: WakeHub | None = None
        self._hub_lock = threading.Lock()  # one hub, however many threads watch at once

    def __repr__(self) -> str:
        return f"<DatabaseBackend {self.alias!r} ({self.vendor})>"

    # -- what the admin, beat and checks need ---------------------------------------------
    #: Beat slot records are ``BeatSlot`` rows written inside :meth:`fenced`.
    shared_slots: ClassVar[bool] = True

    def now(self) -> datetime:
        """The database server's clock (the one every lease time here is in)."""
        with self._cursor(atomic=False) as cursor:
            cursor.execute(f"SELECT {self.dialect.now()}", [])  # (params: "%%" is "%")
            value = aware(cursor.fetchone()[0])
        if value is None:
            raise BackendUnavailable(f"database {self.alias!r}: no time from the server")
        return value.astimezone(dt_timezone.utc)

    def now_expression(self) -> Any:
        """:class:`~django_leader.backends.sql.StoreNow`: the server's clock in a query."""
        return StoreNow()

    def slots(self) -> DatabaseSlots:
        """``BeatSlot`` rows on this database, on the beat thread's Django connection."""
        from .db_slots import DatabaseSlots

        return DatabaseSlots(self)

    def describe(self) -> str:
        return (
            f"{type(self).__name__} {self.alias!r}: state and time left by the "
            "database server's clock."
        )

    # -- connection -----------------------------------------------------------------------
    def _connection(self) -> Any:
        """This thread's private connection wrapper (see :class:`PrivateConnection`)."""
        return self._private.get()

    def close(self) -> None:
        self._private.close()

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
            handover_to=(row[8] or "") if len(row) > 8 else "",
            name=name,
            holder=holder,
            token=int(token),
            transitions=int(transitions),
            acquired_at=aware(acquired),
            renewed_at=aware(renewed),
            expires_at=aware(expires),
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
            f"renewed_at = {now}, expires_at = {expiry}, handover_to = '', "
            "handover_until = NULL "
            # Expiry alone decides: release() ends the term now, force_release() does not
            # (the holder may not know yet), so nobody is let in while it might still act.
            # A standing hand-over request lets in only the candidate it names.
            f"WHERE name = %s AND expires_at <= {now} AND (handover_until IS NULL OR "
            f"handover_until <= {now} OR handover_to = %s)"
        )
        params = [holder, ttl_param, name, holder]
        # PostgreSQL: the acquisition and its history event in one statement, committed on
        # its own (no BEGIN, no COMMIT); the others in one transaction.
        single = self.vendor == "postgresql"
        with self._cursor(atomic=not single) as cursor:
            if single:
                lease = self._acquire_with_event(cursor, update, params, name)
            else:
                lease = self._update(cursor, update, params, name)
                if lease is not None and self.history:
                    kind, detail = _acquired_event(lease)
                    self._insert_event(cursor, kind, lease, detail=detail)
            if lease is not None:
                return lease, lease
            refused = self._refused(cursor, name)
            if refused is not None or not single:
                return refused or self._create(cursor, name, holder, ttl)
        # No row, on PostgreSQL: created in a transaction (with its history event).
        with self._cursor(atomic=True) as cursor:
            return self._create(cursor, name, holder, ttl)

    def _acquire_with_event(
        self, cursor: Any, update: str, params: list[Any], name: str
    ) -> Lease | None:
        """PostgreSQL: ``update`` (an acquisition of ``name``) and, if it took the lease,
        its history event, in one statement (a data-modifying ``WITH``)."""
        if not self.history:
            return self._update(cursor, update, params, name)
        cursor.execute(
            f"WITH acquired AS ({update} RETURNING {self._select}), "
            f"event AS (INSERT INTO {self._events} "
            "(name, kind, holder, token, previous_holder, at, detail, actor) "
            "SELECT name, CASE WHEN previous_holder <> '' THEN %s ELSE %s END, holder, token, "
            f"previous_holder, {self.dialect.now()}, CASE WHEN previous_holder <> '' THEN "
            "left('lease of ' || previous_holder || ' had expired', 1000) ELSE '' END, '' "
            "FROM acquired) SELECT * FROM acquired",
            [*params, str(EventKind.TAKEN_OVER), str(EventKind.ACQUIRED)],
        )
        return self._row(cursor.fetchone())

    def _refused(self, cursor: Any, name: str) -> tuple[None, Lease | None] | None:
        """An acquisition of ``name`` refused: ``(None, current holder)``, or None if the
        name has no row."""
        now = self.dialect.now()
        # Held (the common case, one more statement), gated, or no row.
        cursor.execute(
            f"SELECT {self._select}, {now}, CASE WHEN holder <> '' AND "
            f"expires_at > {now} THEN 1 ELSE 0 END FROM {self._table} WHERE name = %s",
            [name],
        )
        row = cursor.fetchone()
        if row is not None:
            if not row[-1]:
                return None, None  # free yet refused: a term or a hand-over gate
            current = self._row(row[:-2])
            assert current is not None
            current.read_at = aware(row[-2])
            return None, current
        return None

    def _create(
        self, cursor: Any, name: str, holder: str, ttl: float
    ) -> tuple[Lease | None, Lease | None]:
        """Acquire ``name``, which has no row: a new name, or a row deleted by hand."""
        d = self.dialect
        now, expiry, ttl_param = d.now(), d.expiry(), d.ttl_param(ttl)
        lease: Lease | None = None
        # (See "When the store forgets" in docs/safety.md.)
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
                ", ".join(_COLUMNS) + ", handover_to",
                f"%s, '', '', %s, 0, {now}, {now}, {expiry}, ''",
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
                ", ".join(_COLUMNS) + ", handover_to",
                f"%s, %s, '', {seed}, 1, {now}, {now}, {expiry}, ''",
            )
            cursor.execute(insert, [name, holder, *seed_params, ttl_param])
            if cursor.rowcount == 1:
                cursor.execute(f"SELECT {self._select} FROM {self._table} WHERE name = %s", [name])
                lease = self._row(cursor.fetchone())
        if lease is None:
            return None, self._current(cursor, name)
        if self.history:
            kind, detail = _acquired_event(lease)
            self._insert_event(cursor, kind, lease, detail=detail)
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

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases`` in one statement (PostgreSQL, any count) or one
        per ``BATCH`` (1,000) leases (MySQL/MariaDB: one transaction of a locking
        ``SELECT`` and an ``UPDATE``; SQLite: ``UPDATE ... RETURNING``, fewer under its
        parameter limit), under the same conditions as :meth:`renew`, decided by the
        server's clock.

        A row locked by a transaction (its holder's :meth:`fenced`) is passed over (``SKIP
        LOCKED``), never waited for: the others are renewed and answered at once, and
        ``RenewedInPart`` names the leases to try again (no deadlock with ``fenced()``).
        SQLite locks the whole file: a renewal waits for a writing transaction."""
        if not leases:
            return []
        keys = list(dict.fromkeys((lease.name, lease.holder, lease.token) for lease in leases))
        found: dict[tuple[str, str, int], Sequence[Any]] = {}
        size = BATCH
        if self.vendor == "sqlite":  # four parameters a lease, one for the ttl
            limit = connections[self.alias].features.max_query_params
            size = max(1, min(BATCH, (limit - 1) // 4))
        # SQLite: several statements in one transaction (one write of the file).
        with self._cursor(atomic=self.vendor == "sqlite" and len(keys) > size) as cursor:
            chunks = [keys] if self.vendor == "postgresql" else _chunks(keys, size)
            locked = {
                key for chunk in chunks for key in self._renew_chunk(cursor, chunk, ttl, found)
            }
        results = [self._row(found.get((le.name, le.holder, le.token))) for le in leases]
        return answers(f"database {self.alias!r}", leases, results, locked)

    def _renew_chunk(
        self,
        cursor: Any,
        keys: list[tuple[str, str, int]],
        ttl: float,
        found: dict[tuple[str, str, int], Sequence[Any]],
    ) -> list[tuple[str, str, int]]:
        """Renew the leases ``keys`` (name, holder, token) in one statement (one
        transaction on MySQL/MariaDB), adding each renewed row to ``found``. Returns the
        keys passed over because their row was locked."""
        if not keys:
            return []
        d = self.dialect
        names = [key[0] for key in keys]
        if self.vendor == "postgresql":
            # Locked first (FOR NO KEY UPDATE, as an UPDATE locks), then updated: the lock
            # re-checks the condition on the row's newest version, so the UPDATE that
            # follows in the same statement changes only rows that meet it.
            lock = "FOR NO KEY UPDATE OF l SKIP LOCKED"
            sql = (
                "WITH b (b_name, b_holder, b_token) AS (SELECT * FROM "
                "unnest(%s::text[], %s::text[], %s::bigint[])), "
                "mine AS MATERIALIZED (SELECT l.name AS m_name, l.holder AS m_holder, "
                f"l.token AS m_token FROM {self._table} l JOIN b "
                "ON l.name = b.b_name AND l.holder = b.b_holder AND l.token = b.b_token "
                f"WHERE l.expires_at > {d.now()} {lock}) "
                f"UPDATE {self._table} SET renewed_at = {d.now()}, expires_at = {d.expiry()} "
                "FROM mine WHERE name = m_name AND holder = m_holder AND token = m_token "
                f"AND expires_at > {d.now()} RETURNING {self._select}"
            )
            holders = [key[1] for key in keys]
            tokens = [key[2] for key in keys]
            cursor.execute(sql, [names, holders, tokens, d.ttl_param(ttl)])
            rows = cursor.fetchall()
        elif self.vendor == "sqlite":
            # No row locks (a write locks the whole database): nothing to pass over.
            sql = (
                f"UPDATE {self._table} SET renewed_at = {d.now()}, expires_at = {d.expiry()} "
                f"WHERE name IN ({', '.join(['%s'] * len(keys))}) "
                f"AND (name, holder, token) IN (VALUES {', '.join(['(%s, %s, %s)'] * len(keys))}) "
                f"AND expires_at > {d.now()} RETURNING {self._select}"
            )
            cursor.execute(sql, [d.ttl_param(ttl), *names, *(v for key in keys for v in key)])
            rows = cursor.fetchall()  # drain: SQLite completes the statement only then
        else:
            rows = self._renew_chunk_mysql(cursor, keys, ttl)
        for row in rows:
            found[(row[0], row[1], int(row[3]))] = row
        if len(rows) == len(keys) or not self._skips_locked(cursor):
            return []
        # Which of the others still meet the condition: those whose row was locked.
        missing = [key for key in keys if key not in found]
        missing_names = [key[0] for key in missing]
        params: list[Any] = [missing_names]
        among = "= ANY(%s::text[])"
        if self.vendor != "postgresql":
            among, params = f"IN ({', '.join(['%s'] * len(missing))})", list(missing_names)
        cursor.execute(
            f"SELECT name, holder, token FROM {self._table} "
            f"WHERE name {among} AND expires_at > {d.now()}",
            params,
        )
        current = {(name, holder, int(token)) for name, holder, token in cursor.fetchall()}
        return [key for key in missing if key in current]

    def _skips_locked(self, cursor: Any) -> bool:
        return self.vendor != "sqlite" and bool(
            cursor.db.features.has_select_for_update_skip_locked
        )

    def _renew_chunk_mysql(
        self, cursor: Any, keys: list[tuple[str, str, int]], ttl: float
    ) -> list[Sequence[Any]]:
        """MySQL/MariaDB have no ``UPDATE ... RETURNING``: lock the rows that meet the
        condition (by the server's clock, read in the same statement), then set them from
        that reading, in one transaction."""
        d = self.dialect
        lock = "FOR UPDATE"
        if self._skips_locked(cursor):
            lock += " SKIP LOCKED"
        wrapper = cursor.db
        wrapper.set_autocommit(False)
        try:
            cursor.execute(
                f"SELECT {self._select}, {d.now()} FROM {self._table} "
                f"WHERE name IN ({', '.join(['%s'] * len(keys))}) "
                f"AND (name, holder, token) IN ({', '.join(['(%s, %s, %s)'] * len(keys))}) "
                f"AND expires_at > {d.now()} {lock}",
                [*(key[0] for key in keys), *(v for key in keys for v in key)],
            )
            locked = cursor.fetchall()
            rows: list[Sequence[Any]] = []
            if locked:
                now = locked[0][-1]
                expires = now + timedelta(microseconds=d.ttl_param(ttl))
                cursor.execute(
                    f"UPDATE {self._table} SET renewed_at = %s, expires_at = %s "
                    f"WHERE name IN ({', '.join(['%s'] * len(locked))})",
                    [now, expires, *(row[0] for row in locked)],
                )
                rows = [(*row[:6], now, expires, row[8]) for row in locked]
            wrapper.commit()
        except BaseException:
            with suppress(DjangoDBError):
                wrapper.rollback()
            raise
        finally:
            if wrapper.connection is not None:
                wrapper.set_autocommit(True)
        return rows

    def release(self, lease: Lease) -> bool:
        sql = (
            f"UPDATE {self._table} SET previous_holder = holder, holder = '', "
            f"expires_at = {self.dialect.now()} WHERE name = %s AND holder = %s AND token = %s"
        )
        params = [lease.name, lease.holder, lease.token]
        if self.vendor == "postgresql":
            # One statement, committed on its own: the release, its history event, and
            # the wake-up of everyone racing for the name (see watch()), sent at commit.
            event = ""
            if self.history:
                event = (
                    f", event AS (INSERT INTO {self._events} "
                    "(name, kind, holder, token, previous_holder, at, detail, actor) "
                    f"SELECT name, %s, %s, %s, '', {self.dialect.now()}, '', '' FROM released)"
                )
                params += [str(EventKind.RELEASED), lease.holder, lease.token]
            with self._cursor(atomic=False) as cursor:
                cursor.execute(
                    f"WITH released AS ({sql} RETURNING name){event} "
                    "SELECT pg_notify(%s, '') FROM released",
                    [*params, channel(self._channel_prefix, lease.name)],
                )
                return len(cursor.fetchall()) == 1
        with self._cursor(atomic=True) as cursor:
            cursor.execute(sql, params)
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
                self._insert_event(
                    cursor, EventKind.FORCED_RELEASE, released, detail=detail, actor=actor
                )
        return released

    def read(self, name: str) -> Lease | None:
        with self._cursor(atomic=False) as cursor:
            return self._current(cursor, name)

    def _current(self, cursor: Any, name: str) -> Lease | None:
        """The unexpired lease on ``name`` with ``read_at`` (the server's clock), or None."""
        now = self.dialect.now()
        cursor.execute(
            f"SELECT {self._select}, {now} FROM {self._table} "
            f"WHERE name = %s AND holder <> '' AND expires_at > {now}",
            [name],
        )
        row = cursor.fetchone()
        lease = self._row(row)
        if lease is not None:
            lease.read_at = aware(row[-1])
        return lease

    def names(self) -> list[str]:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(f"SELECT name FROM {self._table} ORDER BY name")
            return [row[0] for row in cursor.fetchall()]

    # -- candidates -----------------------------------------------------------------------
    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        d = self.dialect
        now, table = d.now(), self._candidates
        upsert = d.upsert(
            table,
            "name, identity, priority, host, pid, version, joined_at, seen_at, expires_at",
            f"%s, %s, %s, %s, %s, %s, {now}, {now}, {d.expiry()}",
            "name, identity",
            ["priority", "host", "pid", "version", "seen_at", "expires_at"],
        )
        # Three statements, each committed on its own: one transaction holding the locks
        # of the name's rows deadlocks against concurrent announcements on MySQL/MariaDB.
        with self._cursor(atomic=False) as cursor:
            # Its own row, if its heartbeat lapsed: it joins again at the tail (a new id).
            cursor.execute(
                f"DELETE FROM {table} WHERE name = %s AND identity = %s AND expires_at <= {now}",
                [name, candidate.identity],
            )
            cursor.execute(
                upsert,
                [
                    name,
                    candidate.identity,
                    candidate.priority,
                    candidate.host[:255],
                    candidate.pid,
                    candidate.version[:50],
                    d.ttl_param(ttl),
                ],
            )
        # Candidates that stopped without a word (crashed) go once expired: housekeeping
        # only (candidates() never lists them), so a failure here changes nothing.
        try:
            with self._cursor(atomic=False) as cursor:
                cursor.execute(
                    f"DELETE FROM {table} WHERE name = %s AND expires_at <= {now}", [name]
                )
        except BackendUnavailable as exc:
            logger.debug("dropping the expired candidates of %r failed: %s", name, exc)

    def withdraw(self, name: str, identity: str) -> None:
        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                f"DELETE FROM {self._candidates} WHERE name = %s AND identity = %s",
                [name, identity],
            )

    def candidates(self, name: str) -> list[Candidate] | None:
        from ..election import Candidate

        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                "SELECT identity, priority, host, pid, version, id, joined_at, seen_at, "
                f"expires_at FROM {self._candidates} "
                f"WHERE name = %s AND expires_at > {self.dialect.now()} ORDER BY id",
                [name],
            )
            rows = cursor.fetchall()
        return [
            Candidate(
                identity=identity,
                priority=int(priority),
                host=host,
                pid=int(pid),
                version=version,
                seq=int(seq),
                joined_at=aware(joined),
                seen_at=aware(seen),
                expires_at=aware(expires),
            )
            for identity, priority, host, pid, version, seq, joined, seen, expires in rows
        ]

    # -- wake-ups and hand-over -------------------------------------------------------------
    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """PostgreSQL: LISTEN on the channel of ``name`` (or of ``identity``), on one
        connection per process shared by every watch; a release notifies the name's
        channel in its own transaction. SQLite and MySQL/MariaDB cannot push: None
        (candidates poll)."""
        if self.vendor != "postgresql":
            return None
        hub = self._wake_hub()
        if hub is None:
            return None
        return hub.watch_lease(self._channel_prefix, name, identity, callback)

    def wake(self, name: str, identity: str | None = None) -> None:
        if self.vendor != "postgresql":
            return
        with self._cursor(atomic=False) as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, '')", [channel(self._channel_prefix, name, identity)]
            )

    @property
    def _channel_prefix(self) -> str:
        return f"{self.alias}:{self._table}"

    def _wake_hub(self) -> WakeHub | None:
        with self._hub_lock:
            hub = self._hub
            if hub is None or not hub.usable():
                from .db_listen import PostgresListener

                transport = PostgresListener.for_alias(self.alias, self.dialect, self.timeout)
                if transport is None:
                    return None
                hub = self._hub = WakeHub(transport, f"leader-listen:{self.alias}")
            return hub

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        d = self.dialect
        sql = (
            f"UPDATE {self._table} SET handover_to = %s, handover_until = {d.expiry()} "
            "WHERE name = %s"
        )
        with self._cursor(atomic=True) as cursor:
            row = self._update(cursor, sql, [to, d.ttl_param(window), name], name)
            if row is None:
                return None
            if self.history:
                self._insert_event(
                    cursor, EventKind.HANDOVER, row, detail=detail or f"to {to}", actor=actor
                )
            cursor.execute(f"SELECT {d.now()}", [])
            now = aware(cursor.fetchone()[0])
        held = row.holder and row.expires_at is not None and now is not None
        return row if held and row.expires_at > now else None  # type: ignore[operator]

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
        taken = kind in (EventKind.ACQUIRED, EventKind.TAKEN_OVER)
        previous = lease.previous_holder if taken else ""
        params = [
            lease.name,
            str(kind),
            lease.holder,
            lease.token,
            previous,
            detail[:1000],
            actor[:255],
        ]
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
    def fenced(self, lease: Lease, using: str | None = None) -> Iterator[None]:
        """One transaction on the lease's database (the caller's own connection).

        With ``using`` naming another database, the transaction is on that one, fenced
        with the lease's fence row there (see :meth:`Backend.fenced
        <django_leader.backends.base.Backend.fenced>`): the lease row cannot be locked from
        another database.

        It first locks the lease row and checks that ``lease.holder`` still holds it with
        ``lease.token``, unexpired by the server's clock; else ``LeadershipLost``. While the
        transaction is open, nobody can take the lease over (their ``UPDATE`` waits on the
        row lock), so the writes inside commit only under this token.

        The transaction is bounded by the lease, as every store call is bounded (see
        docs/safety.md): no statement of it starts after the local deadline, nor does it
        commit then (``LeadershipLost``, rolled back), and the server is told to end it
        should it still run or sit idle once the lease is over (the lease's time left, at
        least ``FENCE_FLOOR`` (1 s), set again at most ``FENCE_FLOOR`` apart): a holder
        frozen or cut off inside keeps the row locked no longer than that. SQLite cannot do
        this last part (see docs/database-backend.md).

        Outside an outer ``atomic()`` block, a connection that failed before is checked and
        replaced if the server dropped it, and one that fails inside is closed, so that the
        next call reconnects.
        """
        if using is not None and using != self.alias:
            with super().fenced(lease, using):
                yield
            return
        with fenced_transaction(self.alias, self.dialect, self._table, lease):
            yield


def _chunks(keys: list[Any], size: int) -> list[list[Any]]:
    return [keys[start : start + size] for start in range(0, len(keys), size)]


def _acquired_event(lease: Lease) -> tuple[str, str]:
    """The history event of an acquisition: its kind and detail."""
    if lease.previous_holder:  # the previous holder's term had expired
        return EventKind.TAKEN_OVER, f"lease of {lease.previous_holder} had expired"
    return EventKind.ACQUIRED, ""
