"""The Elector's watchdog between real OS processes: a leader whose work deadlocks steps down
at once, but keeps the lease renewed while that work may still act; only once the process is
gone (a liveness probe restarts it) does the lease expire and another process lead.

Each candidate is ``tests/procs/candidate.py``, driven through ``tests/support/cluster.py``,
as in tests/processes/test_elections.py (which has the other election tests)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_leader.backends.base import Backend
from django_leader.lease import LossReason, clock
from tests.support.cluster import (
    PATIENCE,
    Cluster,
    assert_no_overlap,
    matches,
    open_cluster,
    open_store,
    report,
    wait_renewals,
)

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

TTL = 2.0
RENEW = 0.5
RETRY = 0.25
WATCHDOG = 1.0
#: What a process may take on a loaded machine to act on what it saw and report it.
MARGIN = 1.0


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from open_store(request.param)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


@pytest.mark.parametrize("store", ["sqlite", "postgresql", "zookeeper"], indirect=True)
def test_watchdog_steps_down_but_keeps_the_lease_while_the_work_is_stuck(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """Two candidates with ``watchdog=1``; the leader's work deadlocks (it stops calling
    ``lease.heartbeat()``, and never returns). Within watchdog + RENEW_INTERVAL of its last
    heartbeat the leader steps down (``lost``, ``is_leader`` false, ``stuck_for``), but it
    keeps the lease renewed: the other process does not lead while the stuck work could
    still act. Once the stuck process is killed, the lease expires and the other leads."""
    children = cluster.candidates("a", "b", retry=RETRY, DL_MP_WATCHDOG=str(WATCHDOG))
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    new = next(child for child in children if child is not old)
    wait_renewals(cluster, old.label, first["token"], 2)  # heart-beating, it keeps the lease

    after = old.send("hang")
    hanging = cluster.wait_for(matches("hanging", old.label), "the work hanging", after=after)
    lost = cluster.wait_for(
        matches("lost", old.label, token=first["token"]),
        "the watchdog firing",
        WATCHDOG + RENEW + MARGIN + PATIENCE,
        after=after,
    )
    assert lost["reason"].startswith(LossReason.WATCHDOG.value), lost
    assert lost["clock"] - hanging["beat_clock"] <= WATCHDOG + RENEW, (hanging, lost)

    # Twice the TTL: a lease no longer renewed would have expired by then, and a released
    # one been taken within RETRY_INTERVAL.
    time.sleep(2 * TTL)
    status = old.request("status", "status")
    assert status["is_leader"] is False, status
    assert status["stuck_for"] is not None and status["stuck_for"] > 2 * TTL, status
    assert (status["store_holder"], status["store_token"]) == (
        first["holder"],
        first["token"],
    ), status
    assert not cluster.select(matches("elected", new.label)), cluster.describe()

    # What a liveness probe does to a process it finds stuck: restart it.
    old.kill()
    killed_at = clock()
    elected = cluster.wait_for(
        matches("elected", new.label), "a takeover", TTL + RETRY + MARGIN + PATIENCE, after=after
    )
    report(
        request,
        stepped_down=lost["clock"] - hanging["beat_clock"],
        takeover_after_kill=elected["clock"] - killed_at,
    )
    assert elected["token"] > first["token"], elected
    # Not released: it expired after the process died.
    assert elected["previous_holder"] == first["holder"], elected
    assert elected["clock"] - killed_at <= TTL + RETRY + MARGIN, (killed_at, elected)
    assert_no_overlap(cluster)
