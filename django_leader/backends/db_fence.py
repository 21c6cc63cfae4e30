"""The database backend's fenced transaction: writes that commit only under a lease.

See :meth:`django_leader.backends.db.DatabaseBackend.fenced` for what it guarantees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from django.db import connections, transaction
from django.db.utils import Error as DjangoDBError
from django.db.utils import InterfaceError, OperationalError

from ..exceptions import LeadershipLost
from ..lease import Lease, clock
from .sql import Dialect

#: The least time, in seconds, a fenced transaction is given by the server before it is
#: aborted, however little of the lease is left (see :meth:`DatabaseBackend.fenced`).
FENCE_FLOOR = 1.0


@contextmanager
def fenced_transaction(alias: str, dialect: Dialect, table: str, lease: Lease) -> Iterator[None]:
    """The body of :meth:`DatabaseBackend.fenced` on database ``alias`` (Django's own
    connection), whose lease rows are in ``table`` (quoted)."""
    lease.check()
    connection = connections[alias]
    outermost = not connection.in_atomic_block
    if outermost:
        _recycle(connection)
    fence = _Fence(dialect, connection, lease)
    now = dialect.now()
    where = f"name = %s AND holder = %s AND token = %s AND expires_at > {now}"
    params = [lease.name, lease.holder, lease.token]
    try:
        with transaction.atomic(using=alias), connection.execute_wrapper(fence):
            with connection.cursor() as cursor:
                if connection.vendor == "sqlite":
                    # SQLite has no row locks: a write takes the database's RESERVED lock,
                    # which keeps every other writer out until this transaction ends.
                    cursor.execute(f"UPDATE {table} SET token = token WHERE {where}", params)
                    held = cursor.rowcount == 1
                else:
                    cursor.execute(f"SELECT 1 FROM {table} WHERE {where} FOR UPDATE", params)
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
                dialect.unbound_transaction(cursor, fence.saved)


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

    def __init__(self, dialect: Dialect, connection: Any, lease: Lease) -> None:
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
