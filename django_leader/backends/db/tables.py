"""What every statement of the database backend shares: the lease tables of one
database, their columns, and a cursor on the store's own connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.utils import Error as DjangoDBError

from ...exceptions import BackendUnavailable, StoreBusy
from ...lease import EventKind, HistoryEvent, Lease
from .dialect import Dialect, aware
from .recycling import driver_error, interrupted

#: The columns of a lease row, in the order :meth:`LeaseTables.row` reads them.
COLUMNS = (
    "name",
    "holder",
    "previous_holder",
    "token",
    "transitions",
    "acquired_at",
    "renewed_at",
    "expires_at",
)


def _connected(wrapper: Any) -> Any:
    wrapper.ensure_connection()
    return wrapper


#: History rows inserted by one statement (8 parameters each: under SQLite's oldest limit
#: of 999 parameters).
EVENTS_PER_INSERT = 100


class LeaseTables:
    """The ``Lease``, ``LeaseEvent``, ``LeaseCandidate`` and ``LeaseStore`` tables of
    database ``alias`` (quoted names), written in ``dialect``, over the connection
    ``connect()`` gives (this thread's private one; ``disconnect()`` drops it).
    ``history``: whether lease changes are recorded as events."""

    def __init__(
        self,
        alias: str,
        dialect: Dialect,
        history: bool,
        connect: Callable[[], Any],
        disconnect: Callable[[], None],
        timeout: float = 5.0,
    ) -> None:
        from ...models import Lease as LeaseRow
        from ...models import LeaseCandidate, LeaseEvent, LeaseStore

        self.alias = alias
        self.dialect = dialect
        self.history = history
        self.connect = connect
        #: Connects a wrapper ``connect()`` gave (the private connection's ``open``, which
        #: finds out whether a transaction pooler is in the way).
        self.open: Callable[[Any], Any] = _connected
        #: Seconds a call may take (the server's statement timeout; see
        #: :meth:`Dialect.bounded_call`).
        self.timeout = timeout
        self.disconnect = disconnect
        ops = connections[alias].ops
        self.leases = ops.quote_name(LeaseRow._meta.db_table)
        self.events = ops.quote_name(LeaseEvent._meta.db_table)
        self.candidates = ops.quote_name(LeaseCandidate._meta.db_table)
        self.store = ops.quote_name(LeaseStore._meta.db_table)
        # The columns of a Lease, then who a standing hand-over request names.
        handover = f", CASE WHEN handover_until > {dialect.now()} THEN handover_to ELSE '' END"
        # Times as Dialect.read_time reads them (instants, whatever the session's zone).
        self.select = ", ".join(self.timed(c) for c in COLUMNS) + handover
        #: The prefix of this store's wake-up channels (see ``wakeups.channel``).
        self.channel_prefix = f"{alias}:{self.leases}"

    def timed(self, column: str) -> str:
        """``column`` of a select list, a time read as :meth:`Dialect.read_time` reads
        it (named as the column)."""
        if not column.endswith("_at"):
            return column
        read = self.dialect.read_time(column)
        return column if read == column else f"{read} AS {column}"

    @contextmanager
    def cursor(self, atomic: bool) -> Iterator[Any]:
        """A cursor on the private connection, in a transaction of its own if ``atomic``.
        A database error becomes ``BackendUnavailable`` and drops the connection: the next
        call reconnects (that is how the store rides out a database restart)."""
        try:
            wrapper = self.open(self.connect())
            # Behind a transaction pooler, the bounds are set in each call's transaction.
            pooled = getattr(wrapper, "django_leader_pooled", False)
            atomic = atomic or pooled
            if atomic:
                wrapper.set_autocommit(False)
            try:
                with self.dialect.bounded_call(wrapper, self.timeout):
                    with wrapper.cursor() as cursor:
                        if pooled:
                            self.dialect.bound_transaction(cursor, wrapper, self.timeout, {})
                        yield cursor
                    if atomic:
                        wrapper.commit()
            except BaseException:
                if atomic:
                    with suppress(DjangoDBError, driver_error(self.alias)):
                        wrapper.rollback()
                raise
            finally:
                if atomic and wrapper.connection is not None:
                    wrapper.set_autocommit(True)
        except (DjangoDBError, driver_error(self.alias)) as exc:
            self.disconnect()  # reconnect on the next call
            hidden = interrupted(exc, self.alias)
            if hidden is not None:  # a stop request, say: not the store's failure
                raise hidden from None
            message = str(exc).strip() or type(exc).__name__
            hint = self.dialect.busy_hint(connections[self.alias])
            if not hint and self.dialect.busy(exc):  # another's write, not this thread's
                raise StoreBusy(f"database {self.alias!r}: {message}") from exc
            message += hint
            if (
                "no such table" in message
                or "doesn't exist" in message
                or ("does not exist" in message and "relation" in message)
            ):
                message += " (did you run `manage.py migrate django_leader`?)"
            raise BackendUnavailable(f"database {self.alias!r}: {message}") from exc
        except BaseException:
            # Cut short (a signal handler's stop request, say): the connection may still be
            # busy with the statement, and is dropped, not rolled back.
            self.disconnect()
            raise

    def row(self, row: Sequence[Any] | None) -> Lease | None:
        """The :class:`Lease` of a row read with :attr:`select` (None: no row)."""
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

    def update(self, cursor: Any, sql: str, params: list[Any], name: str) -> Lease | None:
        """Run a conditional UPDATE of the row ``name``; return the row it changed, or None."""
        if self.dialect.returning:
            cursor.execute(f"{sql} RETURNING {self.select}", params)
            rows = cursor.fetchall()  # drain: SQLite completes the statement only then
            return self.row(rows[0] if rows else None)
        cursor.execute(sql, params)
        if cursor.rowcount != 1:
            return None
        cursor.execute(f"SELECT {self.select} FROM {self.leases} WHERE name = %s", [name])
        return self.row(cursor.fetchone())

    def current(self, cursor: Any, name: str) -> Lease | None:
        """The unexpired lease on ``name`` with ``read_at`` (the server's clock), or None."""
        return self.current_of(cursor, [name])[0]

    def current_of(self, cursor: Any, names: Sequence[str]) -> list[Lease | None]:
        """:meth:`current` of each of ``names`` (as many as a statement takes), in order,
        in one statement."""
        now = self.dialect.now()
        among, params = self.dialect.among(names)
        cursor.execute(
            f"SELECT {self.select}, {self.dialect.read_now()} FROM {self.leases} "
            f"WHERE name {among} AND holder <> '' AND expires_at > {now}",
            params,
        )
        found = {}
        for row in cursor.fetchall():
            lease = self.row(row)
            if lease is not None:
                lease.read_at = aware(row[-1])
                found[lease.name] = lease
        return [found.get(name) for name in names]

    def insert_event(
        self,
        cursor: Any,
        kind: str,
        lease: Lease,
        *,
        detail: str = "",
        actor: str = "",
        at: datetime | None = None,
    ) -> None:
        """Insert one history row, stamped ``at`` (default: the database server's now)."""
        self.insert_events(cursor, [HistoryEvent(kind, lease, at, detail, actor)])

    def insert_events(self, cursor: Any, events: Sequence[HistoryEvent]) -> None:
        """Insert a history row for each of ``events``, :data:`EVENTS_PER_INSERT` rows per
        statement (one round trip each, not one per row)."""
        for start in range(0, len(events), EVENTS_PER_INSERT):
            rows, params = [], []
            for event in events[start : start + EVENTS_PER_INSERT]:
                lease = event.lease
                # Only an acquisition names the holder before it (whose lease expired).
                taken = event.kind in (EventKind.ACQUIRED, EventKind.TAKEN_OVER)
                params += [lease.name, str(event.kind), lease.holder, lease.token]
                params.append(lease.previous_holder if taken else "")
                if event.at is None:
                    stamp = self.dialect.now()
                else:
                    stamp = "%s"
                    params.append(self.dialect.time_param(self.connect(), event.at))
                params += [event.detail[:1000], event.actor[:255]]
                rows.append(f"(%s, %s, %s, %s, %s, {stamp}, %s, %s)")
            cursor.execute(
                f"INSERT INTO {self.events} "
                "(name, kind, holder, token, previous_holder, at, detail, actor) "
                f"VALUES {', '.join(rows)}",
                params,
            )
