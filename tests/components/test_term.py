"""term.py: the life of one term — grant, hand-back of a late grant, end, signals — shared
by lock() and the Elector, on the real stores."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.dispatch import Signal

from django_leader import (
    BackendUnavailable,
    Elector,
    LeadershipLost,
    Lease,
    hooks,
    session,
    signals,
)
from django_leader import lock as lock_
from django_leader.backends.base import Backend
from django_leader.caller import StoreCaller
from django_leader.conf import Timing
from django_leader.lease import LossReason
from django_leader.term import Renewer, Term, attempt
from tests.support.faults import FaultyBackend
from tests.support.stores import history, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

WAIT = 10.0


class Slow(FaultyBackend):
    """A real store whose acquisitions answer late, and whose releases can fail."""

    def __init__(self, real: Backend, acquire_delay: float = 0.0) -> None:
        super().__init__(real)
        self.acquire_delay = acquire_delay
        self.fail_release = False
        self.releases = 0

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        time.sleep(self.acquire_delay)  # the fault itself: the request reaches the store late
        return self.real.acquire(name, holder, ttl)

    def release(self, lease: Lease) -> bool:
        self.releases += 1
        if self.fail_release:
            raise BackendUnavailable("injected: release failed")
        return self.real.release(lease)


@contextmanager
def received(signal: Signal, sender: Any) -> Iterator[list[Lease]]:
    """The leases ``signal`` is sent with by ``sender`` while the block runs."""
    got: list[Lease] = []

    def receiver(sender: Any, lease: Lease, **kwargs: Any) -> None:
        if sender is wanted:
            got.append(lease)

    wanted = sender
    signal.connect(receiver, weak=False)
    try:
        yield got
    finally:
        signal.disconnect(receiver)


def kinds(store: Backend, name: str) -> list[tuple[str, str]]:
    return [(kind, holder) for kind, holder, *_ in history(store, name)]


def granted(
    store: Backend, name: str, timing: Timing, holder: str = "alice"
) -> tuple[Lease, StoreCaller]:
    caller = StoreCaller(store, name)
    # The bound of an Elector's attempt (a grant answered after it could not be used), not
    # lock()'s shorter call bound: these tests are about what follows the grant.
    bound = timing.ttl - timing.safety_margin
    lease, current = attempt(store, caller, name, holder, timing, bound, "test")
    assert lease is not None and lease.held and current is not None
    return lease, caller


# -- the end of a term, one path for lock() and the Elector ---------------------------------
def test_end_releases_then_signals_released_once(backend: Backend, lease_name: str) -> None:
    timing = Timing(3.0, 1.0, 0.2)
    lease, caller = granted(backend, lease_name, timing)
    sender = object()
    with (
        received(signals.lease_released, sender) as released,
        received(signals.leader_lost, sender) as lost,
    ):
        term = Term(backend, lease, timing, caller, sender=sender, label="test")
        term.begin()
        assert term.end() is True
    caller.close()
    assert released == [lease] and lost == []
    assert lease.lost.is_set() and lease.lost_cause is LossReason.RELEASED
    assert lease.lost_reason == "released" and not lease.held
    assert backend.read(lease_name) is None
    assert kinds(backend, lease_name) == [("acquired", "alice"), ("released", "alice")]


@pytest.mark.parametrize("how", ["release failed", "release=False"])
def test_end_without_a_release_signals_lost_once(
    backend: Backend, lease_name: str, how: str
) -> None:
    store = Slow(backend)
    store.fail_release = how == "release failed"
    timing = Timing(3.0, 1.0, 0.2)
    lease, caller = granted(store, lease_name, timing)
    sender = object()
    with (
        received(signals.lease_released, sender) as released,
        received(signals.leader_lost, sender) as lost,
    ):
        term = Term(store, lease, timing, caller, sender=sender, label="test")
        term.begin()
        assert term.step_down(LossReason.RESIGNED) is True
        assert term.step_down(LossReason.STOPPED) is False  # the first reason stays
        assert term.end(release=how != "release=False") is False
        term.signal_lost()  # once per term, whoever asks again
    caller.close()
    assert lost == [lease] and released == []
    assert lease.lost_cause is LossReason.RESIGNED and lease.lost_reason == "resigned"
    assert store.releases == (1 if how == "release failed" else 0)
    assert backend.read(lease_name) is not None  # it expires after its ttl
    assert backend.release(lease)


def test_a_lost_term_is_signalled_once_by_the_renewer(backend: Backend, lease_name: str) -> None:
    """lock()'s way: the renewer signals the loss at once; the end does not again."""
    timing = Timing(3.0, 0.2, 0.1)
    lease, caller = granted(backend, lease_name, timing)
    sender = object()
    with received(signals.leader_lost, sender) as lost:
        term = Term(
            backend, lease, timing, caller, sender=sender, label="test", on_lost=Term.signal_lost
        )
        term.begin()
        assert backend.force_release(lease_name, actor="test") is not None
        assert lease.lost.wait(WAIT)
        wait_until(
            lambda: lost == [lease], timeout=WAIT, message=lambda: f"leader_lost sent with {lost}"
        )
        assert term.step_down(LossReason.STOPPED) is False  # lost, not a choice
        assert term.end() is False
    caller.close()
    assert lost == [lease] and lease.lost_cause is LossReason.REFUSED


def test_a_lock_whose_release_fails_signals_lost(backend: Backend, lease_name: str) -> None:
    """The end of a lock() block is the Elector's: without a release, leader_lost."""
    store = Slow(backend)
    held = lock_(lease_name, ttl=3, backend=store)
    with (
        received(signals.leader_lost, held) as lost,
        received(signals.lease_released, held) as released,
    ):
        with held as lease:
            store.fail_release = True
        assert lost == [lease] and released == []
    assert lease.lost_cause is LossReason.RELEASED
    assert backend.release(lease)


def test_an_elector_stopped_without_release_signals_lost_once(
    backend: Backend, lease_name: str
) -> None:
    elector = Elector(lease_name, ttl=3, renew_interval=1, retry_interval=0.1, backend=backend)
    with (
        received(signals.leader_lost, elector) as lost,
        received(signals.lease_released, elector) as released,
    ):
        elector.start()
        assert elector.wait_for_leadership(WAIT)
        lease = elector.lease
        elector.stop(release=False, timeout=WAIT)
    assert lease is not None and lost == [lease] and released == []
    assert lease.lost_cause is LossReason.STOPPED and lease.lost_reason == "elector stopped"
    assert backend.release(lease)


# -- a grant that comes too late is handed back, once ---------------------------------------
def test_grant_answered_after_its_deadline_is_handed_back_once(
    backend: Backend, lease_name: str
) -> None:
    timing = Timing(1.0, 0.3, 0.1)  # local deadline: sent + 0.9 s
    store = Slow(backend, acquire_delay=1.0)
    caller = StoreCaller(store, lease_name)
    assert attempt(store, caller, lease_name, "late", timing, WAIT, "test") == (None, None)
    caller.shutdown(wait=True)
    assert store.releases == 1
    assert backend.read(lease_name) is None
    assert kinds(backend, lease_name) == [("acquired", "late"), ("released", "late")]


def test_grant_answered_after_the_attempt_gave_up_is_handed_back_once(
    backend: Backend, lease_name: str
) -> None:
    timing = Timing(3.0, 1.0, 0.1)
    store = Slow(backend, acquire_delay=0.5)
    caller = StoreCaller(store, lease_name)
    with pytest.raises(TimeoutError):
        attempt(store, caller, lease_name, "late", timing, 0.1, "test")
    caller.close()  # the hung call goes on on its own thread, and hands the grant back
    wait_until(lambda: store.releases == 1, timeout=WAIT, message="the grant was not handed back")
    wait_until(
        lambda: kinds(backend, lease_name) == [("acquired", "late"), ("released", "late")],
        timeout=WAIT,
        message=lambda: f"history: {kinds(backend, lease_name)}",
    )
    time.sleep(0.2)  # nothing more comes: a second hand-back would show within it
    assert store.releases == 1 and backend.read(lease_name) is None


# -- fenced(): a held lease (its copies, its renewals) and a snapshot -----------------------
def test_fenced_follows_a_held_lease_not_a_snapshot(backend: Backend, lease_name: str) -> None:
    timing = Timing(3.0, 0.2, 0.1)
    lease, caller = granted(backend, lease_name, timing)
    assert not hasattr(lease, "backend")  # a plain value: no store inside
    term = Term(backend, lease, timing, caller, sender=None, label="test")
    term.begin()
    first = lease.expires_at
    wait_until(lambda: lease.expires_at != first, timeout=WAIT, message="no renewal")
    copy = dataclasses.replace(lease)
    snapshot = backend.read(lease_name)
    assert snapshot is not None and snapshot.token == lease.token
    for held in (lease, copy):
        with held.fenced():  # Redis: the fence row in the settings' database
            pass
    with pytest.raises(LeadershipLost, match="snapshot"), snapshot.fenced():
        pytest.fail("fenced() entered on a snapshot")
    term.end()
    caller.close()
    with pytest.raises(LeadershipLost), lease.fenced():
        pytest.fail("fenced() entered on a released lease")


def test_a_term_is_renewed_by_its_session_until_it_ends(backend: Backend, lease_name: str) -> None:
    timing = Timing(3.0, 0.2, 0.1)
    lease, caller = granted(backend, lease_name, timing)
    term = Term(backend, lease, timing, caller, sender=None, label="test")
    term.begin()
    renewals = session.session(backend)
    assert renewals.leases == 1
    renewed = lease.renewed_at
    wait_until(lambda: lease.renewed_at != renewed, timeout=10, message="never renewed")
    term.end()
    caller.shutdown(wait=True)
    assert renewals.leases == 0
    assert not any(t.name.startswith(f"leader-io:{lease_name}#") for t in threading.enumerate())


class Refusing(FaultyBackend):
    """A real store whose renewals are refused on demand (the store itself still holds
    the lease: its holder can release it)."""

    refuse = False

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        return None if self.refuse else self.real.renew(lease, ttl)


def test_a_refusal_racing_the_end_is_not_reported_after_the_release(
    db_backend: Backend, lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session applies a refusal while the holder ends the term: once the lease was
    released (``lease_released`` sent), no LOST is logged or recorded, no ``on_lost``
    runs (old code: a LOST history row and ``on_lost`` after ``lease_released``)."""
    store = Refusing(db_backend)
    timing = Timing(3.0, 0.3, 0.2)
    lease, caller = granted(store, lease_name, timing)
    sender = object()
    order: list[str] = []
    refused, go, applied = threading.Event(), threading.Event(), threading.Event()

    def observer(event: str, name: str, value: float) -> None:
        if event == "renew_refused" and name == lease_name:
            refused.set()  # the session loop, between taking the answer and applying it
            go.wait(WAIT)

    lost_in_session = Renewer._lost_in_session

    def marked(renewer: Renewer, cause: LossReason, detail: str = "") -> None:
        lost_in_session(renewer, cause, detail)
        applied.set()

    monkeypatch.setattr(Renewer, "_lost_in_session", marked)
    hooks.add_observer(observer)
    try:
        with (
            received(signals.lease_released, sender) as released,
            received(signals.leader_lost, sender) as lost,
        ):
            term = Term(
                store,
                lease,
                timing,
                caller,
                sender=sender,
                label="test",
                on_lost=lambda term: order.append("on_lost"),
            )
            term.begin()
            store.refuse = True
            assert refused.wait(WAIT)
            assert term.end() is True  # released: the store still held it
            order.append("lease_released")
            go.set()
            assert applied.wait(WAIT)
            # Whatever the refusal queued has run: the report on the session's caller,
            # then the history record on the term's caller.
            session.session(store).call(WAIT, lambda: None)
            caller.call(WAIT, lambda: None)
    finally:
        go.set()
        hooks.remove_observer(observer)
    caller.close()
    assert released == [lease] and lost == []
    assert order == ["lease_released"]
    assert kinds(db_backend, lease_name) == [("acquired", "alice"), ("released", "alice")]
