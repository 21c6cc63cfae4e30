"""The candidate registry of the database backend: ``LeaseCandidate`` rows, one per
candidate of a name, kept by heartbeats (announce) and expiring without them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...election import Candidate
from ...exceptions import BackendUnavailable
from .dialect import aware
from .tables import LeaseTables

logger = logging.getLogger("django_leader")


def announce(tables: LeaseTables, name: str, candidate: Candidate, ttl: float) -> None:
    """Join (or stay in) the candidates of ``name`` for ``ttl`` seconds."""
    d = tables.dialect
    now, table = d.now(), tables.candidates
    upsert = d.upsert(
        table,
        "name, identity, priority, host, pid, version, joined_at, seen_at, expires_at",
        f"%s, %s, %s, %s, %s, %s, {now}, {now}, {d.expiry()}",
        "name, identity",
        ["priority", "host", "pid", "version", "seen_at", "expires_at"],
    )
    # Three statements, each committed on its own: one transaction holding the locks
    # of the name's rows deadlocks against concurrent announcements on MySQL/MariaDB.
    with tables.cursor(atomic=False) as cursor:
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
        with tables.cursor(atomic=False) as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE name = %s AND expires_at <= {now}", [name])
    except BackendUnavailable as exc:
        logger.debug("dropping the expired candidates of %r failed: %s", name, exc)


def withdraw(tables: LeaseTables, name: str, identity: str) -> None:
    """Leave the candidates of ``name``."""
    with tables.cursor(atomic=False) as cursor:
        cursor.execute(
            f"DELETE FROM {tables.candidates} WHERE name = %s AND identity = %s",
            [name, identity],
        )


def candidates(tables: LeaseTables, name: str) -> list[Candidate] | None:
    """The live candidates of ``name``, in the order they joined."""
    return candidates_many(tables, [name])[0]


def candidates_many(
    tables: LeaseTables, names: Sequence[str], batch: int = 500
) -> list[list[Candidate] | None]:
    """The live candidates of each of ``names``, in the order they joined: one statement
    per ``batch`` names."""
    found: dict[str, list[Candidate]] = {name: [] for name in names}
    with tables.cursor(atomic=False) as cursor:
        for start in range(0, len(names), batch):
            among, params = tables.dialect.among(names[start : start + batch])
            cursor.execute(
                "SELECT name, identity, priority, host, pid, version, id, "
                f"{tables.timed('joined_at')}, {tables.timed('seen_at')}, "
                f"{tables.timed('expires_at')} FROM {tables.candidates} "
                f"WHERE name {among} AND expires_at > {tables.dialect.now()} ORDER BY id",
                params,
            )
            for (
                name,
                identity,
                priority,
                host,
                pid,
                version,
                seq,
                joined,
                seen,
                expires,
            ) in cursor.fetchall():
                found[name].append(
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
                )
    return [found[name] for name in names]
