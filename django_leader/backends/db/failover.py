"""A database that failed over: a promoted standby, or a restore to an earlier point.

An asynchronous standby may miss the last commits of its primary: a lease acquired or
renewed there, a token issued. Promoted, it would let another candidate take a lease whose
holder still believes it leads, and issue that token again (SPEC rules 7 and 9). Where the
dialect can name the server it talks to (:attr:`Dialect.server_identity`; PostgreSQL: the
system identifier and the WAL timeline, which every promotion and point-in-time restore
changes), the ``LeaseStore`` row records the server that last issued leases. An
acquisition on another server:

* sets ``fence`` to now + the lock-delay: no lease is taken before it, so every holder of
  the old server has passed its local deadline (each made its last successful renewal
  before the failover);
* raises ``floor`` to the server clock in microseconds: every token issued from then on is
  at least that, greater than any the old server issued (tokens are small counters, or
  clock readings of the past).

The acquisition statement itself checks the row (:func:`gate`, :func:`floor`), so the
common case costs no extra round trip; the detection (:func:`check_server`) runs when that
check refuses, and before a name's first row is made. A missing row (a database never
used, or just migrated) lets acquisitions through, and is made by the next refused one.
"""

from __future__ import annotations

import logging
from typing import Any

from ...conf import lock_delay

logger = logging.getLogger("django_leader")


def gate(tables: Any) -> str:
    """SQL: true if leases may be taken on this server now; NULL when nothing is
    recorded yet (callers wrap it in ``COALESCE(…, TRUE)`` to let that through)."""
    d = tables.dialect
    return (
        f"(SELECT m.server = {d.server_identity} AND m.fence <= {d.now()} "
        f"FROM {tables.store} m WHERE m.id = 1)"
    )


def floor(tables: Any) -> str:
    """SQL: the least token an acquisition may issue (0 when nothing is recorded)."""
    return f"COALESCE((SELECT m.floor FROM {tables.store} m WHERE m.id = 1), 0)"


def check_server(tables: Any, cursor: Any, ttl: float) -> int | None:
    """Record the server this connection talks to, noticing a failover: the floor of the
    tokens if leases may be taken now, None if not (a lock-delay runs, or starts now)."""
    d = tables.dialect
    cursor.execute(
        f"SELECT m.server, {d.server_identity}, m.fence > {d.now()}, m.floor "
        f"FROM (SELECT 1 AS one) o LEFT JOIN {tables.store} m ON m.id = 1",
        [],
    )
    recorded, server, fenced, least = cursor.fetchone()
    if recorded is None:
        cursor.execute(
            d.insert_ignore(
                tables.store,
                "id, server, fence, floor, changed_at",
                f"1, %s, {d.now()}, 0, {d.now()}",
            ),
            [server],
        )
        return 0
    if recorded != server:
        delay = lock_delay(ttl)
        seed, seed_params = d.clock_seed()
        cursor.execute(
            f"UPDATE {tables.store} SET server = %s, fence = GREATEST(fence, {d.expiry()}), "
            f"floor = GREATEST(floor, {seed}), changed_at = {d.now()} "
            "WHERE id = 1 AND server = %s",
            [server, d.ttl_param(delay), *seed_params, recorded],
        )
        if cursor.rowcount == 1:
            logger.warning(
                "database %r is served by %s, but its leases were last issued by %s: a "
                "failover (a promoted standby) or a restore, which may have lost lease "
                "writes. No lease may be taken for the lock-delay of %.1fs, so that every "
                "holder that could still believe it leads has stepped down; tokens continue "
                "from the server clock",
                tables.alias,
                server,
                recorded,
                delay,
                extra={"store_server": server, "previous_server": recorded},
            )
        return None
    return None if fenced else int(least)
