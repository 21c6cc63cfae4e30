"""The async API between real OS processes (issue 16): children run an asyncio program
(``tests/procs/async_holder.py``) that holds ``alock()`` or runs an ``AsyncElector``, on
SQLite, PostgreSQL, Redis and ZooKeeper (MariaDB and django-redis run the async conformance
tests, tests/contract/test_async_conformance.py; here they would only add minutes).

- Several processes, several tasks each, contend for one ``alock()``: the holders' records in
  one shared append-only file never interleave, and the tokens grow with each entry.
- The holder's event loop is blocked by a long synchronous call: renewals go on (the lease
  stays held, not lost); then, still blocked, it is SIGSTOPped past its TTL and the parent
  takes the lease over and writes. After SIGCONT the holder's monitor thread sees the lease
  lost while the loop is still blocked; once the loop runs, its first look says not held,
  and its fenced writes (its lease, and a copy that does not know it lost) are refused.
- The ``AsyncElector`` leader is SIGKILLed: the other process is elected within
  TTL + RETRY_INTERVAL (+ a generous 2 s).
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
from django_leader.conf import resolve_timing
from django_leader.term import acquire_once
from testproject.demoapp.models import FencedWrite
from tests.support.cluster import (
    PATIENCE,
    RENEW,
    RETRY,
    STARTUP,
    TTL,
    Child,
    Cluster,
    assert_no_overlap,
    matches,
    open_cluster,
    open_store,
    report,
)
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

#: The stores of these tests (see the module's docstring).
ASYNC_STORES = ["sqlite", "postgresql", "redis", "zookeeper"]

#: Liveness: a killed leader's lease is taken within TTL + RETRY_INTERVAL, plus a generous
#: 2 s for the new leader's loop to report it on a loaded machine.
TAKEOVER_BOUND = TTL + RETRY + 2.0


@pytest.fixture(params=ASYNC_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The parent's own view of the store (the children build the same backend)."""
    yield from open_store(request.param)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


def spawn(cluster: Cluster, label: str, mode: str, **extra: str) -> Child:
    """An async_holder child in ``mode``, with the cluster's timing."""
    timing = {
        "DL_MP_TTL": str(TTL),
        "DL_MP_RENEW": str(RENEW),
        "DL_MP_RETRY": str(RETRY),
        # The same timing in the settings (they bound each store call of the backend).
        "DJANGO_LEADER_TTL": str(TTL),
        "DJANGO_LEADER_RENEW": str(RENEW),
        "DJANGO_LEADER_RETRY": str(RETRY),
    }
    return cluster.spawn(label, "async_holder", DL_ASYNC_MODE=mode, **timing, **extra)


def fence_using(cluster: Cluster) -> str | None:
    """``fenced(using=...)``: a database store fences with its lease row, the others with
    the fence row in the database the rows go to."""
    return None if cluster.kind == "database" else cluster.db_alias


# -- (a) processes and tasks contend for one alock() -------------------------------------------
def test_tasks_of_several_processes_never_hold_one_alock_at_once(
    cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    processes, tasks, seconds = 3, 3, 4.0
    log = tmp_path / "holders.jsonl"
    children = [
        spawn(cluster, f"p{i}", "contend", DL_ASYNC_TASKS=str(tasks), DL_ASYNC_LOG=str(log))
        for i in range(processes)
    ]
    cluster.wait_ready(children)
    after = cluster.position()
    at = time.time() + 1.0
    for child in children:
        child.send("go", at=at, seconds=seconds)
    done = [
        cluster.wait_for(
            matches("done", child.label), f"{child.label} done", seconds + 60, after=after
        )
        for child in children
    ]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    detail = f"{json.dumps(done, indent=1)}\nlast records: {records[-6:]}"
    assert all(not reply["errors"] for reply in done), detail
    entries = sum(reply["entries"] for reply in done)
    request.node.user_properties.append(("entries", entries))
    print(f"{request.node.name}: {entries} holds")
    assert len(records) == 2 * entries, detail
    # In the file's order (the order of the writes): enter, exit of the same hold, enter...
    # Each record is written while its writer holds the lease, so two holds that overlapped
    # would show two enters in a row.
    for i in range(0, len(records), 2):
        enter, leave = records[i], records[i + 1]
        assert enter["ev"] == "enter" and leave["ev"] == "exit", (i, records[i : i + 4])
        key = ("pid", "task", "token")
        assert [enter[k] for k in key] == [leave[k] for k in key], (i, records[i : i + 4])
        assert enter["held"] and leave["held"], (i, enter, leave)  # never lost while inside
        assert enter["clock"] <= leave["clock"]
        if i:
            assert records[i - 1]["clock"] <= enter["clock"], (i, records[i - 2 : i + 2])
    tokens = [record["token"] for record in records[::2]]
    assert tokens == sorted(set(tokens)), "fencing tokens did not grow with each entry"
    # Every process took part (and got the lock at least once).
    assert len({record["pid"] for record in records}) == processes, detail


# -- (b) the loop blocked, then SIGSTOP past the TTL -------------------------------------------
def test_blocked_loop_keeps_renewing_and_steps_down_when_stopped_past_the_ttl(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    holder = spawn(cluster, "holder", "hold")
    acquired = cluster.wait_for(matches("acquired", "holder"), "the holder's lease", STARTUP)
    token = acquired["token"]
    before = cluster.wait_for(matches("wrote", "holder", note="before"), "the first write")
    assert before["fenced"] == "committed", before

    # 1. The loop is blocked by a synchronous call, the process runs: for 2.5 TTLs the
    # session thread renews the lease, which stays held and not lost.
    after = holder.send("block", freeze=False)
    blocking = cluster.wait_for(matches("blocking", "holder"), "the loop blocking", after=after)
    late = wait_until(
        lambda: cluster.select(
            lambda e: matches("renewed", "holder")(e) and e["t"] > blocking["t"] + 2.5 * TTL
        ),
        timeout=2.5 * TTL + PATIENCE,
        message=lambda: f"no renewal 2.5 TTLs into the block\n{cluster.describe()}",
    )[-1]
    assert late["token"] == token and late["expires_at"] > blocking["t"] + 2.5 * TTL, late
    current = store.read(cluster.lease)
    assert current is not None and current.token == token, current
    assert not cluster.select(matches("lost", "holder")), cluster.describe()
    unblocked = holder.request("unblock", "unblocked")
    assert unblocked["blocked_for"] > 2 * TTL, unblocked
    assert unblocked["held"] is True and unblocked["lost"] is False, unblocked

    # 2. Blocked again, and SIGSTOPped (right after a renewal) for TTL + 1.5 s: the parent
    # takes the lease over and writes through fenced().
    after = holder.send("block", freeze=True)
    freezing = cluster.wait_for(matches("freezing", "holder"), "the holder pausing", after=after)
    wait_until(
        lambda: holder.state() == "T",
        timeout=PATIENCE,
        interval=0.005,
        message=lambda: f"the holder never stopped: {holder.state()}",
    )
    paused_at = freezing["t"]
    successor = wait_until(
        lambda: acquire_once(store, cluster.lease, "successor", resolve_timing(30))[0],
        timeout=TTL + PATIENCE,
        message="the parent never took the lease over",
    )
    taken_at = time.time()
    assert successor.token > token
    using = fence_using(cluster)
    with successor.fenced(using=using):
        FencedWrite.objects.using(cluster.db_alias).create(
            writer=cluster.lease, token=successor.token, note="successor"
        )
    # The pause is the fault tested: a fixed one, longer than the TTL.
    time.sleep(max(0.0, paused_at + TTL + 1.5 - time.time()))
    assert holder.state() == "T"
    resumed_at = time.time()
    os.kill(holder.pid, signal.SIGCONT)

    # The loop is still blocked (until "unblock"): the monitor thread sees the lease
    # marked lost by the session thread.
    resumed = cluster.wait_for(matches("resumed", "holder"), "the holder resuming", after=after)
    lost = cluster.wait_for(matches("lost", "holder"), "the lease marked lost", after=after)
    report(
        request,
        pause=resumed_at - paused_at,
        takeover=taken_at - paused_at,
        lost_after_resume=lost["t"] - resumed_at,
    )
    assert resumed["stopped_for"] > TTL, resumed
    assert resumed["held"] is False, resumed  # the deadline alone says so, at once
    assert lost["deadline_wall"] < resumed_at, lost
    assert lost["deadline_wall"] < successor.acquired_at.timestamp(), (lost, successor)
    assert not cluster.select(
        lambda e: matches("state", "holder", held=True)(e) and e["t"] >= resumed_at
    ), cluster.describe()

    # The loop runs again: its first look says lost, and its fenced writes are refused.
    unblocked = holder.request("unblock", "unblocked")
    assert unblocked["held"] is False and unblocked["lost"] is True, unblocked
    wrote = cluster.wait_for(matches("wrote", "holder", note="after"), "the late writes")
    assert wrote["fenced"].startswith("rejected"), wrote
    assert wrote["unaware"].startswith("rejected"), wrote
    rows = FencedWrite.objects.using(cluster.db_alias).filter(writer=cluster.lease)
    assert list(rows.order_by("id").values_list("token", "note")) == [
        (token, "before"),
        (successor.token, "successor"),
    ]
    current = store.read(cluster.lease)
    assert current is not None and current.token == successor.token
    store.release(successor)


# -- (c) AsyncElector failover on SIGKILL -----------------------------------------------------
def test_killed_async_leader_is_replaced_within_ttl_plus_retry(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    children = [spawn(cluster, label, "elector") for label in ("a", "b")]
    cluster.wait_ready(children)
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    cluster.wait_for(matches("working", first["who"], token=first["token"]), "its work")
    leader = cluster.children[first["who"]]
    follower = next(child for child in children if child is not leader)
    cluster.wait_for(
        matches("new_leader", follower.label, token=first["token"]), "the follower seeing it"
    )
    current = store.read(cluster.lease)
    assert current is not None and current.token == first["token"]

    after = cluster.position()
    killed_at = time.time()
    leader.kill()
    second = cluster.wait_for(
        matches("elected", follower.label), "a new leader", TAKEOVER_BOUND + PATIENCE, after=after
    )
    takeover = second["t"] - killed_at
    report(request, takeover=takeover)
    assert takeover <= TAKEOVER_BOUND, f"took {takeover:.2f}s\n{cluster.describe()}"
    assert second["token"] > first["token"]
    assert second["previous_holder"] == first["holder"]
    cluster.wait_for(matches("working", follower.label, token=second["token"]), "its work")
    current = store.read(cluster.lease)
    assert current is not None and current.token == second["token"]
    assert_no_overlap(cluster, killed={leader.label: killed_at})


# -- (d) an AsyncElector leader, its loop blocked, SIGSTOPped past the TTL -----------------
def test_stopped_async_leader_with_a_blocked_loop_steps_down_before_takeover(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """The leader's loop is blocked by a synchronous call and the process SIGSTOPped for
    TTL + 1.5 s: the follower is elected; the old leader's local deadline lies before that
    grant, and the moment it resumes (its loop still blocked) it is no longer leader. Once
    its loop runs, its async work ends (wait_lost() returns, or it is cancelled) and on_lost
    runs."""
    children = [spawn(cluster, label, "elector") for label in ("a", "b")]
    cluster.wait_ready(children)
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    new = next(child for child in children if child is not old)
    cluster.wait_for(matches("working", old.label, token=first["token"]), "its work")

    after = old.send("block", freeze=True)
    freezing = cluster.wait_for(matches("freezing", old.label), "the leader pausing", after=after)
    wait_until(
        lambda: old.state() == "T",
        timeout=PATIENCE,
        interval=0.005,
        message=lambda: f"{old.label} never stopped: {old.state()}",
    )
    paused_at = freezing["t"]
    second = cluster.wait_for(
        matches("elected", new.label), "a takeover", TAKEOVER_BOUND + PATIENCE, after=after
    )
    assert second["token"] > first["token"]
    # The pause is the fault tested: a fixed one, longer than the TTL.
    time.sleep(max(0.0, paused_at + TTL + 1.5 - time.time()))
    assert old.state() == "T"
    resumed_at = time.time()
    os.kill(old.pid, signal.SIGCONT)

    resumed = cluster.wait_for(matches("resumed", old.label), "the leader resuming", after=after)
    assert resumed["stopped_for"] > TTL, resumed
    assert resumed["is_leader"] is False and resumed["held"] is False, resumed
    assert not cluster.select(
        lambda e: matches("state", old.label, leader=True)(e) and e["t"] >= resumed_at
    ), cluster.describe()
    assert not cluster.select(matches("unblocked", old.label))  # its loop is still blocked

    unblocked = old.request("unblock", "unblocked")
    assert unblocked["is_leader"] is False, unblocked
    ended = cluster.wait_for(
        matches("work_ended", old.label, token=first["token"]), "its work ending"
    )
    assert ended["held"] is False, ended
    lost = cluster.wait_for(matches("lost", old.label, token=first["token"]), "its on_lost")
    report(
        request,
        pause=resumed_at - paused_at,
        takeover=second["t"] - paused_at,
        deadline_before_takeover=second["acquired_at"] - lost["deadline_wall"],
    )
    assert lost["deadline_wall"] < second["acquired_at"] <= second["t"], (lost, second)
    current = store.read(cluster.lease)
    assert current is not None and current.token == second["token"]
    assert_no_overlap(cluster)
