"""Batch renewal for the database backend: many leases, one statement.

A row locked by a transaction (its holder's ``fenced()``) is passed over (``SKIP
LOCKED``), never waited for: the others are renewed and answered at once, and
``RenewedInPart`` names the leases to try again (no deadlock with ``fenced()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections

from ...lease import Lease
from ..partial import answers
from .dialect import Key
from .tables import LeaseTables


def renew_many(tables: LeaseTables, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
    """``renew`` each of ``leases`` in as few statements as the dialect allows, under the
    same conditions as one renewal, decided by the server's clock (see
    :meth:`DatabaseBackend.renew_many`)."""
    if not leases:
        return []
    keys = list(dict.fromkeys((lease.name, lease.holder, lease.token) for lease in leases))
    found: dict[Key, Sequence[Any]] = {}
    size = tables.dialect.batch_size(connections[tables.alias])
    chunks = [keys] if size is None else _chunks(keys, size)
    # Without row locks (SQLite): several statements in one transaction (one write of the
    # file).
    atomic = not tables.dialect.locks_rows and len(chunks) > 1
    with tables.cursor(atomic=atomic) as cursor:
        locked = {
            key for chunk in chunks for key in _renew_chunk(tables, cursor, chunk, ttl, found)
        }
    results = [tables.row(found.get((le.name, le.holder, le.token))) for le in leases]
    return answers(f"database {tables.alias!r}", leases, results, locked)


def _renew_chunk(
    tables: LeaseTables,
    cursor: Any,
    keys: list[Key],
    ttl: float,
    found: dict[Key, Sequence[Any]],
) -> list[Key]:
    """Renew the leases ``keys`` in one statement (or one transaction), adding each
    renewed row to ``found``. Returns the keys passed over because their row was locked."""
    if not keys:
        return []
    d = tables.dialect
    rows = d.renew_rows(cursor, tables.leases, tables.select, keys, ttl)
    for row in rows:
        found[(row[0], row[1], int(row[3]))] = row
    if len(rows) == len(keys) or not d.skips_locked(cursor):
        return []
    # Which of the others still meet the condition: those whose row was locked.
    missing = [key for key in keys if key not in found]
    among, params = d.among([key[0] for key in missing])
    cursor.execute(
        f"SELECT name, holder, token FROM {tables.leases} "
        f"WHERE name {among} AND expires_at > {d.now()}",
        params,
    )
    current = {(name, holder, int(token)) for name, holder, token in cursor.fetchall()}
    return [key for key in missing if key in current]


def _chunks(keys: list[Key], size: int) -> list[list[Key]]:
    return [keys[start : start + size] for start in range(0, len(keys), size)]
