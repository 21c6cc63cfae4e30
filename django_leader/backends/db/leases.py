"""The lease operations of the database backend: acquire, renew, release, read.

Each is decided by ONE conditional ``UPDATE`` (a missing row is created by an ``INSERT``
that does nothing on conflict); the number of rows it touched is the answer. The expiry
test and the new expiry use the database server's clock, never this process's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...conf import lock_delay
from ...lease import EventKind, Lease
from ..wakeups import channel
from . import failover, retention
from .dialect import aware
from .tables import COLUMNS, LeaseTables

logger = logging.getLogger("django_leader")


def acquire(
    tables: LeaseTables, name: str, holder: str, ttl: float
) -> tuple[Lease | None, Lease | None]:
    """Take ``name`` for ``holder`` if it is free: ``(lease, lease)``, or ``(None,
    current holder or None)`` (see :meth:`Backend.acquire`)."""
    d = tables.dialect
    now, expiry, ttl_param = d.now(), d.expiry(), d.ttl_param(ttl)
    # Where failovers can be noticed: not on another server than the last, nor during
    # the lock-delay after one; tokens not below the floor one left (see failover.py).
    token, gated = "token + 1", ""
    if d.server_identity is not None:
        token = f"GREATEST(token + 1, {failover.floor(tables)})"
        gated = f" AND COALESCE({failover.gate(tables)}, TRUE)"
    # previous_holder is assigned first: MySQL evaluates SET left to right.
    update = (
        f"UPDATE {tables.leases} SET previous_holder = holder, holder = %s, "
        f"token = {token}, transitions = transitions + 1, acquired_at = {now}, "
        f"renewed_at = {now}, expires_at = {expiry}, handover_to = '', "
        "handover_until = NULL "
        # Expiry alone decides: release() ends the term now, force_release() does not
        # (the holder may not know yet), so nobody is let in while it might still act.
        # A standing hand-over request lets in only the candidate it names.
        f"WHERE name = %s AND expires_at <= {now} AND (handover_until IS NULL OR "
        f"handover_until <= {now} OR handover_to = %s){gated}"
    )
    params = [holder, ttl_param, name, holder]
    # Where the dialect can (PostgreSQL): the acquisition and its history event in one
    # statement, committed on its own (no BEGIN, no COMMIT); elsewhere one transaction.
    single = tables.dialect.writes_in_one_statement
    with tables.cursor(atomic=not single) as cursor:
        if single:
            lease = _acquire_with_event(tables, cursor, update, params, name)
        else:
            lease = tables.update(cursor, update, params, name)
            if lease is not None and tables.history:
                kind, detail = acquired_event(lease)
                tables.insert_event(cursor, kind, lease, detail=detail)
        if lease is not None:
            return lease, lease
        refused = _refused(tables, cursor, name, ttl)
        if refused is not None or not single:
            return refused or _create(tables, cursor, name, holder, ttl)
    # No row, written in one statement: created in a transaction (with its history event).
    with tables.cursor(atomic=True) as cursor:
        return _create(tables, cursor, name, holder, ttl)


def _acquire_with_event(
    tables: LeaseTables, cursor: Any, update: str, params: list[Any], name: str
) -> Lease | None:
    """``update`` (an acquisition of ``name``) and, if it took the lease, its history
    event, in one statement (a data-modifying ``WITH``)."""
    if not tables.history:
        return tables.update(cursor, update, params, name)
    cursor.execute(
        f"WITH acquired AS ({update} RETURNING {tables.select}), "
        f"event AS (INSERT INTO {tables.events} "
        "(name, kind, holder, token, previous_holder, at, detail, actor) "
        "SELECT name, CASE WHEN previous_holder <> '' THEN %s ELSE %s END, holder, token, "
        f"previous_holder, {tables.dialect.now()}, CASE WHEN previous_holder <> '' THEN "
        "left('lease of ' || previous_holder || ' had expired', 1000) ELSE '' END, '' "
        "FROM acquired) SELECT * FROM acquired",
        [*params, str(EventKind.TAKEN_OVER), str(EventKind.ACQUIRED)],
    )
    return tables.row(cursor.fetchone())


def _refused(
    tables: LeaseTables, cursor: Any, name: str, ttl: float
) -> tuple[None, Lease | None] | None:
    """An acquisition of ``name`` refused: ``(None, current holder)``, or None if the
    name has no row."""
    d = tables.dialect
    now = d.now()
    failover_known = d.server_identity is not None
    # Held (the common case, one more statement), gated, or no row.
    cursor.execute(
        f"SELECT {tables.select}, {failover.gate(tables) if failover_known else 'TRUE'}, "
        f"{d.read_now()}, CASE WHEN holder <> '' AND expires_at > {now} THEN 1 ELSE 0 END "
        f"FROM {tables.leases} WHERE name = %s",
        [name],
    )
    row = cursor.fetchone()
    if row is not None:
        if not row[-1]:
            if row[-3] is not True and failover_known:
                failover.check_server(tables, cursor, ttl)  # a failover, or nothing recorded
            return None, None  # free yet refused: a term, a hand-over gate, a lock-delay
        current = tables.row(row[:-3])
        assert current is not None
        current.read_at = aware(row[-2])
        return None, current
    return None


def _create(
    tables: LeaseTables, cursor: Any, name: str, holder: str, ttl: float
) -> tuple[Lease | None, Lease | None]:
    """Acquire ``name``, which has no row: a new name, or a row deleted by hand."""
    d = tables.dialect
    now, expiry, ttl_param = d.now(), d.expiry(), d.ttl_param(ttl)
    lease: Lease | None = None
    # The floor of the tokens: after a failover (see failover.py), or above the names
    # forgotten by retention (retention.py).
    if d.server_identity is not None:
        found = failover.check_server(tables, cursor, ttl)
        if found is None:
            return None, None  # a lock-delay runs: nobody may take any lease yet
        least = found
    else:
        least = retention.floor(tables, cursor)
    # (See "When the store forgets" in docs/safety.md.)
    top, released = 0, False
    if tables.history:
        cursor.execute(
            f"SELECT token, kind FROM {tables.events} WHERE name = %s "
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
            tables.leases,
            ", ".join(COLUMNS) + ", handover_to",
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
        if tables.history:
            seed, seed_params = "%s", [max(top + 1, least)]
        else:
            seed, seed_params = d.clock_seed()
        insert = d.insert_ignore(
            tables.leases,
            ", ".join(COLUMNS) + ", handover_to",
            f"%s, %s, '', {seed}, 1, {now}, {now}, {expiry}, ''",
        )
        cursor.execute(insert, [name, holder, *seed_params, ttl_param])
        if cursor.rowcount == 1:
            cursor.execute(f"SELECT {tables.select} FROM {tables.leases} WHERE name = %s", [name])
            lease = tables.row(cursor.fetchone())
    if lease is None:
        return None, tables.current(cursor, name)
    if tables.history:
        kind, detail = acquired_event(lease)
        tables.insert_event(cursor, kind, lease, detail=detail)
    return lease, lease


def renew(tables: LeaseTables, lease: Lease, ttl: float) -> Lease | None:
    """Extend ``lease`` by ``ttl`` from the server's now if it is still held with its
    token and unexpired: the renewed lease, or None."""
    d = tables.dialect
    sql = (
        f"UPDATE {tables.leases} SET renewed_at = {d.now()}, expires_at = {d.expiry()} "
        f"WHERE name = %s AND holder = %s AND token = %s AND expires_at > {d.now()}"
    )
    params = [d.ttl_param(ttl), lease.name, lease.holder, lease.token]
    with tables.cursor(atomic=not d.returning) as cursor:
        return tables.update(cursor, sql, params, lease.name)


def release(tables: LeaseTables, lease: Lease) -> bool:
    """End ``lease``'s term now if it is still held with its token: True if it was."""
    sql = (
        f"UPDATE {tables.leases} SET previous_holder = holder, holder = '', "
        f"expires_at = {tables.dialect.now()} WHERE name = %s AND holder = %s AND token = %s"
    )
    params = [lease.name, lease.holder, lease.token]
    if tables.dialect.writes_in_one_statement and tables.dialect.notify:
        # One statement, committed on its own: the release, its history event, and
        # the wake-up of everyone racing for the name (see watch()), sent at commit.
        event = ""
        if tables.history:
            event = (
                f", event AS (INSERT INTO {tables.events} "
                "(name, kind, holder, token, previous_holder, at, detail, actor) "
                f"SELECT name, %s, %s, %s, '', {tables.dialect.now()}, '', '' FROM released)"
            )
            params += [str(EventKind.RELEASED), lease.holder, lease.token]
        with tables.cursor(atomic=False) as cursor:
            cursor.execute(
                f"WITH released AS ({sql} RETURNING name){event} "
                f"SELECT {tables.dialect.notify} FROM released",
                [*params, channel(tables.channel_prefix, lease.name)],
            )
            return len(cursor.fetchall()) == 1
    with tables.cursor(atomic=True) as cursor:
        cursor.execute(sql, params)
        released = cursor.rowcount == 1
        if released and tables.history:
            tables.insert_event(cursor, EventKind.RELEASED, lease)
    return released


def force_release(
    tables: LeaseTables, name: str, *, actor: str = "", detail: str = ""
) -> Lease | None:
    """Free ``name`` without cutting its term short (an operator's action): the lease
    as it was, or None if nobody held it."""
    # The term is not cut short: the holder hears of this at its next renewal, and until
    # the term ends nobody else may take the lease (it might still act on it).
    sql = (
        f"UPDATE {tables.leases} SET previous_holder = holder, holder = '' "
        "WHERE name = %s AND holder <> ''"
    )
    with tables.cursor(atomic=True) as cursor:
        row = tables.update(cursor, sql, [name], name)
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
        if tables.history:
            tables.insert_event(
                cursor, EventKind.FORCED_RELEASE, released, detail=detail, actor=actor
            )
    return released


def read(tables: LeaseTables, name: str) -> Lease | None:
    """The unexpired lease on ``name``, or None."""
    with tables.cursor(atomic=False) as cursor:
        return tables.current(cursor, name)


def read_many(tables: LeaseTables, names: Sequence[str], batch: int = 500) -> list[Lease | None]:
    """:func:`read` of each of ``names``, one statement per ``batch`` names."""
    with tables.cursor(atomic=False) as cursor:
        return [
            lease
            for start in range(0, len(names), batch)
            for lease in tables.current_of(cursor, names[start : start + batch])
        ]


def names(tables: LeaseTables) -> list[str]:
    """Every lease name with a row, sorted."""
    with tables.cursor(atomic=False) as cursor:
        cursor.execute(f"SELECT name FROM {tables.leases} ORDER BY name")
        return [row[0] for row in cursor.fetchall()]


def request_handover(
    tables: LeaseTables, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
) -> Lease | None:
    """Ask the holder of ``name`` to hand it to ``to`` within ``window`` seconds: the
    lease, or None if nobody holds it."""
    d = tables.dialect
    sql = (
        f"UPDATE {tables.leases} SET handover_to = %s, handover_until = {d.expiry()} "
        "WHERE name = %s"
    )
    with tables.cursor(atomic=True) as cursor:
        row = tables.update(cursor, sql, [to, d.ttl_param(window), name], name)
        if row is None:
            return None
        if tables.history:
            tables.insert_event(
                cursor, EventKind.HANDOVER, row, detail=detail or f"to {to}", actor=actor
            )
        cursor.execute(f"SELECT {d.read_now()}", [])
        now = aware(cursor.fetchone()[0])
    held = row.holder and row.expires_at is not None and now is not None
    return row if held and row.expires_at > now else None  # type: ignore[operator]


def acquired_event(lease: Lease) -> tuple[str, str]:
    """The history event of an acquisition: its kind and detail."""
    if lease.previous_holder:  # the previous holder's term had expired
        return EventKind.TAKEN_OVER, f"lease of {lease.previous_holder} had expired"
    return EventKind.ACQUIRED, ""
