"""Leader election between real OS processes, on every store: each database, Redis
through both cache clients (Django's RedisCache, django-redis), and ZooKeeper.

Each child (``tests/procs/``) is a separate Python process that sets Django up on the very
test databases this test uses, works through ``DatabaseBackend(alias)``,
``CacheBackend(cache_alias)`` or ``ZooKeeperBackend`` and reports what it does as JSON lines
on stdout, stamped with wall-clock time. The parent starts, pauses and kills the children
with signals and checks their reports against each other and against the store. Every
timing assertion is a safety bound from the safety model (docs/safety.md), not a benchmark.

On Redis and ZooKeeper, history is written to the database asynchronously, by a thread of
the process that noticed the event: a child flushes it before the parent reads it. Both seed
a name's first fencing token from their clock, so only token order (and +1 steps) is
asserted there, and ``fenced()`` checks the token against the name's fence row in the
database the children write to (docs/safety.md).

On ZooKeeper, a SIGKILLed holder's lease goes when its ttl runs out (expiry is the lease
znode's mtime + ttl by the ensemble's clock), not only when its session ends, so the
takeover bound is the same as elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_leader.backends.base import Backend
from testproject.demoapp.models import FencedWrite
from tests.support.cluster import (
    PATIENCE,
    RETRY,
    STARTUP,
    STORES,
    TTL,
    Cluster,
    Event,
    assert_no_overlap,
    leader_among,
    matches,
    open_cluster,
    open_store,
    report,
    wait_renewals,
)
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

#: Liveness (docs/safety.md): a crashed holder's lease is taken within TTL + RETRY_INTERVAL
#: (plus 1 s for the new leader to report it on a loaded machine).
TAKEOVER_BOUND = TTL + RETRY + 1.0


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The parent's own view of the store (the children build the same backend)."""
    yield from open_store(request.param)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


def assert_fenced_write(cluster: Cluster, reply: Event, committed: bool) -> None:
    """A fenced write's outcome, as expected: ``committed`` or refused."""
    outcome = reply["outcome"]
    if committed:
        assert outcome == "committed", reply
    else:
        assert outcome.startswith("rejected"), reply


# -- 1. a race --------------------------------------------------------------------------
def test_processes_racing_for_a_free_lease_exactly_one_wins(
    cluster: Cluster, store: Backend
) -> None:
    """Four processes call ``acquire`` at the same instant, three times over: on a name
    never used (the INSERT path), on a released lease and on an expired one (the UPDATE
    path). Each time exactly one wins, the others are told who did, and the store and its
    history agree. (On Redis the "INSERT" and "UPDATE" paths are a missing key, a deleted
    key and an expired key.)"""
    racers = [cluster.spawn(f"racer{i}", "racer") for i in range(4)]
    for racer in racers:
        cluster.wait_for(matches("ready", racer.label), f"{racer.label} ready", STARTUP)

    names = {kind: f"{cluster.lease}-{kind}" for kind in ("fresh", "released", "expired")}
    released, _ = store.acquire(names["released"], "parent", 30)
    assert released is not None and store.release(released)
    expired, _ = store.acquire(names["expired"], "parent", 0.05)
    assert expired is not None
    wait_until(
        lambda: store.read(names["expired"]) is None,
        timeout=PATIENCE,
        message="the short lease never expired",
    )
    previous_token = {"fresh": 0, "released": released.token, "expired": expired.token}

    for kind, name in names.items():
        after = cluster.position()
        start_at = time.time() + 1.0
        for racer in racers:
            racer.send("race", name=name, at=start_at, ttl=30.0)
        results = [
            cluster.wait_for(
                matches("raced", racer.label, name=name),
                f"{racer.label}'s attempt on {kind}",
                PATIENCE,
                after=after,
            )
            for racer in racers
        ]
        detail = f"{kind}: {json.dumps(results, indent=1)}"
        starts = [result["started"] for result in results]
        assert max(starts) - min(starts) < 0.5, f"the racers did not start together: {detail}"
        assert not [r for r in results if r.get("error")], f"an attempt failed: {detail}"
        assert all(result["history_flushed"] for result in results), detail
        winners = [result for result in results if result["won"]]
        assert len(winners) == 1, f"{len(winners)} winners: {detail}"
        won = winners[0]["acquired"]
        if kind == "fresh" and cluster.clock_tokens:
            # Redis and ZooKeeper seed a name's first token from their clock: not 1.
            assert won["token"] > previous_token[kind], detail
        else:
            assert won["token"] == previous_token[kind] + 1, detail
        for loser in results:
            if not loser["won"]:
                assert loser["current"] is not None, detail
                assert (loser["current"]["holder"], loser["current"]["token"]) == (
                    won["holder"],
                    won["token"],
                ), detail
        current = store.read(name)
        assert current is not None
        assert (current.holder, current.token) == (won["holder"], won["token"])
        # The racers flushed their history before reporting; the parent's rows are left out.
        history = [event for event in cluster.history(name) if event[1] != "parent"]
        expected_kind = "taken_over" if kind == "expired" else "acquired"
        assert history == [(expected_kind, won["holder"], won["token"])], detail


# -- 2. a crash ------------------------------------------------------------------------
def test_killed_leader_is_replaced_within_ttl_plus_retry(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """Three Elector processes: one leads, the others follow. SIGKILL the leader: a
    follower is elected within TTL + RETRY_INTERVAL (+1 s) of the kill, with a greater
    token, and at no instant did two processes believe they led."""
    children = cluster.candidates("a", "b", "c")
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    # Let the leader renew twice while the followers keep trying: it keeps the lease.
    wait_renewals(cluster, first["who"], first["token"], 2)
    leader = leader_among(cluster, children, store)
    assert leader.label == first["who"]
    for child in children:
        if child is not leader:
            cluster.wait_for(
                matches("new_leader", child.label, token=first["token"]),
                f"{child.label} seeing the leader",
            )

    after = cluster.position()
    killed_at = time.time()
    leader.kill()
    second = cluster.wait_for(
        matches("elected"), "a new leader", TAKEOVER_BOUND + PATIENCE, after=after
    )
    takeover = second["t"] - killed_at
    report(request, takeover=takeover)
    assert second["who"] != leader.label
    assert takeover <= TAKEOVER_BOUND, f"took {takeover:.2f}s\n{cluster.describe()}"
    assert second["token"] > first["token"]
    assert second["previous_holder"] == first["holder"]
    # The new leader keeps the lease; the other survivor follows it.
    survivors = [child for child in children if child is not leader]
    wait_renewals(cluster, second["who"], second["token"], 2)
    assert leader_among(cluster, survivors, store).label == second["who"]
    assert len(cluster.select(matches("elected"))) == 2, cluster.describe()
    assert_no_overlap(cluster, killed={leader.label: killed_at})


# -- 3. a pause ------------------------------------------------------------------------
def test_paused_leader_steps_down_before_takeover_and_is_fenced(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """SIGSTOP the leader for TTL + 1.5 s. A follower takes over; the old leader's local
    deadline (its step-down instant) lies before the new lease was granted, it reports
    the loss as soon as it resumes, and its old lease can neither write through
    ``fenced()`` (refused locally, and by the database for a copy that does not know it
    lost: the lease row, or on Redis the fence row its successor's write raised) nor be
    renewed or released in the store."""
    cluster.candidates("a", "b")
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    new_label = "b" if old.label == "a" else "a"
    # While it leads, its fenced writes commit.
    wrote = old.request("write", "wrote", note="before-pause")
    assert wrote["token"] == first["token"], wrote
    assert_fenced_write(cluster, wrote, committed=True)

    after = old.send("freeze")
    freezing = cluster.wait_for(matches("freezing", old.label), "the leader pausing", after=after)
    wait_until(
        lambda: old.state() == "T",
        timeout=PATIENCE,
        interval=0.005,
        message=lambda: f"{old.label} never stopped: {old.state()}",
    )
    paused_at = freezing["t"]

    second = cluster.wait_for(
        matches("elected", new_label), "a takeover", TAKEOVER_BOUND + PATIENCE, after=after
    )
    assert second["token"] > first["token"]
    assert new_label != old.label
    new = cluster.children[new_label]
    wrote = new.request("write", "wrote", note="after-takeover")
    assert wrote["token"] == second["token"], wrote
    assert_fenced_write(cluster, wrote, committed=True)
    # Pause longer than a TTL, then resume (a fixed sleep: the pause is the fault tested).
    time.sleep(max(0.0, paused_at + TTL + 1.5 - time.time()))
    assert old.state() == "T"
    resumed_at = time.time()
    os.kill(old.pid, signal.SIGCONT)

    lost = cluster.wait_for(
        matches("lost", old.label, token=first["token"]),
        "the old leader reporting the loss",
        PATIENCE,
        after=after,
    )
    resumed = cluster.wait_for(
        matches("resumed", old.label), "the old leader resuming", after=after
    )
    report(
        request,
        pause=resumed_at - paused_at,
        takeover=second["t"] - paused_at,
        lost_after_resume=lost["t"] - resumed_at,
        deadline_before_takeover=second["acquired_at"] - lost["deadline_wall"],
    )
    print(f"sampled on resume before the renewer marked it lost: {not resumed['lost']}")
    assert "deadline" in lost["reason"], lost
    # The step-down instant precedes the moment the store gave the lease away, and the
    # new leader's own report of it.
    assert lost["deadline_wall"] < second["acquired_at"] <= second["t"], (lost, second)
    assert lost["deadline_wall"] < resumed_at
    # Sampled the moment it resumed, is_leader was already false (from the deadline alone,
    # before the renewer ran: see lost).
    assert resumed["stopped_for"] > TTL, resumed  # sampled after the pause, not before
    assert resumed["is_leader"] is False and resumed["held"] is False, cluster.describe()
    woke = cluster.wait_for(
        lambda e: matches("state", old.label)(e) and e["gap"] is not None,
        "is_leader sampled after the resume",
        after=after,
    )
    assert woke["t"] >= resumed_at and woke["leader"] is False, woke
    assert not cluster.select(
        lambda e: matches("state", old.label, leader=True)(e) and e["t"] >= resumed_at
    ), cluster.describe()
    cluster.wait_for(matches("work_done", old.label, token=first["token"]), "work returning")

    probe = old.request("probe", "probe", token=first["token"])
    assert probe["is_leader"] is False and probe["held"] is False and probe["lost"], probe
    assert_fenced_write(cluster, {"outcome": probe["local_fence"], "probe": probe}, False)
    assert_fenced_write(cluster, {"outcome": probe["db_fence"], "probe": probe}, False)
    # Refused by the lease row's check, or on Redis and ZooKeeper by the fence row's.
    refused = "fenced off" if cluster.kind != "database" else "no longer held"
    assert refused in probe["db_fence"], probe
    assert probe["renewed"] is False, probe
    assert probe["released"] is False, probe

    current = store.read(cluster.lease)
    assert current is not None and (current.holder, current.token) == (
        second["holder"],
        second["token"],
    )
    rows = FencedWrite.objects.using(cluster.db_alias)
    old_ids = list(rows.filter(token=first["token"]).values_list("id", "note"))
    new_ids = list(rows.filter(token=second["token"]).values_list("id", "note"))
    assert [note for _, note in old_ids] == ["before-pause"], old_ids
    assert [note for _, note in new_ids] == ["after-takeover"], new_ids
    assert max(i for i, _ in old_ids) < min(i for i, _ in new_ids)
    assert_no_overlap(cluster)


# -- 4. a graceful stop ----------------------------------------------------------------
def test_stopped_leader_releases_and_follower_takes_over_at_once(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """SIGTERM makes the leader call ``elector.stop()``: it releases the lease and a
    follower is elected well before the old lease would have expired."""
    cluster.candidates("a", "b")
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    renewal = wait_renewals(cluster, old.label, first["token"], 1)

    after = cluster.position()
    terminated_at = time.time()
    old.proc.send_signal(signal.SIGTERM)
    second = cluster.wait_for(matches("elected"), "a takeover", PATIENCE, after=after)
    stopped = cluster.wait_for(
        matches("stopped", old.label), "the old leader stopping", after=after
    )
    assert old.proc.wait(timeout=PATIENCE) == 0
    takeover = second["t"] - terminated_at
    report(request, takeover=takeover, after_release=second["t"] - stopped["t"])
    assert second["who"] != old.label and second["token"] > first["token"]
    assert takeover < TTL, f"took {takeover:.2f}s\n{cluster.describe()}"
    # Only a release can explain this: the old lease was still unexpired on the server.
    assert second["acquired_at"] < renewal["expires_at"], (second, renewal)
    # The old leader wrote its history before it exited; the new one writes it now.
    assert stopped["history_flushed"] is True, stopped
    history = cluster.history(cluster.lease, cluster.children[second["who"]])
    assert history == [
        ("acquired", first["holder"], first["token"]),
        ("released", first["holder"], first["token"]),
        ("acquired", second["holder"], second["token"]),
    ], history
    current = store.read(cluster.lease)
    assert current is not None and current.token == second["token"]
    assert_no_overlap(cluster)
