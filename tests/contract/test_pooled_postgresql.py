"""PostgreSQL behind PgBouncer in transaction pooling (SPEC "Replicated and pooled
stores"): leases work, every call stays bounded, and LISTEN/NOTIFY falls back to polling
with a log line and a check.

A private PgBouncer (tests/support/pgbouncer.py) in front of the tests' PostgreSQL, with its
default of refusing unknown startup parameters: before this change the backend's private
connections, which send their timeouts as the ``options`` startup parameter, could not
connect through it at all ("unsupported startup parameter: options").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_leader import BackendUnavailable
from django_leader.backends.db.connection import _POOLED, pooled
from django_leader.checks import check_replication
from tests.support.pgbouncer import PgBouncer, unavailable
from tests.support.stores import allow_database, require_postgresql, stores_db
from tests.support.waiting import returns_within

pytestmark = [stores_db, pytest.mark.xdist_group("replicated"), pytest.mark.topology]

ALIAS = "pooled"
TTL = 3.0


@pytest.fixture
def bouncer(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgBouncer]:
    """A PgBouncer in front of the tests' PostgreSQL database, as database alias
    ``pooled`` (the same test database), and the lease settings on it."""
    require_postgresql(unavailable())
    direct = connections.settings["postgresql"]
    pooler = PgBouncer(direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432))
    pooler.start()
    name = connections["postgresql"].settings_dict["NAME"]  # the test database
    connections.settings[ALIAS] = {**direct, "PORT": str(pooler.port), "NAME": name,
                                   "TEST": {**direct.get("TEST", {}), "NAME": name}}  # fmt: skip
    allow_database(monkeypatch, ALIAS)
    _POOLED.pop(ALIAS, None)  # found out anew by this test's first connection
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.db.DatabaseBackend",
        "DATABASE": ALIAS,
        "LEASE_TTL": TTL,
        "RENEW_INTERVAL": 1.0,
        "RETRY_INTERVAL": 0.2,
    }
    try:
        yield pooler
    finally:
        connections[ALIAS].close()
        del connections.settings[ALIAS]
        if hasattr(connections._connections, ALIAS):
            delattr(connections._connections, ALIAS)
        pooler.stop()
        _POOLED.pop(ALIAS, None)


def backend() -> Any:
    from django_leader.backends.db import DatabaseBackend

    return DatabaseBackend(ALIAS)


def test_leases_work_through_a_transaction_pooler(
    bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """Acquire, renew, release and read through PgBouncer; the backend says once that a
    pooler is in the way, and watches fall back to polling (watch() gives None)."""
    store, name = backend(), f"pooled-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="django_leader"):
        lease, _ = store.acquire(name, "alice", TTL)
    assert lease is not None
    assert pooled(ALIAS) is True
    assert any("transaction pooler" in r.getMessage() for r in caplog.records)
    renewed = store.renew(lease, TTL)
    assert renewed is not None and renewed.token == lease.token
    assert store.read(name).holder == "alice"
    assert store.watch(name, lambda: None) is None  # no LISTEN: candidates poll
    assert store.release(renewed)
    again, _ = store.acquire(name, "bob", TTL)
    assert again is not None and again.token > lease.token
    ids = [str(m.id) for m in check_replication(databases=[ALIAS])]
    assert "django_leader.W023" in ids


def test_a_call_through_the_pooler_stays_bounded(bouncer: PgBouncer) -> None:
    """The store's timeouts cannot be session settings behind a transaction pooler: they
    are set in each call's transaction. A renewal that waits on a row another session
    locks gives up with BackendUnavailable instead of waiting for as long as the lock."""
    store, name = backend(), f"bounded-{uuid.uuid4().hex[:8]}"
    lease, _ = store.acquire(name, "alice", TTL)
    assert lease is not None
    import psycopg

    direct = connections.settings["postgresql"]
    blocker = psycopg.connect(
        host=direct["HOST"] or "127.0.0.1",
        port=int(direct["PORT"] or 5432),
        user=direct["USER"],
        dbname=str(connections["postgresql"].settings_dict["NAME"]),
    )
    try:
        blocker.execute("SELECT 1 FROM django_leader_lease WHERE name = %s FOR UPDATE", [name])
        answer = returns_within(lambda: store.renew(lease, TTL), 30.0, "the renewal")
        assert isinstance(answer, BackendUnavailable), answer
    finally:
        blocker.rollback()
        blocker.close()
