"""The Lease value object (pure logic: no store)."""

from __future__ import annotations

import threading
import time

import pytest

from django_leader import LeadershipLost, Lease
from django_leader.lease import LossReason, clock


def held_lease(seconds: float) -> Lease:
    return Lease("n", "h", 7, None, None, None, 1, deadline=clock() + seconds)


def test_held_until_deadline() -> None:
    lease = held_lease(60)
    assert lease.held and 59 < lease.time_left() <= 60
    lease.check()


def test_deadline_passed_is_lost_for_good() -> None:
    lease = held_lease(-0.001)
    assert not lease.held
    assert lease.lost.is_set() and lease.lost_reason == "local deadline passed"
    # A renewal answered afterwards cannot revive it.
    assert lease._update(held_lease(60), clock() + 60) is False
    assert not lease.held
    with pytest.raises(LeadershipLost, match="local deadline passed"):
        lease.check()


def test_update_extends_a_held_lease() -> None:
    lease = held_lease(60)
    new_deadline = clock() + 120
    assert lease._update(held_lease(0), new_deadline) is True
    assert lease.deadline == new_deadline


def test_snapshot_is_never_held() -> None:
    snapshot = Lease("n", "h", 7, None, None, None, 1)
    assert not snapshot.held and snapshot.time_left() == 0
    with pytest.raises(LeadershipLost, match="not a held lease"):
        snapshot.check()
    with pytest.raises(LeadershipLost, match="snapshot"):
        snapshot.fenced()


def test_lost_reason_reported_once() -> None:
    lease = held_lease(60)
    assert lease._mark_lost(LossReason.RESIGNED) is True
    assert lease._mark_lost(LossReason.STOPPED) is False
    assert lease.lost_reason == "resigned" and lease.lost_cause is LossReason.RESIGNED


def test_lost_reason_is_readable_and_its_cause_comparable() -> None:
    lease = held_lease(60)
    assert lease.lost_cause is None and lease.lost_reason == ""
    lease._mark_lost(LossReason.WORK_RAISED, "ValueError('boom')")
    assert lease.lost_cause is LossReason.WORK_RAISED
    assert lease.lost_reason == "work raised: ValueError('boom')"
    with pytest.raises(LeadershipLost, match="work raised"):
        lease.check()
    assert LossReason.STOPPED == "elector stopped" and str(LossReason.RELEASED) == "released"


def test_renewer_reports_a_loss_a_reader_saw_first() -> None:
    """Deterministic twin of the elector test: the lease is already marked lost by a reader
    of `held` when the renewer stops; it must still report the loss, once."""
    from typing import Any

    from django_leader.backends.base import Backend
    from django_leader.conf import Timing
    from django_leader.term import Renewer, StoreCaller

    class Recorder(Backend):  # pure logic: no store needed, nothing but `record` is called
        def __init__(self) -> None:
            self.events: list[str] = []

        def acquire(self, *args: Any) -> Any:
            raise AssertionError

        renew = release = read = names = force_release = acquire  # type: ignore[assignment]

        def record(self, kind: str, lease: Lease, detail: str = "") -> None:
            self.events.append(kind)

    store = Recorder()
    lease = held_lease(-0.001)
    assert not lease.held  # a reader got there first
    reported: list[Lease] = []
    caller = StoreCaller(store, "n")
    renewer = Renewer(store, lease, Timing(1.0, 0.3, 0.1), caller, on_lost=reported.append)
    renewer.stop()
    renewer.stop()
    caller.close()
    assert reported == [lease]
    caller.shutdown(wait=True)
    assert store.events == ["lost"]


def test_a_lease_is_made_without_a_condition_until_its_loss_is_waited_on() -> None:
    """lease.lost is a threading.Event whose condition is made on first use: a batch
    renewal makes 10,000 leases that nobody waits on."""
    lease = held_lease(60)
    assert isinstance(lease.lost, threading.Event)
    assert "_cond" not in vars(lease.lost)
    assert not lease.lost.is_set() and not lease.lost.wait(0.001)
    assert "_cond" in vars(lease.lost)


def test_the_loss_of_a_lease_wakes_every_thread_that_waits_for_it() -> None:
    """Threads that start waiting at once share one condition, and a set from another
    thread wakes them all."""
    lease = held_lease(60)
    ready = threading.Barrier(9)
    woken: list[bool] = []

    def wait() -> None:
        ready.wait()
        woken.append(lease.lost.wait(30))

    threads = [threading.Thread(target=wait) for _ in range(8)]
    for thread in threads:
        thread.start()
    ready.wait()
    time.sleep(0.05)
    lease._mark_lost(LossReason.LOCAL_DEADLINE)
    for thread in threads:
        thread.join(30)
    assert woken == [True] * 8
    lease.lost.clear()
    assert not lease.lost.is_set()
