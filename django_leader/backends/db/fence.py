"""Fenced transactions: writes that commit only under a lease.

:func:`fenced_transaction` is :meth:`django_leader.backends.db.DatabaseBackend.fenced`
(the lease row itself, locked); ``backends/fence_row.py`` fences with a row of its own for the
other stores. Both are a :func:`bounded_transaction`: one that ends with the lease.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from typing import Any

from django.db import connections, transaction
from django.db.utils import Error as DjangoDBError
from django.db.utils import InterfaceError, OperationalError

from ...exceptions import BackendUnavailable, LeadershipLost
from ...lease import Lease, clock
from .dialect import Dialect
from .recycling import driver_error, interrupted
from .socket_bound import SocketBound

#: The least time, in seconds, a fenced transaction is given by the server before it is
#: aborted, however little of the lease is left (see :meth:`DatabaseBackend.fenced`).
FENCE_FLOOR = 1.0


@contextmanager
def fenced_transaction(alias: str, dialect: Dialect, table: str, lease: Lease) -> Iterator[None]:
    """The body of :meth:`DatabaseBackend.fenced` on database ``alias`` (Django's own
    connection), whose lease rows are in ``table`` (quoted)."""
    now = dialect.now()
    where = f"name = %s AND holder = %s AND token = %s AND expires_at > {now}"
    with bounded_transaction(alias, dialect, lease) as connection:
        with connection.cursor() as cursor:
            held = lock_row(cursor, table, "token", where, [lease.name, lease.holder, lease.token])
        if held is None:
            raise LeadershipLost(
                f"lease {lease.name!r} is no longer held by {lease.holder} with token {lease.token}"
            )
        yield


@contextmanager
def bounded_transaction(alias: str, dialect: Dialect, lease: Lease) -> Iterator[Any]:
    """A transaction on database ``alias`` (Django's own connection, so that the caller's
    writes are part of it) bounded by ``lease``; yields that connection.

    No statement of it starts after the lease's local deadline, nor does it commit then
    (``LeadershipLost``, rolled back), and the server is told to end it should it still run
    or sit idle once the lease is over (see :meth:`DatabaseBackend.fenced`); the client's
    socket gives up on an unanswered server by then too (``socket_bound.py``: a cut network),
    and has its own settings back afterwards. Outside an outer ``atomic()`` block, a
    connection that failed before is replaced if the server dropped it, and one that fails
    inside is closed, so that the next call reconnects.
    """
    lease.check()
    connection = connections[alias]
    outermost = not connection.in_atomic_block
    if outermost:
        _recycle(connection)
    fence = _Fence(dialect, connection, lease)
    unconfirmed: Callable[[], str | None] | None = None
    call_off: Callable[[], None] = _nothing
    try:
        with transaction.atomic(using=alias), connection.execute_wrapper(fence):
            if outermost:
                connection.ensure_connection()
                unconfirmed = dialect.watch_commit(connection.connection)
            yield connection
            fence.check("commit")
            if outermost:
                # The commit's wait for a synchronous standby outlasts every server-side
                # bound: cancelled from here once the lease is over.
                seconds = max(FENCE_FLOOR, lease.time_left())
                call_off = dialect.cancel_later(connection.connection, seconds)
        call_off()
        said = unconfirmed() if unconfirmed is not None else None
        if said is not None:
            # The fence's statement_timeout cancelled the commit's wait for a synchronous
            # standby: PostgreSQL then commits on the primary alone, and says so.
            raise BackendUnavailable(
                f"database {alias!r}: this fenced transaction committed on the primary "
                f"alone ({said}); a failover may lose it: whether it lasts is not known"
            )
    except (DjangoDBError, driver_error(alias)) as exc:
        # Raised in the clean-up of a stop request (a signal handler's exception in the
        # middle of a statement or the COMMIT), the error must not replace it.
        hidden = interrupted(exc, alias)
        if outermost and (hidden is not None or isinstance(exc, OperationalError | InterfaceError)):
            # The connection may be dead (the server restarted, killed it, or ended this
            # transaction) or still busy with the interrupted statement: a new one for the
            # next call.
            with suppress(DjangoDBError):
                connection.close()
        if hidden is not None:
            raise hidden from None
        raise
    finally:
        call_off()
        fence.socket.restore()
        if fence.saved and connection.connection is not None:
            with suppress(DjangoDBError), connection.cursor() as cursor:
                dialect.unbound_transaction(cursor, fence.saved)


def _nothing() -> None:
    return None


def lock_row(
    cursor: Any, table: str, column: str, where: str, params: list[Any]
) -> tuple[Any, ...] | None:
    """Lock the one row of ``table`` matching ``where`` until the transaction ends, and
    return its ``column`` (a 1-tuple); None if no row matches (nothing is locked then,
    except on SQLite)."""
    if not cursor.db.features.has_select_for_update:
        # SQLite has no row locks: a write takes the database's RESERVED lock, which keeps
        # every other writer out until this transaction ends.
        cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE {where}", params)
        if cursor.rowcount != 1:
            return None
        cursor.execute(f"SELECT {column} FROM {table} WHERE {where}", params)
    else:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {where} FOR UPDATE", params)
    row: tuple[Any, ...] | None = cursor.fetchone()
    return row


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
    the local deadline has passed, and (re)set the server's bounds on the transaction (and
    the client socket's).

    The bounds are set on a cursor of their own: set on the statement's cursor after the
    statement, they would replace its result (a statement of a second or more once
    returned the timeouts instead of its rows)."""

    def __init__(self, dialect: Dialect, connection: Any, lease: Lease) -> None:
        self.dialect = dialect
        self.connection = connection
        self.lease = lease
        self.armed_at: float | None = None
        #: What the dialect must restore once the transaction is over (MySQL: variables).
        self.saved: dict[str, Any] = {}
        #: The client-side bound on the connection's socket (set once it is connected).
        self.socket = SocketBound(None)

    def check(self, what: str) -> None:
        if not self.lease.held:
            raise LeadershipLost(
                f"lease {self.lease.name!r} (token {self.lease.token}): local deadline passed "
                f"inside fenced(), refusing to {what}; the transaction is rolled back"
            )

    def arm(self) -> None:
        if self.armed_at is None:
            self.socket = SocketBound(self.connection.connection)
        self.armed_at = clock()
        seconds = max(FENCE_FLOOR, self.lease.time_left())
        self.socket.set(seconds)
        with (
            self.connection.wrap_database_errors,
            closing(self.connection.connection.cursor()) as raw,
        ):
            self.dialect.bound_transaction(raw, self.connection, seconds, self.saved)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.check("run a statement")
        if self.armed_at is None or clock() - self.armed_at >= FENCE_FLOOR:
            self.arm()
        result = execute(sql, params, many, context)
        if clock() - self.armed_at >= FENCE_FLOOR:  # type: ignore[operator]
            self.arm()  # a long statement: bound the idle after it
        return result
