"""ZooKeeper faults that need real processes: Electors in child processes
(tests/procs/zk_elector.py, each with a session of its own) on private ZooKeeper servers
(tests/support/zookeeper_server.py; the machine's ZooKeeper on 2181 is left alone).

* A holder SIGSTOPped past its session timeout: its session ends, another process takes
  over within session timeout + RETRY_INTERVAL + SLACK, and the holder, resumed, has
  stepped down and its late renewal is refused.
* A three-node ensemble losing a follower, then its leader: the election keeps (or gets
  back, within session timeout + RETRY_INTERVAL + SLACK) a leader, tokens grow, no two
  leaders at once, and the nodes agree once they are all back.

Every child reports its terms with the lease clock (CLOCK_BOOTTIME, one clock for every
process of the machine), so the terms of different processes can be compared.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_leader import BackendUnavailable
from django_leader.backends.zookeeper import ZooKeeperBackend, encode_name
from django_leader.lease import clock
from tests.support.cluster import spawn
from tests.support.stores import ROOT
from tests.support.waiting import wait_until
from tests.support.zookeeper_server import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    new_root,
    skip_without_kazoo,
)

skip_without_kazoo()
from kazoo.client import KazooClient  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.topology]

RENEW = 0.5
RETRY = 0.2
#: Scheduling slack on top of what the settings allow.
SLACK = 1.0
#: For what has no bound of its own (a child starting, a server starting).
WAIT = 30.0


class Child:
    """One ``tests/procs/zk_elector.py`` process and the events it reported."""

    def __init__(self, identity: str, hosts: str, root: str, name: str, ttl: float) -> None:
        self.identity = identity
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DL_ZK_HOSTS": hosts,
            "DL_ZK_ROOT": root,
            "DL_ZK_LEASE": name,
            "DL_ZK_IDENTITY": identity,
            "DL_ZK_TTL": str(ttl),
            "DL_ZK_RENEW": str(RENEW),
            "DL_ZK_RETRY": str(RETRY),
            "DL_ZK_SESSION": str(ttl),
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.proc = spawn("zk_elector", env)
        self.events: list[dict[str, Any]] = []
        self.guard = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self.guard:
                    self.events.append(json.loads(line))

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd}) + "\n")
        self.proc.stdin.flush()

    def seen(self, ev: str, since: float = 0.0, **fields: Any) -> dict[str, Any] | None:
        """The first event ``ev`` at ``since`` (lease clock) or later with ``fields``."""
        with self.guard:
            return next(
                (
                    e
                    for e in self.events
                    if e["ev"] == ev
                    and e["clock"] >= since
                    and all(e.get(k) == v for k, v in fields.items())
                ),
                None,
            )

    def wait(self, ev: str, timeout: float = WAIT, since: float = 0.0, **fields: Any) -> Any:
        return wait_until(
            lambda: self.seen(ev, since, **fields),
            timeout=timeout,
            message=lambda: f"{self.identity}: no {ev} {fields}; events: {self.events}",
        )

    def ask(self, cmd: str, reply: str) -> dict[str, Any]:
        since = clock()
        self.send(cmd)
        return self.wait(reply, since=since)

    def terms(self) -> list[tuple[str, int, float, float]]:
        """``(identity, token, elected, end)`` of each term: it ended when ``on_lost`` ran
        or at its local deadline, whichever came first (infinity while it lasts)."""
        found = []
        with self.guard:
            events = list(self.events)
        for event in events:
            if event["ev"] != "elected":
                continue
            lost = next(
                (e for e in events if e["ev"] == "lost" and e["token"] == event["token"]), None
            )
            end = float("inf") if lost is None else min(lost["clock"], lost["deadline"])
            found.append((self.identity, event["token"], event["clock"], end))
        return found

    def leads(self) -> int | None:
        """The token of the term this child is in now, by its own reports."""
        terms = [t for t in self.terms() if t[3] == float("inf")]
        return terms[-1][1] if terms else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            try:
                self.send("exit")
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)


def wall(instant: float) -> float:
    """The ``time.time()`` of an instant of the lease clock."""
    return time.time() + (instant - clock())


def check_terms(children: list[Child]) -> list[tuple[str, int, float, float]]:
    """No two terms (of any processes) overlap; each has a greater token than the one
    before. The terms, in order."""
    terms = sorted((t for child in children for t in child.terms()), key=lambda t: t[2])
    for before, after in itertools.pairwise(terms):
        assert before[3] <= after[2], f"{before} still led when {after} was elected"
        assert after[1] > before[1], (before, after)
    return terms


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def start(*args: Any, **kwargs: Any) -> Child:
        child = Child(*args, **kwargs)
        started.append(child)
        return child

    yield start
    for child in started:
        child.close()


def test_holder_stopped_past_its_session(
    tmp_path: Path, children: Callable[..., Child], lease_name: str
) -> None:
    ttl = session = 2.0
    with ZooKeeperServer(tmp_path) as server:
        root = new_root(server.hosts)
        holder = children("holder", server.hosts, root, lease_name, ttl)
        elected = holder.wait("elected")
        successor = children("successor", server.hosts, root, lease_name, ttl)
        successor.wait("new_leader", holder="holder", token=elected["token"])

        stopped = clock()
        os.kill(holder.proc.pid, signal.SIGSTOP)
        try:
            taken = successor.wait("elected", timeout=session + RETRY + SLACK)
        finally:
            # Sampled before the signal (as test_multiprocess does): the holder may report
            # its loss before this process runs again (both read CLOCK_BOOTTIME).
            resumed = clock()
            os.kill(holder.proc.pid, signal.SIGCONT)
        print(f"holder stopped: successor elected {taken['clock'] - stopped:.2f}s after")
        assert taken["token"] > elected["token"]

        # Resumed, it finds its deadline passed: it has stepped down, before the successor
        # was elected (its deadline), and its late renewal is refused.
        # (How soon it reports it is no bound of safety: its deadline is, checked below.)
        lost = holder.wait("lost", token=elected["token"])
        assert lost["cause"] in ("DEADLINE", "IN_FLIGHT", "ANSWERED_LATE", "LOCAL_DEADLINE")
        assert lost["deadline"] <= stopped + ttl
        assert lost["deadline"] <= taken["clock"]
        assert lost["clock"] >= resumed
        status = holder.ask("status", "status")
        assert status["is_leader"] is False and status["token"] is None
        probe = holder.ask("probe", "probe")
        assert probe == {**probe, "token": elected["token"], "renewed": None}, probe
        # The store names the successor (or, should the successor's own term have ended
        # meanwhile on a loaded machine, nobody, or a later term): never the old holder.
        assert probe["holder"] != "holder", probe
        assert probe["holder_token"] is None or probe["holder_token"] >= taken["token"], probe
        assert successor.ask("status", "status")["token"] == taken["token"]
        check_terms([holder, successor])
        holder.close()
        successor.close()


def store_state(hosts: str, root: str, name: str) -> tuple[Any, Any]:
    """``(lease node data, record's token and holder)`` as node ``hosts`` has them."""
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=WAIT)
    try:
        path = f"{root}/names/{encode_name(name)}"
        client.sync(path)
        raw, _ = client.get(f"{path}/lease")
        record, _ = client.get(path)
        lease = json.loads(raw)
        kept = json.loads(record)
        return (lease["holder"], lease["token"]), (kept["holder"], kept["token"])
    finally:
        client.stop()
        client.close()


def test_ensemble_loses_a_follower_then_its_leader(
    tmp_path: Path, children: Callable[..., Child], lease_name: str
) -> None:
    ttl = session = 4.0
    bound = session + RETRY + SLACK
    with ZooKeeperEnsemble(tmp_path) as ensemble:
        root = new_root(ensemble.hosts)
        racers = [children(f"p{i}", ensemble.hosts, root, lease_name, ttl) for i in range(3)]
        reader = ZooKeeperBackend(hosts=ensemble.hosts, root=root, timeout=1.0)

        def leading(since: float | None = None) -> tuple[Child, int] | None:
            """The child that leads now by its own reports, if the store agrees (and, with
            ``since``, renewed or granted its lease after that instant of the lease clock)."""
            try:
                lease = reader.read(lease_name)
            except BackendUnavailable:  # the ensemble is electing: not known yet
                return None
            if lease is None or lease.renewed_at is None:
                return None
            if since is not None and lease.renewed_at.timestamp() <= wall(since):
                return None
            for child in racers:
                if (lease.holder, lease.token) == (child.identity, child.leads()):
                    return child, lease.token
            return None

        try:
            first, token = wait_until(leading, timeout=WAIT, message="nobody was elected")

            # A follower node dies: the leader keeps leading (or is re-elected, with a
            # greater token).
            follower = ensemble.followers()[0]
            fault = clock()
            ensemble.kill(follower)
            # Until a renewal (or a grant) through the remaining nodes: the store moved on.
            after_follower = wait_until(
                lambda: leading(since=fault),
                timeout=bound,
                message="no leader renewed or elected after a follower died",
            )
            losses = [t for t in check_terms(racers) if t[2] < fault and t[3] != float("inf")]
            print(
                f"follower killed: leader {after_follower[0].identity} token "
                f"{after_follower[1]} (before: {first.identity} {token}); "
                f"terms lost: {len(losses)}"
            )
            assert after_follower[1] >= token
            ensemble.start(follower)

            # The ensemble's leader dies: a leader of the election again within the bound.
            zk_leader = ensemble.leader()
            fault = clock()
            ensemble.kill(zk_leader)

            again = wait_until(
                lambda: leading(since=fault),
                timeout=bound,
                message="no leader renewed or elected after the ZK leader died",
            )
            failover = clock() - fault
            print(
                f"ZK leader killed: {again[0].identity} token {again[1]} leads, store "
                f"written again {failover:.2f}s after the fault"
            )
            assert again[1] >= after_follower[1]
            ensemble.start(zk_leader)

            # All back: every node agrees with the leader of the election.
            leader, token = wait_until(leading, timeout=bound, message="no leader at the end")
            states = {store_state(ensemble.node_hosts(i), root, lease_name) for i in range(3)}
            assert states == {((leader.identity, token), (leader.identity, token))}, states
            statuses = [child.ask("status", "status") for child in racers]
            assert [s["token"] for s in statuses if s["is_leader"]] == [token]
            terms = check_terms(racers)
            assert terms[-1][:2] == (leader.identity, token)
            print(f"ensemble: {len(terms)} terms, tokens {[t[1] for t in terms]}")
        finally:
            reader.shutdown()
            for child in racers:  # while the ensemble serves: they release and exit
                child.close()
