"""Leader election between real OS processes, on every store: each database, and Redis
through both cache clients (Django's RedisCache, django-redis).

Each child (``tests/procs/``) is a separate Python process that sets Django up on the very
test databases this test uses, works through ``DatabaseBackend(alias)`` or
``CacheBackend(cache_alias)`` and reports what it does as JSON lines on stdout, stamped with
wall-clock time. The parent starts, pauses and kills the children with signals and checks
their reports against each other and against the store. Every timing assertion is a safety
bound from the safety model (docs/safety.md), not a benchmark.

On Redis, history is written to the database asynchronously, by a thread of the process
that noticed the event: a child flushes it before the parent reads it. Redis seeds a
name's first fencing token from its clock, so only token order (and +1 steps) is asserted,
and ``fenced()`` raises NotSupportedError there (documented), which the pause test checks
in place of the fenced writes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_leader.backends.base import Backend
from django_leader.backends.cache import CacheBackend
from django_leader.backends.db import DatabaseBackend
from django_leader.models import LeaseEvent
from testproject.demoapp.models import FencedWrite
from tests.support.stores import CACHE_STORES, DATABASE_STORES, require
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

ROOT = Path(__file__).resolve().parents[2]

TTL = 2.0
RENEW = 0.5
RETRY = 0.3
#: Liveness (docs/safety.md): a crashed holder's lease is taken within TTL + RETRY_INTERVAL
#: (plus 1 s for the new leader to report it on a loaded machine).
TAKEOVER_BOUND = TTL + RETRY + 1.0
#: Starting a child (Python + Django) and getting its first report.
STARTUP = 30.0
#: Any other wait for a child's report.
PATIENCE = 10.0

Event = dict[str, Any]
Predicate = Callable[[Event], bool]


def matches(ev: str, who: str | None = None, **fields: Any) -> Predicate:
    """A predicate for events of kind ``ev`` (from child ``who``) with these field values."""

    def predicate(event: Event) -> bool:
        return (
            event["ev"] == ev
            and (who is None or event["who"] == who)
            and all(event.get(key) == value for key, value in fields.items())
        )

    return predicate


class Child:
    """One child process and the thread that reads its reports."""

    def __init__(self, cluster: Cluster, label: str, module: str, env: dict[str, str]) -> None:
        self.cluster = cluster
        self.label = label
        self.stderr_path = cluster.tmp_path / f"{label}.stderr"
        with self.stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"tests.procs.{module}"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                bufsize=1,
            )
        self.pid = self.proc.pid
        self.reader = threading.Thread(target=self._read, name=f"read-{label}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"ev": "noise", "line": line.rstrip("\n"), "t": time.time()}
            self.cluster._add(self.label, event)
        self.cluster._add(self.label, {"ev": "eof", "t": time.time()})

    def send(self, cmd: str, **fields: Any) -> int:
        """Send a command; returns the event-log position to wait for its reply after."""
        position = self.cluster.position()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        return position

    def request(self, cmd: str, reply: str, timeout: float = PATIENCE, **fields: Any) -> Event:
        after = self.send(cmd, **fields)
        return self.cluster.wait_for(
            matches(reply, self.label), f"{self.label}: {reply}", timeout, after=after
        )

    def state(self) -> str:
        """The process state letter from /proc (``T`` when stopped)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return "gone"
        return stat.rsplit(")", 1)[1].split()[0]

    def kill(self) -> None:
        """SIGKILL (which also ends a stopped process) and reap."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=PATIENCE)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.reader.join(timeout=PATIENCE)

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """The children of one test, and the merged log of their reports in arrival order."""

    def __init__(self, store: Backend, tmp_path: Path) -> None:
        self.store = store
        self.is_cache = isinstance(store, CacheBackend)
        self.kind = "cache" if self.is_cache else "database"
        #: The store's alias: a database alias, or a cache alias for Redis.
        self.alias: str = store.alias  # type: ignore[attr-defined]
        #: Where rows go: fenced writes, and the history (for Redis, written asynchronously).
        assert store.history_database is not None, "these tests read the lease history"
        self.db_alias = self.alias if not self.is_cache else store.history_database
        assert store.history_database == self.db_alias, (store, store.history_database)
        self.tmp_path = tmp_path
        # The test database pytest-django created for that alias (a file for SQLite).
        self.db_name = str(connections[self.db_alias].settings_dict["NAME"])
        self.lease = f"mp-{uuid.uuid4().hex[:10]}"
        self.children: dict[str, Child] = {}
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def spawn(self, label: str, module: str, **extra: str) -> Child:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="testproject.settings",
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            PYTHONUNBUFFERED="1",
            DL_MP_STORE=self.kind,
            DL_MP_ALIAS=self.alias,
            DL_MP_DB_ALIAS=self.db_alias,
            DL_MP_DB_NAME=self.db_name,
            # Every other database alias on its test database too (see tests/conftest.py).
            DJANGO_LEADER_TEST_DB_NAMES=json.dumps(
                {
                    alias: str(connections[alias].settings_dict["NAME"])
                    for alias in settings.DATABASES
                }
            ),
            DL_MP_IDENTITY=f"{label}-{uuid.uuid4().hex[:6]}",
            DL_MP_LEASE=self.lease,
            **extra,
        )
        if self.is_cache:
            # CacheBackend writes its history to DJANGO_LEADER["DATABASE"]: the same as here.
            env["DJANGO_LEADER_DATABASE"] = self.db_alias
        child = Child(self, label, module, env)
        self.children[label] = child
        return child

    def candidates(self, *labels: str) -> list[Child]:
        """Start Elector candidates and wait until each campaigns."""
        timing = {
            "DL_MP_TTL": str(TTL),
            "DL_MP_RENEW": str(RENEW),
            "DL_MP_RETRY": str(RETRY),
            # The same timing in the settings, which bound each store call of the backend.
            "DJANGO_LEADER_TTL": str(TTL),
            "DJANGO_LEADER_RENEW": str(RENEW),
            "DJANGO_LEADER_RETRY": str(RETRY),
        }
        children = [self.spawn(label, "candidate", **timing) for label in labels]
        for child in children:
            self.wait_for(matches("ready", child.label), f"{child.label} ready", STARTUP)
        return children

    def _add(self, label: str, event: Event) -> None:
        with self._cond:
            event["who"] = label
            self.events.append(event)
            self._cond.notify_all()

    def position(self) -> int:
        with self._cond:
            return len(self.events)

    def select(self, predicate: Predicate) -> list[Event]:
        with self._cond:
            return [event for event in self.events if predicate(event)]

    def wait_for(
        self, predicate: Predicate, what: str, timeout: float = PATIENCE, after: int = 0
    ) -> Event:
        """The first event from position ``after`` on that satisfies ``predicate``."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[after:]:
                    if event["ev"] == "fatal":
                        pytest.fail(f"{event['who']} failed: {event}\n{self.describe()}")
                    if predicate(event):
                        return event
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    pytest.fail(f"no {what} within {timeout:.1f}s\n{self.describe()}")
                self._cond.wait(remaining)

    def describe(self) -> str:
        """The recent reports and each child's log, for failure messages."""
        with self._cond:
            recent = self.events[-60:]
        lines = ["events:"] + [f"  {json.dumps(event, default=str)}" for event in recent]
        for child in self.children.values():
            lines.append(f"{child.label} (pid {child.pid}, exit {child.proc.poll()}) stderr:")
            lines.append(child.stderr_tail())
        return "\n".join(lines)

    def kill_all(self) -> None:
        for child in self.children.values():
            child.kill()

    def history(self, name: str, *flush: Child) -> list[tuple[str, str, int]]:
        """``(kind, holder, token)`` of every history event of ``name``, oldest first.

        On Redis, each process writes its history asynchronously: the children in
        ``flush`` (and the parent) write theirs before the database is read. A database
        store writes it in the lease's own transaction, so the row order is the order of
        events; the asynchronous writers of Redis can insert rows out of order, so there
        the events are ordered by their time on the Redis server (then id).
        """
        for child in flush:
            assert child.request("flush", "flushed")["ok"], f"{child.label}: history not flushed"
        assert self.store.flush_history(PATIENCE), "the parent's history not flushed"
        order = ("at", "id") if self.is_cache else ("id",)
        return list(
            LeaseEvent.objects.using(self.db_alias)
            .filter(name=name)
            .order_by(*order)
            .values_list("kind", "holder", "token")
        )

    def forget(self) -> None:
        """Remove this test's keys from Redis (a lease's meta key never expires)."""
        if self.is_cache:
            client = self.store.client  # type: ignore[attr-defined]
            keys = list(client.scan_iter(match=f"*django_leader:{{{self.lease}*", count=500))
            if keys:
                client.delete(*keys)


#: pytest id -> (kind, alias) of every store under test: each database, and Redis through
#: both cache clients.
STORES = {
    **{key: ("database", alias) for key, alias in DATABASE_STORES.items()},
    **{key: ("cache", alias) for key, alias in CACHE_STORES.items()},
}


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The parent's own view of the store (the children build the same backend)."""
    kind, alias = STORES[request.param]
    require(alias, kind=kind)
    backend: Backend = DatabaseBackend(alias) if kind == "database" else CacheBackend(alias)
    yield backend
    backend.flush_history(PATIENCE)  # before pytest-django flushes the history table
    backend.close()


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(store, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()  # before pytest-django flushes the tables the children use
        group.forget()


# -- leadership terms --------------------------------------------------------------------
@dataclass
class Term:
    """When a process believed it led, with one token: a conservative interval.

    ``start`` is the store's ``acquired_at`` (before the process could know it won);
    ``end`` the earlier of the instant ``lease.lost`` was reported and the local deadline at
    that moment (``lease.held`` is false from either on), or the instant the process was
    killed. Both stamps are upper bounds of the true end.
    """

    who: str
    token: int
    start: float
    end: float = math.inf


def leadership_terms(events: list[Event], killed: dict[str, float]) -> list[Term]:
    terms: dict[tuple[str, int], Term] = {}
    for event in events:
        if event["ev"] == "elected":
            key = (event["who"], event["token"])
            assert key not in terms, f"elected twice with one token: {event}"
            terms[key] = Term(event["who"], event["token"], event["acquired_at"])
    for event in events:
        if event["ev"] == "lost":
            term = terms[(event["who"], event["token"])]
            term.end = min(event["t"], event["deadline_wall"])
    for term in terms.values():
        if term.who in killed:
            term.end = min(term.end, killed[term.who])
    return sorted(terms.values(), key=lambda term: term.start)


def assert_no_overlap(cluster: Cluster, killed: dict[str, float] | None = None) -> list[Term]:
    """No two processes believed they led at the same instant; tokens grow with time."""
    terms = leadership_terms(cluster.select(lambda event: True), killed or {})
    assert terms, "nobody was ever elected"
    for before, after in itertools.pairwise(terms):
        assert before.end < after.start, (
            f"overlapping leadership: {before} and {after}\n{cluster.describe()}"
        )
        assert after.token > before.token, f"token went back: {before} then {after}"
    return terms


def report(request: pytest.FixtureRequest, **measured: float) -> None:
    """Make the measured times visible (``-rP``) and keep them in the JUnit properties."""
    for key, value in measured.items():
        request.node.user_properties.append((key, round(value, 3)))
    print(f"{request.node.name}: " + ", ".join(f"{k}={v:.3f}s" for k, v in measured.items()))


def leader_among(cluster: Cluster, children: list[Child], store: Backend) -> Child:
    """Ask everyone: exactly one of ``children`` leads, and the store and all agree on it."""
    replies = {child.label: child.request("status", "status") for child in children}
    leaders = [label for label, reply in replies.items() if reply["is_leader"]]
    assert len(leaders) == 1, f"leaders: {leaders}\n{replies}"
    leader = cluster.children[leaders[0]]
    current = store.read(cluster.lease)
    assert current is not None, "the store says nobody leads"
    assert current.token == replies[leader.label]["token"], (current, replies)
    assert current.holder.startswith(f"{leader.label}-"), (current, replies)
    for reply in replies.values():
        assert (reply["store_holder"], reply["store_token"]) == (current.holder, current.token)
    return leader


def wait_renewals(cluster: Cluster, who: str, token: int, count: int) -> Event:
    """Wait until ``who`` has renewed lease ``token`` ``count`` times; the last renewal."""
    for _ in range(count):
        after = cluster.position()
        event = cluster.wait_for(
            matches("deadline", who, token=token), f"a renewal by {who}", PATIENCE, after=after
        )
    return event


def assert_fenced_write(cluster: Cluster, reply: Event, committed: bool) -> None:
    """A fenced write's outcome: on a database as expected (``committed`` or refused); on
    Redis always NotSupportedError, whether the lease is held or not."""
    outcome = reply["outcome"]
    if cluster.is_cache:
        assert outcome.startswith("unsupported: NotSupportedError"), reply
    elif committed:
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
        if kind == "fresh" and cluster.is_cache:
            # Redis seeds a name's first token from its clock: a large number, not 1.
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
    lost) nor be renewed or released in the store.

    On Redis, ``fenced()`` raises NotSupportedError for every lease, held or not (a cache
    cannot fence database writes: documented); that is checked instead of the writes."""
    cluster.candidates("a", "b")
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    new_label = "b" if old.label == "a" else "a"
    # While it leads, its fenced writes commit (on Redis: fenced() is not supported).
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
    print(f"sampled on resume before the renewer marked it lost: {not resumed['lost_already']}")
    assert "deadline" in lost["reason"], lost
    # The step-down instant precedes the moment the store gave the lease away, and the
    # new leader's own report of it.
    assert lost["deadline_wall"] < second["acquired_at"] <= second["t"], (lost, second)
    assert lost["deadline_wall"] < resumed_at
    # Sampled the moment it resumed, is_leader was already false (from the deadline alone,
    # before the renewer ran: see lost_already).
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
    if not cluster.is_cache:
        assert "no longer held" in probe["db_fence"], probe  # refused by the row check
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
    if cluster.is_cache:
        assert (old_ids, new_ids) == ([], []), (old_ids, new_ids)  # nothing was written
    else:
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
