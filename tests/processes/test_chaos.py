"""The short seeded chaos runs of CI (``make chaos-short``, marked ``chaos``: ``make test``
leaves them out): 30 s of process and store faults per store, 30 s of failovers per
replicated store, and a run of network partitions on PostgreSQL (the candidates and the
store in network namespaces of their own, tests/chaos/network.py); not one violation.
``make test`` runs a 15 s seeded failover run per replicated topology (marked
``topology``), its safety checks only.

Each store is a private instance the harness starts itself (see tests/chaos/stores.py), so
the shared servers are never restarted or flushed. The long run is ``make chaos``
(docs/chaos.md).

Below them, what the chaos runs on ZooKeeper found, each made into a test that fails
deterministically without a fault injector.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from django_leader import BackendUnavailable, Lease
from django_leader.conf import lock_delay
from tests.chaos import harness, report
from tests.chaos.stores import STORES
from tests.support import netns
from tests.support.stores import REQUIRE_SERVICES, stores_db, zookeeper_backend
from tests.support.waiting import wait_until
from tests.support.zookeeper_server import ZooKeeperServer

# The chaos runs one after the other, on one pytest worker: each starts a store and five
# candidates, and their liveness bound (TTL + RETRY + 1 s) wants the cores they share.
pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("chaos")]

DURATION = 30.0
SEED = 10
#: The partition run: partitions only (each lasts 1-3 TTLs), on PostgreSQL (fenced writes
#: through a cut link, and a server whose sessions outlive the client's).
PARTITION_STORE = "postgresql"
PARTITION_DURATION = 40.0
#: The failover runs: only the replicated store's own faults (each a failover, 3-8 s).
FAILOVER_DURATION = 30.0


@pytest.mark.chaos
@pytest.mark.parametrize("store", ["sqlite", "postgresql", "mariadb", "redis", "zookeeper"])
def test_no_violation_under_faults(store: str) -> None:
    reason = STORES[store].unavailable()
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(f"required service missing: {reason}")
        pytest.skip(f"service unavailable: {reason}")
    # A work directory of its own, kept if the run fails (the logs are the evidence).
    # No network: the partitions have a run of their own (below). No clock steps nor
    # stalls either: those are tested between processes in test_clock_steps.py,
    # test_elector_watchdog.py and test_runleader_watchdog.py, and in make chaos.
    config = harness.Config(store=store, duration=DURATION, seed=SEED, keep=True,
                            network=False, clocks=False, stalls=False)  # fmt: skip
    _passes(harness.run(config), faults=5)


@pytest.mark.chaos
@pytest.mark.parametrize(
    "store", ["redis-sentinel", "redis-cluster", "postgresql-standby", "postgresql-pgbouncer"]
)
def test_no_violation_under_failovers(store: str) -> None:
    """A replicated store (tests/chaos/replicated.py) failed over again and again: the
    primary killed, frozen, switched over, or killed just after replication stalled. The
    long runs are ``make chaos-failovers`` (these, and postgresql-sync)."""
    summary = _passes(_failovers(store, FAILOVER_DURATION), faults=2)
    by_kind: dict[str, object] = summary["by_kind"]  # type: ignore[assignment]
    assert set(by_kind) <= set(STORES[store].faults), by_kind


#: make test's seeded failover runs (issue 26): one per replicated topology, shorter than
#: make chaos-short's, each sure to fail its store over at least once.
SHORT_FAILOVER_DURATION = 15.0
FAILOVER_STORES = [
    "redis-sentinel",
    "redis-cluster",
    "postgresql-standby",
    "postgresql-sync",
    "postgresql-pgbouncer",
]


@pytest.mark.topology
@pytest.mark.parametrize("store", FAILOVER_STORES)
def test_a_short_seeded_failover_run_never_makes_two_leaders(store: str) -> None:
    """``make test``'s run per replicated topology: 15 s of failovers under the chaos
    checker, seeded; every safety check (no overlap, no token repeated or going back, no
    stale or lost fenced write) must hold. Recovery times are bounds of a quiet machine,
    which ``make test``'s other workers do not leave: the 30 s runs of ``make chaos-short``
    (CI) check them, and ``make chaos-failovers`` runs each topology for minutes."""
    outcome = _failovers(store, SHORT_FAILOVER_DURATION)
    summary = report.summarize(outcome)
    assert summary["faults"] >= 1, summary
    unsafe = [v for v in outcome.result.violations if v.check != "liveness"]
    assert unsafe == [], (
        f"{len(unsafe)} safety violations in {summary['faults']} failovers; logs in "
        f"{outcome.workdir}:\n" + "\n".join(f"  {v.t:.2f} s {v.check}: {v.message}" for v in unsafe)
    )
    shutil.rmtree(outcome.workdir, ignore_errors=True)


def _failovers(store: str, duration: float) -> harness.Outcome:
    """A seeded run of ``duration`` seconds on the replicated ``store``, its own faults
    (failovers) only; skipped (a failure in CI) where the store cannot be started."""
    reason = STORES[store].unavailable()
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(f"required service missing: {reason}")
        pytest.skip(f"service unavailable: {reason}")
    config = harness.Config(store=store, duration=duration, seed=SEED, keep=True,
                            network=False, clocks=False, stalls=False,
                            kinds=STORES[store].faults)  # fmt: skip
    return harness.run(config)


@pytest.mark.chaos
def test_no_violation_under_partitions() -> None:
    """The candidates and a private PostgreSQL each in a network namespace, linked by the
    run's userspace switch; the nemesis cuts the leader off, loses its requests or its
    replies only, delays its frames past RENEW_INTERVAL, cuts off a follower, cuts off the
    store (docs/chaos.md, "Partitions")."""
    for reason in (STORES[PARTITION_STORE].unavailable(), netns.unavailable()):
        if reason is not None:
            if REQUIRE_SERVICES:
                pytest.fail(f"required for the partition run: {reason}")
            pytest.skip(f"no partition run here: {reason}")
    config = harness.Config(store=PARTITION_STORE, duration=PARTITION_DURATION, seed=SEED,
                            keep=True, network=True, kinds=("partition",))  # fmt: skip
    outcome = harness.run(config)
    summary = _passes(outcome, faults=6)
    assert summary["partitions"] == summary["faults"], summary["by_kind"]


def _passes(outcome: harness.Outcome, faults: int) -> dict[str, object]:
    summary = report.summarize(outcome)
    assert summary["faults"] >= faults, summary
    details = "\n".join(
        f"  {e['t']:.2f} s {e['check']} after {e['fault']}: {e['message']}"
        for e in summary["examples"]
    )
    assert outcome.result.ok, (
        f"{summary['violations']} violations in {summary['faults']} faults "
        f"{summary['violations_by_check']}; logs in {outcome.workdir}:\n{details}"
    )
    shutil.rmtree(outcome.workdir, ignore_errors=True)
    return summary


# -- found on ZooKeeper ----------------------------------------------------------------------
@stores_db
def test_zookeeper_late_release_of_an_expired_lease_leaves_the_new_holders_alone() -> None:
    """The old holder's lease expires and another takes the name over; the old holder's
    release, made late (its connection was down when it stepped down), must not end the new
    holder's lease."""
    old, new = zookeeper_backend(), zookeeper_backend()
    name = f"late-release-{uuid.uuid4().hex[:10]}"
    try:
        stale, _ = old.acquire(name, "old", 0.3)
        assert stale is not None
        taken = wait_until(lambda: new.acquire(name, "new", 10.0)[0], timeout=10.0)
        assert taken.token > stale.token
        released = old.release(stale)
        current = new.read(name)
        assert (released, current and current.holder) == (False, "new"), (released, current)
    finally:
        for backend in (old, new):
            backend.flush_history(10.0)
        new.client.delete(new._name_path(name), recursive=True)
        old.shutdown()
        new.shutdown()


@stores_db
def test_zookeeper_backend_leads_again_after_its_server_lost_its_data(tmp_path: Path) -> None:
    """A private server is killed, its data wiped and started again: a store that lost its
    state. The backend that used it takes the lease again once the lock-delay has passed
    (plus a few seconds to reconnect), with a greater token."""
    ttl = 2.0
    with ZooKeeperServer(tmp_path) as server:
        backend = zookeeper_backend(hosts=server.hosts)
        name = f"wiped-{uuid.uuid4().hex[:10]}"
        try:
            first, _ = backend.acquire(name, "holder", ttl)
            assert first is not None and backend.release(first)
            for index in range(50):  # a zxid well ahead of an emptied server's
                lease, _ = backend.acquire(f"{name}-{index}", "holder", ttl)
                assert lease is not None and backend.release(lease)
            server.kill()
            server.wipe()
            server.start()

            def acquired() -> Lease | None:
                try:
                    return backend.acquire(name, "holder", ttl)[0]
                except BackendUnavailable:
                    return None

            again = wait_until(acquired, timeout=lock_delay(ttl) + 5.0, message="never led again")
            assert again.token > first.token
        finally:
            backend.flush_history(10.0)
            backend.shutdown()
