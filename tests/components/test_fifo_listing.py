"""A waiting fifo candidate, where the store lists its queue cheaply
(``Backend.queued_ahead``: ZooKeeper), reads the listing, the lease and the head of the
queue, not every candidate.

Found by ``make bench`` (the load part, 2026-11-28): every waiting fifo candidate read the
whole registry at each poll, its first (before joining) included, and on ZooKeeper that
is a request per candidate: a cost of the square of the queue's length (with 500
candidates, 49,378 requests for 400 of them to join, 1,008 a second while they waited).
The logic runs on ``MemoryBackend`` (a registry listed like ZooKeeper's: dead entries
stay listed until somebody drops them), and on a real ZooKeeper.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_leader import Elector
from django_leader.backends.base import Backend
from django_leader.election import Candidate, Mode, next_in_line
from django_leader.lease import Lease
from django_leader.testing import MemoryBackend
from tests.support.counting import CountingBackend
from tests.support.electing import start
from tests.support.stores import open_store, stores_db
from tests.support.waiting import wait_until

TIMING: dict[str, Any] = {"ttl": 0.6, "renew_interval": 0.2, "retry_interval": 0.1}
WAIT = 10.0


class ListedRegistry(MemoryBackend):
    """A registry listed like ZooKeeper's: ``queued_ahead`` counts every entry that joined
    before, its heartbeat run out or not; counts the calls of the three reads, and each
    holder's acquisition attempts."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()
        self._reads_lock = threading.Lock()

    def _count(self, what: str) -> None:
        with self._reads_lock:
            self.reads[what] += 1

    def candidates(self, name: str) -> list[Candidate] | None:
        self._count("candidates")
        return super().candidates(name)

    def next_in_line(
        self, name: str, mode: Mode | str, *, holder: str | None = None
    ) -> Candidate | None:
        self._count("next_in_line")
        return next_in_line(MemoryBackend.candidates(self, name) or [], mode, holder=holder)

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        self._count(f"acquire by {holder}")
        return super().acquire(name, holder, ttl)

    def queued_ahead(self, name: str, identity: str) -> int | None:
        self._count("queued_ahead")
        with self._lock:
            entries = [c for c, _ in self._candidates.get(name, {}).values()]
        order = [c.identity for c in sorted(entries, key=lambda c: c.seq)]
        return order.index(identity) if identity in order else len(order)


@pytest.fixture
def listed() -> ListedRegistry:
    return ListedRegistry()


def test_a_follower_third_in_line_waits_without_reading_the_registry(
    listed: ListedRegistry, lease_name: str, electors: list[Elector]
) -> None:
    """Two entries ahead, the lease held: the follower's polls (its first, before it
    joined, included) read the listing and the lease, never every candidate. Fails on the
    code before (a fifo follower read ``candidates()`` at every poll: ``queued_ahead`` was
    never called)."""
    listed.acquire(lease_name, "holder", 60)
    for identity in ("a", "b"):
        listed.announce(lease_name, Candidate(identity), 60)
    d = start(electors, Elector(lease_name, identity="d", backend=listed, mode="fifo", **TIMING))

    def polled(times: int) -> None:
        wait_until(
            lambda: listed.reads["queued_ahead"] >= times,
            timeout=WAIT,
            message=lambda: f"d did not poll by the listing: {listed.reads}",
        )

    polled(5)  # joining included: a newcomer is behind every entry
    assert listed.reads["candidates"] == 0, listed.reads
    assert not d.is_leader


def test_dead_entries_ahead_do_not_block_the_queue_when_the_lease_frees(
    listed: ListedRegistry, lease_name: str, electors: list[Elector]
) -> None:
    """The two ahead stopped heartbeating (a stuck process keeps its ZooKeeper session,
    hence its entry) and the holder crashed: once the holder's lease runs out, the third
    in line reads the registry, finds itself first among the live, and leads."""
    holder, _ = listed.acquire(lease_name, "holder", 1.0)
    assert holder is not None
    for identity in ("a", "b"):
        listed.announce(lease_name, Candidate(identity), 0.2)  # never renewed: dead soon
    d = start(electors, Elector(lease_name, identity="d", backend=listed, mode="fifo", **TIMING))
    assert d.wait_for_leadership(WAIT), listed.reads
    assert listed.reads["queued_ahead"] > 0  # it did wait by the listing first
    assert d.lease is not None and d.lease.token > holder.token


@pytest.mark.parametrize(
    ("head", "tries"),
    [
        pytest.param("a", False, id="another-candidate-first"),
        pytest.param("holder", True, id="the-holder-still-listed-first"),
    ],
)
def test_second_in_line_asks_the_head_of_the_queue_not_the_registry(
    listed: ListedRegistry, lease_name: str, electors: list[Elector], head: str, tries: bool
) -> None:
    """One entry ahead: the follower learns from ``next_in_line`` (a few requests on
    ZooKeeper), never from the whole registry, whether it is next. Behind another
    candidate it does not try; behind the holder's own entry, still first (its withdrawal
    failed), it is next in line and tries at its polls (a hand-over to it lets it in)."""
    listed.acquire(lease_name, "holder", 60)
    listed.announce(lease_name, Candidate(head), 60)
    start(electors, Elector(lease_name, identity="c", backend=listed, mode="fifo", **TIMING))
    wait_until(
        lambda: listed.reads["next_in_line"] >= 6,
        timeout=WAIT,
        message=lambda: f"c did not ask the head of the queue: {listed.reads}",
    )
    assert listed.reads["candidates"] == 0, listed.reads
    assert (listed.reads["acquire by c"] > 0) == tries, listed.reads


@pytest.fixture
def zookeeper() -> Iterator[Backend]:
    yield from open_store("zookeeper")


@stores_db
def test_zookeeper_lists_the_queue_in_join_order(zookeeper: Backend, lease_name: str) -> None:
    for identity in ("a", "b", "c"):
        zookeeper.announce(lease_name, Candidate(identity), 30)
    try:
        assert [zookeeper.queued_ahead(lease_name, i) for i in ("a", "b", "c")] == [0, 1, 2]
        assert zookeeper.queued_ahead(lease_name, "newcomer") == 3  # behind all of them
        zookeeper.withdraw(lease_name, "a")
        assert zookeeper.queued_ahead(lease_name, "c") == 1
        assert zookeeper.queued_ahead(f"{lease_name}-none", "newcomer") == 0
    finally:
        for identity in ("a", "b", "c"):
            zookeeper.withdraw(lease_name, identity)


@stores_db
@pytest.mark.parametrize("ahead", [1, 2])
def test_a_zookeeper_follower_reads_no_candidate(
    zookeeper: Backend, lease_name: str, electors: list[Elector], ahead: int
) -> None:
    """On the real store: second or third in line behind a holder, the follower's polls
    never read the registry (each of its reads would be a request per candidate)."""
    counted = CountingBackend(zookeeper)
    held, _ = zookeeper.acquire(lease_name, "holder", 60)
    assert held is not None
    for identity in ("a", "b")[:ahead]:
        zookeeper.announce(lease_name, Candidate(identity), 60)
    timing: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.6, "retry_interval": 0.2}
    start(electors, Elector(lease_name, identity="d", backend=counted, mode="fifo", **timing))

    def polled(times: int) -> Counter[str]:
        wait_until(
            lambda: counted.log.tally(counted.log.between())["queued_ahead"] >= times,
            timeout=30.0,
            message=lambda: counted.log.tally(counted.log.between()),
        )
        return counted.log.tally(counted.log.between())

    assert polled(3)["candidates"] == 0  # joining included
    zookeeper.release(held)
    for identity in ("a", "b"):
        zookeeper.withdraw(lease_name, identity)
