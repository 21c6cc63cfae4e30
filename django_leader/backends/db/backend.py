"""Leases in a Django database: SQLite, PostgreSQL, MySQL/MariaDB.

Each operation is decided by ONE conditional ``UPDATE`` (a missing row is created by an
``INSERT`` that does nothing on conflict); the number of rows it touched is the answer. The
expiry test and the new expiry use the database server's clock (``statement_timestamp()``,
``UTC_TIMESTAMP(6)``, SQLite's ``'now'``), never this process's.

Lease operations run on a connection of their own (one per thread), so they commit at once
even when called inside the caller's ``transaction.atomic()``, and every call is bounded by a
connect/statement timeout shorter than the renew deadline. After an error the connection is
dropped and the next call reconnects: that is how the backend rides out a database restart.

:class:`DatabaseBackend` is the face of the package: each concern is a module of its own
(``leases``, ``batch``, ``registry``, ``listen``, ``fence``, ``slots``), over the shared
:class:`~django_leader.backends.db.tables.LeaseTables` and the database's dialect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DatabaseError, connections

from ...conf import get_settings
from ...election import Candidate
from ...exceptions import BackendUnavailable
from ...lease import HistoryEvent, Lease
from ..base import Backend, Watch
from . import batch, leases, registry, retention
from .connection import PrivateConnection, pooled
from .dialect import StoreNow, aware
from .dialects import dialect_for
from .fence import fenced_transaction
from .listen import DatabaseWakeups
from .slots import DatabaseSlots
from .tables import LeaseTables

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ...conf import LeaderSettings

logger = logging.getLogger("django_leader")


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
        self.dialect = dialect_for(self.alias)
        self.vendor = connections[self.alias].vendor
        self._private = PrivateConnection(self.alias, self.dialect, self.timeout)
        # self._connection, looked up here: a subclass may route its connections.
        self._tables = LeaseTables(
            self.alias, self.dialect, self.history, self._connection, self.close, self.timeout
        )
        self._tables.open = self._private.open
        self._wakeups = DatabaseWakeups(self._tables, self.timeout)

    def __repr__(self) -> str:
        return f"<DatabaseBackend {self.alias!r} ({self.vendor})>"

    # -- what the admin, beat and checks need ---------------------------------------------
    #: Beat slot records are ``BeatSlot`` rows written inside :meth:`fenced`.
    shared_slots: ClassVar[bool] = True

    def now(self) -> datetime:
        """The database server's clock (the one every lease time here is in)."""
        with self._cursor(atomic=False) as cursor:
            cursor.execute(f"SELECT {self.dialect.read_now()}", [])  # (params: "%%" is "%")
            value = aware(cursor.fetchone()[0])
        if value is None:
            raise BackendUnavailable(f"database {self.alias!r}: no time from the server")
        return value.astimezone(dt_timezone.utc)

    def now_expression(self) -> Any:
        """:class:`~django_leader.backends.db.dialect.StoreNow`: the server's clock in a
        query."""
        return StoreNow()

    def slots(self) -> DatabaseSlots:
        """``BeatSlot`` rows on this database, on the beat thread's Django connection."""
        return DatabaseSlots(self.alias, self.dialect, self.fenced)

    def describe(self) -> str:
        return (
            f"{type(self).__name__} {self.alias!r}: state and time left by the "
            "database server's clock."
        )

    def replication(self) -> tuple[int, bool] | None:
        """How the lease database replicates, as its server says: (standbys streaming from
        it, whether a lease commit waits for a synchronous standby); None where the
        dialect cannot tell (SQLite, MySQL/MariaDB)."""
        if self.dialect.replication is None:
            return None
        with self._cursor(atomic=False) as cursor:
            cursor.execute(self.dialect.replication, [])
            standbys, waits = cursor.fetchone()
        return int(standbys), bool(waits)

    @classmethod
    def check_replication(cls, conf: LeaderSettings, timeout: float) -> list[CheckMessage]:
        """W022: the lease database streams to standbys, and lease commits wait for none.
        W023: it is reached through a transaction pooler (no LISTEN/NOTIFY)."""
        from django.core.checks import Warning

        store = cls(conf.database, timeout=timeout)
        try:
            found = store.replication()
        except BackendUnavailable:
            return []
        finally:
            store.close()
        messages: list[CheckMessage] = []
        if pooled(store.alias):
            messages.append(
                Warning(
                    f"DJANGO_LEADER['DATABASE'] {conf.database!r} is reached through a "
                    "transaction pooler (PgBouncer?): LISTEN/NOTIFY wake-ups are off, so a "
                    "freed lease is taken only at the next poll (RETRY_INTERVAL), and every "
                    "lease call sets its timeouts in a transaction of its own.",
                    hint="Give django-leader a database alias that connects to PostgreSQL "
                    "directly (DJANGO_LEADER['DATABASE']); see docs/production.md.",
                    id="django_leader.W023",
                )
            )
        if found is None or found[0] == 0 or found[1]:
            return messages
        messages.append(
            Warning(
                f"DJANGO_LEADER['DATABASE'] {conf.database!r} streams to {found[0]} "
                "standby(s), and lease commits do not wait for any (synchronous_standby_names "
                "is empty, or synchronous_commit is off or local). A failover to a standby "
                "that missed the last commits loses those lease writes: the backend notices "
                "the new timeline, takes no lease for the lock-delay and continues tokens from "
                "the clock, but an old primary that its holders still reach (a network split, "
                "not a crash) goes on renewing their leases beside the new one: two leaders.",
                hint="Set synchronous_standby_names on the primary (synchronous_commit on), "
                "or have the failover fence the old primary; see docs/production.md.",
                id="django_leader.W022",
            )
        )
        return messages

    # -- connection -----------------------------------------------------------------------
    def _connection(self) -> Any:
        """This thread's private connection wrapper (see :class:`PrivateConnection`)."""
        return self._private.get()

    def close(self) -> None:
        self._private.close()

    def own_transaction(self) -> str:
        connection = connections[self.alias]  # the calling thread's
        if not connection.in_atomic_block:
            return ""
        return self.dialect.busy_hint(connection) or (
            f" (this thread's transaction.atomic() on {self.alias!r} is open: it may hold "
            "the lock the lease operation waits for; take the lease outside it)"
        )

    def _cursor(self, atomic: bool) -> AbstractContextManager[Any]:
        """A cursor on the private connection; errors become BackendUnavailable."""
        return self._tables.cursor(atomic)

    # -- operations -----------------------------------------------------------------------
    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        return leases.acquire(self._tables, name, holder, ttl)

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        return leases.renew(self._tables, lease, ttl)

    def prune(self, unused_for: timedelta, *, batch: int = 500) -> int:
        """Delete the rows of the names unused for ``unused_for``, with their history and
        candidacies, ``batch`` names per transaction; the ``LeaseStore`` floor keeps their
        tokens from going backwards (see ``django_leader.backends.db.retention``)."""
        return retention.prune(self._tables, unused_for, batch)

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
        return batch.renew_many(self._tables, leases, ttl)

    def release(self, lease: Lease) -> bool:
        return leases.release(self._tables, lease)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        return leases.force_release(self._tables, name, actor=actor, detail=detail)

    def read(self, name: str) -> Lease | None:
        return leases.read(self._tables, name)

    def read_many(self, names: Sequence[str]) -> list[Lease | None]:
        return leases.read_many(self._tables, names)

    def names(self) -> list[str]:
        return leases.names(self._tables)

    # -- candidates -----------------------------------------------------------------------
    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        registry.announce(self._tables, name, candidate, ttl)

    def withdraw(self, name: str, identity: str) -> None:
        registry.withdraw(self._tables, name, identity)

    def candidates(self, name: str) -> list[Candidate] | None:
        return registry.candidates(self._tables, name)

    def candidates_many(self, names: Sequence[str]) -> list[list[Candidate] | None]:
        return registry.candidates_many(self._tables, names)

    # -- wake-ups and hand-over -------------------------------------------------------------
    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """PostgreSQL: LISTEN on the channel of ``name`` (or of ``identity``), on one
        connection per process shared by every watch; a release notifies the name's
        channel in its own transaction. SQLite and MySQL/MariaDB cannot push: None
        (candidates poll)."""
        return self._wakeups.watch(name, callback, identity)

    def wake(self, name: str, identity: str | None = None) -> None:
        self._wakeups.wake(name, identity)

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        return leases.request_handover(self._tables, name, to, window, actor=actor, detail=detail)

    # -- history --------------------------------------------------------------------------
    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        if not self.history:
            return
        try:
            self.write_events([HistoryEvent(kind, lease, detail=detail)])
        except BackendUnavailable as exc:
            logger.warning(
                "could not record %s event for %r: %s",
                kind,
                lease.name,
                exc,
                extra={"lease": lease.name, "holder": lease.holder, "token": lease.token},
            )

    def write_events(self, events: Sequence[HistoryEvent]) -> None:
        """Insert history rows in one transaction and a statement per 100 rows (a commit
        per row let a writer fall behind thousands of leases)."""
        with self._cursor(atomic=len(events) > 1) as cursor:
            self._tables.insert_events(cursor, events)

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
        with fenced_transaction(self.alias, self.dialect, self._tables.leases, lease):
            yield
