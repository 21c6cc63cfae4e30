"""A real Redis that forgets: a private ``redis-server`` is killed and started again on the
same port (without persistence, or from an older snapshot), or flushed, so the store
forgets leases and token counters. Tokens must never repeat (SPEC rule 3) and nobody may
take a lease while an earlier holder could still believe it leads (rule 7: the lock-delay).

The shared Redis of the other tests is left alone: restarting it would pull the leases and
the Celery broker from under anything else using it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leader import BackendUnavailable, Elector
from tests.support.redis_server import RedisServer
from tests.support.stores import answered, history, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

CLIENTS = {
    "redis": "django.core.cache.backends.redis.RedisCache",
    "django_redis": "django_redis.cache.RedisCache",
}
WAIT = 15.0
TTL = 2.0
#: A ttl (so a lock-delay) longer than a private server has been up when a test acquires.
NEW_STORE_TTL = 120.0


def acquire_when_allowed(backend: Any, name: str, holder: str, ttl: float = TTL) -> Any:
    """Acquire ``name`` as soon as the store lets anyone (after its lock-delay)."""

    def taken() -> Any:
        acquired, current = answered(backend.acquire, name, holder, ttl, timeout=WAIT)
        assert acquired is not None or current is None, f"{name} unexpectedly held by {current}"
        return acquired

    return wait_until(taken, timeout=WAIT, message=f"{name} was never free to take")


@pytest.fixture(params=list(CLIENTS))
def restartable(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Any
) -> Iterator[tuple[RedisServer, Any]]:
    """A private Redis server and a CacheBackend on it (through each cache client)."""
    pytest.importorskip("redis")
    if request.param == "django_redis":
        pytest.importorskip("django_redis")
    server = RedisServer(tmp_path)
    server.start()
    caches = {
        **settings.CACHES,
        "restartable": {
            "BACKEND": CLIENTS[request.param],
            "LOCATION": f"redis://127.0.0.1:{server.port}/0",
        },
    }
    conf = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.cache.CacheBackend",
        "CACHE": "restartable",
        "LOCK_DELAY": 0,  # the lock-delay is then the acquirer's own ttl
    }
    with override_settings(CACHES=caches, DJANGO_LEADER=conf):
        from django_leader.backends.cache import CacheBackend

        backend = CacheBackend("restartable")
        try:
            yield server, backend
        finally:
            backend.flush_history(10)
            server.stop()


def test_token_grows_across_a_real_restart(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    server, backend = restartable
    first = acquire_when_allowed(backend, lease_name, "alice")  # a new Redis waits too

    server.crash()
    with pytest.raises(BackendUnavailable):
        backend.renew(first, TTL)  # Redis is down: a clear error, bounded in time
    server.start()

    assert answered(backend.read, lease_name, timeout=WAIT) is None  # Redis forgot it
    assert answered(backend.renew, first, TTL, timeout=WAIT) is None  # so the renewal fails
    second = acquire_when_allowed(backend, lease_name, "bob")
    assert second.token > first.token
    assert backend.release(first) is False  # a late release of the old term changes nothing
    assert backend.read(lease_name).holder == "bob"
    kinds = [(event[0], event[1], event[3]) for event in history(backend, lease_name)]
    assert kinds == [("acquired", "alice", first.token), ("acquired", "bob", second.token)]


def test_elector_steps_down_and_a_new_term_has_a_greater_token(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    server, backend = restartable
    timing: dict[str, Any] = {"ttl": 2.0, "renew_interval": 0.5, "retry_interval": 0.2}
    leader = Elector(lease_name, identity="before", backend=backend, **timing)
    leader.start()
    try:
        assert leader.wait_for_leadership(WAIT)
        lease = leader.lease
        assert lease is not None
        server.crash()
        # Unreachable store: the leader steps down at its local deadline, at the latest.
        assert lease.lost.wait(timing["ttl"] + 1.0)
        assert not leader.is_leader
        server.start()
        # It campaigns on and wins a new term, whose token is greater than the one the
        # restarted Redis forgot.
        assert leader.wait_for_leadership(WAIT)
        assert leader.lease is not None and leader.lease.token > lease.token
    finally:
        leader.stop(timeout=WAIT)


def holder_belief_ends(sent: float, ttl: float = TTL) -> float:
    """The latest local deadline (``clock()``) of a holder whose acquisition was sent at
    ``sent``: it stops believing it leads then at the latest (SPEC rule 2)."""
    return sent + ttl


def test_restore_from_an_older_snapshot_never_repeats_a_token(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    """Issue 10, defect 1: SAVE, more acquisitions, then a restart from that snapshot
    used to hand out a token it had already given."""
    server, backend = restartable
    tokens = []
    first = acquire_when_allowed(backend, lease_name, "alice")
    tokens.append(first.token)
    assert backend.release(first)
    backend.client.save()
    shutil.copy(server.workdir / "dump.rdb", server.workdir / "older.rdb")
    for holder in ("bob", "carol"):
        lease, _ = backend.acquire(lease_name, holder, TTL)
        assert lease is not None
        tokens.append(lease.token)
        assert backend.release(lease)

    server.crash()
    server.start(dbfilename="older.rdb")
    restored = answered(backend.client.hget, backend.keys(lease_name)[1], "token", timeout=WAIT)
    assert int(restored) == tokens[0]  # the snapshot really is the older state

    after = acquire_when_allowed(backend, lease_name, "dave")
    assert after.token > max(tokens), (after.token, tokens)


def test_flushdb_makes_everyone_wait_out_the_holder(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    """Issue 10, defect 2: after FLUSHDB a follower acquired at once while the holder
    still believed it led. Now nobody may take any lease until it cannot."""
    from django_leader.lease import clock

    _server, backend = restartable
    acquire_when_allowed(backend, f"{lease_name}-warm-up", "alice")  # past a new store's delay
    sent = clock()
    held, _ = backend.acquire(lease_name, "alice", TTL)
    assert held is not None
    other = f"{lease_name}-other"  # a name nobody held: the store cannot know that either
    backend.client.flushdb()

    taken = acquire_when_allowed(backend, lease_name, "bob")
    assert clock() >= holder_belief_ends(sent) - held_margin()
    assert taken.token > held.token
    assert backend.renew(held, TTL) is None
    assert acquire_when_allowed(backend, other, "carol") is not None


def held_margin() -> float:
    """The holder's safety margin (its deadline is ``sent + ttl - margin``)."""
    from django_leader.conf import resolve_timing

    return resolve_timing(TTL).safety_margin


@pytest.mark.parametrize("fault", ["restart", "flush"])
def test_no_two_electors_lead_when_redis_forgets(
    restartable: tuple[RedisServer, Any], lease_name: str, fault: str
) -> None:
    """A leader and a follower; Redis forgets the lease. Whoever is elected next (the old
    leader campaigns again too), it is after the old leader's local deadline, with a
    greater token."""
    from django_leader.lease import clock

    server, backend = restartable
    acquire_when_allowed(backend, f"{lease_name}-warm-up", "warm-up")  # past a new store's delay
    timing: dict[str, Any] = {"ttl": TTL, "renew_interval": 0.5, "retry_interval": 0.1}
    elections: list[tuple[float, str, int]] = []
    elected = threading.Event()

    def on_elected(lease: Any) -> None:
        elections.append((clock(), lease.holder, lease.token))
        elected.set()

    electors = [
        Elector(lease_name, identity=who, backend=backend, on_elected=on_elected, **timing)
        for who in ("first", "second")
    ]
    for elector in electors:
        elector.start()
    try:
        assert elected.wait(WAIT)
        leading = next(e for e in electors if e.wait_for_leadership(0.5))
        lease = leading.lease
        assert lease is not None and lease.deadline is not None
        before = len(elections)
        if fault == "restart":
            server.crash()
            server.start()
        else:
            backend.client.flushdb()
        wait_until(
            lambda: len(elections) > before, timeout=WAIT, message="nobody was elected again"
        )
        at, holder, token = elections[before]
        assert lease.lost.is_set()
        # Whatever the old leader heard, it had stopped believing by its deadline, which
        # had passed before anyone was let in again.
        assert at >= lease.deadline, (at, lease.deadline, holder)
        assert token > lease.token
    finally:
        for elector in electors:
            elector.stop(timeout=WAIT)


def test_a_redis_marked_new_by_leader_init_is_used_at_once_and_a_flushed_one_still_waits(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    """Issue 28, item 3: the first lock on a Redis never used for leases waited out the
    whole lock-delay. Without the marker it cannot tell new from forgotten; ``leader init``
    says it is new. A flush afterwards is still a loss."""
    from io import StringIO

    from django.core.management import call_command

    _server, backend = restartable
    out = StringIO()
    call_command("leader", "init", stdout=out)
    assert out.getvalue().strip() == "wrote the store marker: the first lock will not wait"
    # A server started just now, and a lock-delay longer than it has been up: only the
    # marker lets this acquisition through.
    held, _ = backend.acquire(lease_name, "alice", NEW_STORE_TTL)
    assert held is not None
    assert backend.release(held)
    out = StringIO()
    call_command("leader", "init", stdout=out)
    assert out.getvalue().strip() == "the store marker was there already: nothing to do"

    backend.client.flushdb()
    assert backend.acquire(lease_name, "bob", TTL) == (None, None)  # the lock-delay
    assert acquire_when_allowed(backend, lease_name, "bob").token > held.token


def test_the_first_migrate_marks_a_new_redis_and_a_later_one_does_not(
    restartable: tuple[RedisServer, Any], lease_name: str, tmp_path: Path
) -> None:
    """Issue 28, item 3: ``migrate`` creating django-leader's tables is a new deployment,
    so it marks the store as new; a later ``migrate`` (every deploy runs one) must not,
    or it would hide a loss."""
    import os
    import sys

    server, backend = restartable
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DJANGO_LEADER_SQLITE": str(tmp_path / "new.sqlite3"),
        "DJANGO_LEADER_EXTRA_DATABASES": "0",
        "REDIS_URL": f"redis://127.0.0.1:{server.port}/0",
        "DJANGO_LEADER_REDIS_PREFIX": "",  # the fixture's cache has no prefix either
        "DJANGO_LEADER_BACKEND": "django_leader.backends.redis.RedisBackend",
        "DJANGO_LEADER_CACHE": "redis",
    }
    env.pop("DATABASE_URL", None)

    def migrate() -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=Path(__file__).resolve().parents[2], env=env, check=True, timeout=120,
        )  # fmt: skip

    migrate()
    held, _ = backend.acquire(lease_name, "alice", NEW_STORE_TTL)
    assert held is not None  # at once, on a server started just now
    assert backend.release(held)
    backend.client.flushdb()
    migrate()  # the tables are there: nothing to mark
    assert backend.acquire(lease_name, "bob", TTL) == (None, None)
