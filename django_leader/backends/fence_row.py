"""The fence row: fenced writes in a Django database for a lease held in another store.

A lease held in Redis (or ZooKeeper, or any store that is not the database the writes go
to) cannot be checked inside the writes' transaction. Its fencing token can: each lease
name has a row (``django_leader.models.LeaseFence``, table :data:`FENCE_TABLE`) holding
the greatest token that wrote through it, in the writes' own database.
:func:`fence_row_transaction` locks that row in the caller's transaction, refuses a token
lower than the one it holds and otherwise raises it to this token: the storage checks the
token, as Kleppmann's fencing tokens require ("How to do distributed locking", 2016), so a
holder paused past its lease cannot write once its successor has (docs/safety.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from ..exceptions import LeadershipLost
from ..lease import Lease
from .db.dialects import DIALECTS
from .db.fence import bounded_transaction, lock_row

#: The table of ``django_leader.models.LeaseFence`` (Django's default name for it, which
#: its migration creates): named here so that the store contract imports no Django model.
FENCE_TABLE = "django_leader_leasefence"


@contextmanager
def fence_row_transaction(alias: str, lease: Lease) -> Iterator[None]:
    """A transaction on database ``alias`` (Django's own connection) whose writes commit
    only if no token of ``lease.name`` greater than ``lease.token`` wrote before them, and
    only before the lease's local deadline.

    The fence row stays locked until the transaction ends: a greater token's writes wait
    for it, so commits happen in token order. A lower token that comes after them is
    refused with :class:`~django_leader.exceptions.LeadershipLost` (rolled back).
    """
    vendor = connections[alias].vendor
    if vendor not in DIALECTS:
        raise NotImplementedError(f"django_leader has no SQL for database vendor {vendor!r}")
    dialect = DIALECTS[vendor]()
    table = connections[alias].ops.quote_name(FENCE_TABLE)
    with bounded_transaction(alias, dialect, lease) as connection:
        with connection.cursor() as cursor:
            row = lock_row(cursor, table, "token", "name = %s", [lease.name])
            if row is None:
                # The name's first fenced write in this database: insert the row (token 0; a
                # concurrent first write's insert wins, this one is ignored), then lock it.
                # Locking first keeps INSERT IGNORE off the common path: on MySQL it takes a
                # shared lock on an existing row, and two transactions upgrading theirs to
                # FOR UPDATE at once deadlock.
                cursor.execute(
                    dialect.insert_ignore(
                        table, "name, token, holder, written_at", "%s, 0, '', " + dialect.now()
                    ),
                    [lease.name],
                )
                row = lock_row(cursor, table, "token", "name = %s", [lease.name])
            if row is None:  # pragma: no cover - inserted just above
                raise LeadershipLost(f"lease {lease.name!r}: no fence row")
            if int(row[0]) > lease.token:
                raise LeadershipLost(
                    f"lease {lease.name!r}: token {lease.token} is fenced off, token {row[0]} "
                    f"already wrote in database {alias!r}; the transaction is rolled back"
                )
            cursor.execute(
                f"UPDATE {table} SET token = %s, holder = %s, written_at = {dialect.now()} "
                "WHERE name = %s",
                [lease.token, lease.holder, lease.name],
            )
        yield
