"""Retention: the rows of names nobody has used for a while, forgotten
(:meth:`DatabaseBackend.prune`, run by ``manage.py leader prune``).

A name's ``Lease`` row keeps its last fencing token, and a name whose row is missing
continues its tokens from its history (leases.py). Forgetting a name deletes both, so its
tokens must continue from somewhere else: before the rows go, the ``LeaseStore`` row's
``floor`` (the least token any new row may start from, see failover.py) is raised to the
greatest token among them, in the same transaction. A forgotten name taken again starts
above every token it had.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def prune(tables: Any, unused_for: timedelta, batch: int) -> int:
    """Delete, ``batch`` names per transaction, the rows of the names whose last term
    ended ``unused_for`` ago by the server's clock (or longer) and that have no candidacy
    since, with their history events and candidacies: how many names were deleted."""
    d = tables.dialect
    cutoff = d.expiry()  # the server's clock plus the (negative) parameter
    before = d.ttl_param(-unused_for.total_seconds())
    unused = (
        f"expires_at < {cutoff} AND (handover_until IS NULL OR handover_until < {cutoff}) "
        f"AND NOT EXISTS (SELECT 1 FROM {tables.candidates} c "
        f"WHERE c.name = {tables.leases}.name AND c.expires_at >= {cutoff})"
    )
    forgotten = 0
    while True:
        with tables.cursor(atomic=True) as cursor:
            cursor.execute(
                f"SELECT name, token FROM {tables.leases} WHERE {unused} "
                f"ORDER BY name LIMIT {int(batch)}",
                [before, before, before],
            )
            rows = cursor.fetchall()
            if not rows:
                return forgotten
            names = [row[0] for row in rows]
            raise_floor(tables, cursor, max(int(row[1]) for row in rows) + 1)
            marks = ", ".join(["%s"] * len(names))
            # The condition again: a name taken since it was read is kept.
            cursor.execute(
                f"DELETE FROM {tables.leases} WHERE name IN ({marks}) AND {unused}",
                [*names, before, before, before],
            )
            forgotten += cursor.rowcount
            cursor.execute(
                f"DELETE FROM {tables.candidates} WHERE name IN ({marks}) "
                f"AND NOT EXISTS (SELECT 1 FROM {tables.leases} l WHERE l.name = "
                f"{tables.candidates}.name)",
                names,
            )
            if tables.history:
                cursor.execute(
                    f"DELETE FROM {tables.events} WHERE name IN ({marks}) "
                    f"AND NOT EXISTS (SELECT 1 FROM {tables.leases} l WHERE l.name = "
                    f"{tables.events}.name)",
                    names,
                )
        if len(rows) < batch:
            return forgotten


def raise_floor(tables: Any, cursor: Any, token: int) -> None:
    """Make ``token`` the least token a new row may start from (never lowering the
    ``LeaseStore`` row's ``floor``), creating the row if need be (for the server this
    connection talks to, where the dialect can name it: not to be taken for a failover)."""
    d = tables.dialect
    server = d.server_identity or "''"
    cursor.execute(
        d.insert_ignore(
            tables.store,
            "id, server, fence, floor, changed_at",
            f"1, {server}, {d.now()}, 0, {d.now()}",
        ),
        [],
    )
    cursor.execute(
        f"UPDATE {tables.store} SET floor = %s WHERE id = 1 AND floor < %s", [token, token]
    )


def floor(tables: Any, cursor: Any) -> int:
    """The least token a new row may start from (0 if nothing was ever forgotten)."""
    cursor.execute(f"SELECT floor FROM {tables.store} WHERE id = 1", [])
    found = cursor.fetchone()
    return 0 if found is None else int(found[0])
