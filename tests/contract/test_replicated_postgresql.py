"""PostgreSQL with a streaming standby promoted after the primary is killed (SPEC rule 9):
a failover never gives two leaders nor repeats a token.

Each test starts its own primary and standby (tests/support/pg_topology.py) and reaches
them as a project does: libpq multi-host with ``target_session_attrs=read-write``, so the
backend's connections follow the promoted standby. The worst case: the standby stops
hearing from the primary just before an acquisition, the primary dies, the standby is
promoted without that acquisition.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_leader import BackendUnavailable
from django_leader.checks import check_replication
from tests.support.pg_topology import PgTopology, unavailable
from tests.support.stores import (
    allow_database,
    answered,
    require_postgresql,
    stores_db,
)
from tests.support.waiting import returns_within, wait_until

pytestmark = [stores_db, pytest.mark.xdist_group("replicated"), pytest.mark.topology]

TTL = 3.0
WAIT = 60.0
ALIAS = "replicated"


@pytest.fixture(params=["async", "sync"])
def replicated(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PgTopology]:
    """A primary and a standby, the database alias ``replicated`` on them (migrated), and
    the lease settings on that alias."""
    require_postgresql(unavailable())
    topology = PgTopology(tmp_path, synchronous=request.param == "sync")
    try:
        topology.start()
        connections.settings[ALIAS] = topology.settings(connections.settings["postgresql"])
        allow_database(monkeypatch, ALIAS)
        migrate(topology)
        settings.DJANGO_LEADER = {
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DATABASE": ALIAS,
            "LEASE_TTL": TTL,
            "RENEW_INTERVAL": 1.0,
            "RETRY_INTERVAL": 0.2,
        }
        yield topology
    finally:
        if ALIAS in connections.settings:
            connections[ALIAS].close()
            del connections.settings[ALIAS]
            if hasattr(connections._connections, ALIAS):
                delattr(connections._connections, ALIAS)
        topology.stop()


def migrate(topology: PgTopology) -> None:
    """``manage.py migrate django_leader`` on the primary, in a process of its own (this
    test's Django refuses connections to databases it did not set up)."""
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{topology.primary.port}/{topology.database}",
        "DJANGO_LEADER_EXTRA_DATABASES": "0",
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "django_leader", "--verbosity", "0"],
        cwd=Path(__file__).resolve().parents[2], env=env, check=True, timeout=120,
    )  # fmt: skip


def backend() -> Any:
    from django_leader.backends.db import DatabaseBackend

    return DatabaseBackend(ALIAS)


@pytest.mark.parametrize("replicated", ["async"], indirect=True)
def test_a_promoted_standby_that_missed_an_acquisition_repeats_no_token(
    replicated: PgTopology,
) -> None:
    """alice takes the lease (replicated); the WAL sender freezes; alice releases and bob
    takes it with the next token (neither reaches the standby); the primary is killed and
    the standby promoted, still showing alice's lease. Nobody may take the lease before
    bob's belief has ended, and the token must be greater than bob's: before the fix the
    standby gave bob's token again as soon as alice's copy expired."""
    store, name = backend(), f"promoted-{uuid.uuid4().hex[:8]}"
    alice, _ = store.acquire(name, "alice", 1.0)
    assert alice is not None
    replicated.await_streaming()
    time.sleep(0.5)  # the standby has replayed alice's acquisition
    replicated.stall_replication()
    assert store.release(alice)
    sent = time.monotonic()
    bob, _ = store.acquire(name, "bob", TTL)
    assert bob is not None and bob.token > alice.token
    bob_believes_until = sent + TTL

    replicated.kill_primary()
    replicated.promote()

    def carol() -> Any:
        lease, _ = answered(store.acquire, name, "carol", TTL, timeout=WAIT)
        return lease

    taken = wait_until(carol, timeout=WAIT, message="carol never got the lease")
    assert time.monotonic() >= bob_believes_until, "carol led while bob still believed he did"
    assert taken.token > bob.token, (taken.token, bob.token)


@pytest.mark.parametrize("replicated", ["async"], indirect=True)
def test_a_new_name_on_a_promoted_standby_waits_and_continues_above_every_token(
    replicated: PgTopology,
) -> None:
    """A name whose row the standby never saw (made on the primary after replication
    stalled): after the promotion it is not created for anyone before the lock-delay, and
    its first token is above any the old primary could have issued."""
    store = backend()
    warm, _ = store.acquire(f"warm-{uuid.uuid4().hex[:8]}", "alice", TTL)  # records the server
    assert warm is not None
    replicated.await_streaming()
    time.sleep(0.5)
    replicated.stall_replication()
    name = f"unseen-{uuid.uuid4().hex[:8]}"
    sent = time.monotonic()
    bob, _ = store.acquire(name, "bob", TTL)
    assert bob is not None
    replicated.kill_primary()
    replicated.promote()
    taken = wait_until(
        lambda: answered(store.acquire, name, "carol", TTL, timeout=WAIT)[0], timeout=WAIT
    )
    assert time.monotonic() >= sent + TTL
    assert taken.token > bob.token


@pytest.mark.parametrize("replicated", ["sync"], indirect=True)
def test_a_commit_the_synchronous_standby_does_not_confirm_does_not_count(
    replicated: PgTopology,
) -> None:
    """PostgreSQL's statement_timeout stops short of the commit: a commit that waits for a
    synchronous standby that hears nothing waited for ever (the renewal hung, against rule
    6). Now the backend cancels it from the client at its bound; PostgreSQL then commits
    locally and warns, and the backend reports the write as not counting."""
    store, name = backend(), f"sync-{uuid.uuid4().hex[:8]}"
    lease, _ = store.acquire(name, "alice", TTL)
    assert lease is not None
    replicated.stall_replication()
    answer = returns_within(lambda: store.renew(lease, TTL), WAIT, "the renewal")
    assert isinstance(answer, BackendUnavailable), answer
    assert "synchronous standby did not confirm" in str(answer)


@pytest.mark.parametrize("replicated", ["sync"], indirect=True)
def test_a_fenced_commit_the_synchronous_standby_does_not_confirm_is_reported(
    replicated: PgTopology,
) -> None:
    """No server-side bound ends a COMMIT's wait for a synchronous standby: the fenced
    commit waited for ever, the lease row locked (found while looking into the first
    postgresql-sync chaos run). Now the wait is cancelled from the client once the lease is
    over; PostgreSQL then commits on the primary alone and only warns, and fenced() raises
    BackendUnavailable saying so instead of returning as if the write were durable."""
    from django.db import connections as django_connections

    from django_leader import lock

    store, name = backend(), f"fenced-{uuid.uuid4().hex[:8]}"
    with django_connections[ALIAS].cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS fenced_probe (note text)")

    def write() -> str:
        with lock(name, ttl=TTL, backend=store) as lease:
            replicated.stall_replication()
            with lease.fenced(), django_connections[ALIAS].cursor() as cursor:
                cursor.execute("INSERT INTO fenced_probe VALUES ('alice')")
        return "committed"

    answer = returns_within(write, WAIT, "the fenced commit")
    assert isinstance(answer, BackendUnavailable), answer
    assert "committed on the primary alone" in str(answer)
    django_connections[ALIAS].close()


def test_check_says_whether_commits_wait_for_the_standby(replicated: PgTopology) -> None:
    """W022 where the lease database streams to a standby and commits do not wait for it;
    nothing where they do."""
    ids = [str(m.id) for m in check_replication(databases=[ALIAS])]
    assert ids == ([] if replicated.synchronous else ["django_leader.W022"])
