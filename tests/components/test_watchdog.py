"""The Elector's watchdog (``Elector(watchdog=S)``, ``lease.heartbeat()``) against real
stores, ``Elector.stuck_for``, and the liveness view that reads it."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.test import Client, RequestFactory

from django_leader import Elector, Lease
from django_leader.lease import LossReason, clock
from django_leader.testing import MemoryBackend, leader_backend
from tests.support.electing import start
from tests.support.stores import history, stores_db
from tests.support.waiting import wait_until

__all__ = ["leader_backend"]  # the fixture, imported for use below

TTL, RENEW, RETRY = 1.5, 0.3, 0.1
FAST: dict[str, Any] = {"ttl": TTL, "renew_interval": RENEW, "retry_interval": RETRY}
WATCHDOG = 0.8
WAIT = 10.0


class Hangs:
    """A work that calls ``lease.heartbeat()`` every 50 ms until :meth:`hang`, then
    deadlocks (deaf to ``lease.lost``) until :meth:`resume`."""

    def __init__(self) -> None:
        self.hung = threading.Event()
        self.resumed = threading.Event()
        self.last_beat = 0.0  # clock() just before the last heartbeat() call
        self.beats = 0

    def __call__(self, lease: Lease) -> None:
        while not self.hung.is_set():
            self.last_beat = clock()
            lease.heartbeat()
            self.beats += 1
            self.hung.wait(0.05)
        self.resumed.wait()

    def hang(self) -> None:
        self.hung.set()

    def resume(self) -> None:
        self.resumed.set()


def live(grace: float | str | None = None) -> tuple[int, dict[str, Any]]:
    """The liveness view's status and body, through the URLconf."""
    url = "/leader/live/" if grace is None else f"/leader/live/?grace={grace}"
    response = Client().get(url)
    return response.status_code, response.json()


def live_view(grace: float) -> tuple[int, dict[str, Any]]:
    """The same, called directly: a test on the stores (``stores_db``) runs with only this
    project's apps, and a request through the middleware needs django.contrib.auth."""
    from django_leader import views

    response = views.live(RequestFactory().get("/leader/live/", {"grace": grace}))
    return response.status_code, json.loads(response.content)


class Acts:
    """What the works did, in the order they did it: ``(identity, token, clock())``."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()
        self._acted: dict[str, threading.Event] = {}

    def act(self, identity: str, lease: Lease) -> None:
        with self._lock:
            self.done.append((identity, lease.token, clock()))
        self._event(identity).set()

    def _event(self, identity: str) -> threading.Event:
        with self._lock:
            return self._acted.setdefault(identity, threading.Event())

    def wait(self, identity: str, timeout: float) -> bool:
        """Until ``identity`` acted (True), at most ``timeout`` seconds."""
        return self._event(identity).wait(timeout)

    def of(self, identity: str) -> list[float]:
        with self._lock:
            return [at for who, _, at in self.done if who == identity]


class HangsThenActs(Hangs):
    """:class:`Hangs`, and once resumed it acts with its lease, unchecked (the write of a
    work that was stuck, not dead), and returns."""

    def __init__(self, acts: Acts, identity: str) -> None:
        super().__init__()
        self.acts, self.identity = acts, identity

    def __call__(self, lease: Lease) -> None:
        super().__call__(lease)
        self.acts.act(self.identity, lease)


def acts_then_waits(acts: Acts, identity: str) -> Any:
    """A work that acts once elected, then waits for ``lease.lost``."""

    def work(lease: Lease) -> None:
        acts.act(identity, lease)
        lease.lost.wait()

    return work


@stores_db
def test_stuck_work_keeps_the_lease_until_it_returns(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    """The watchdog fires: the elector steps down at once (lease.lost, on_lost, is_leader
    False, stuck_for), but keeps the lease renewed until the stuck work returns, then
    releases it: no other candidate acts while the stuck work still may."""
    acts = Acts()
    work = HangsThenActs(acts, "stuck")
    lost_called = threading.Event()
    stuck_when_told: list[float | None] = []

    def on_lost(lease: Lease) -> None:
        # stuck_for counts from the term's end, which is before anyone hears of it.
        stuck_when_told.append(first.stuck_for)
        lost_called.set()

    first = start(
        electors,
        Elector(
            lease_name,
            identity="stuck",
            backend=backend,
            watchdog=WATCHDOG,
            on_lost=on_lost,
            **FAST,
        ),
        work,
    )
    try:
        assert first.wait_for_leadership(WAIT)
        lease = first.lease
        assert lease is not None
        second = start(
            electors,
            Elector(lease_name, identity="second", backend=backend, **FAST),
            acts_then_waits(acts, "second"),
        )
        wait_until(lambda: work.beats >= 3, timeout=WAIT, message="the work does not beat")
        assert first.stuck_for is None

        work.hang()
        assert lease.lost.wait(WAIT)
        lost_after = clock() - work.last_beat
        assert lease.lost_cause is LossReason.WATCHDOG, lease.lost_reason
        # The acceptance bound: the elector steps down within watchdog + RENEW_INTERVAL.
        assert lost_after <= WATCHDOG + RENEW, lost_after
        assert lost_called.wait(WAIT)
        assert stuck_when_told[0] is not None, stuck_when_told
        assert not first.is_leader and first.lease is None
        stuck_for = first.stuck_for
        assert stuck_for is not None and stuck_for >= stuck_when_told[0]
        status, body = live_view(grace=0)
        assert status == 503, body
        # Anyone: the stuck name, not its identity (HEALTH_DETAILS names no "holder").
        assert {"name": lease_name, "identity": None}.items() <= body["stuck"][0].items()

        # Twice the TTL: an unrenewed lease would have expired by then, and a released one
        # been taken within RETRY_INTERVAL, and acted on.
        acted_while_stuck = acts.wait("second", 2 * TTL)
        while_stuck = backend.read(lease_name)
    finally:
        work.resume()
    wait_until(lambda: first.stuck_for is None, timeout=WAIT, message="the work never returned")
    assert second.wait_for_leadership(WAIT)
    wait_until(lambda: acts.of("second"), timeout=WAIT, message="the second never acted")
    print(f"acts (identity, token, clock): {acts.done}")
    assert max(acts.of("stuck")) < min(acts.of("second")), (
        f"the next leader acted before the stuck work returned: {acts.done}"
    )
    assert not acted_while_stuck
    assert while_stuck is not None and while_stuck.holder == "stuck", while_stuck
    assert while_stuck.token == lease.token
    assert second.lease is not None and second.lease.token > lease.token
    status, body = live_view(grace=0)
    assert status == 200 and body["stuck"] == [], body
    # Released once the work returned (not left to expire): the second took it at once.
    events = [event[:2] for event in history(backend, lease_name)]
    assert events[:3] == [("acquired", "stuck"), ("released", "stuck"), ("acquired", "second")]


@stores_db
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # any store will do
@pytest.mark.parametrize("release", [True, False])
def test_stop_while_stuck_waits_for_the_work(
    backend: Any, lease_name: str, electors: list[Elector], release: bool
) -> None:
    """``stop()`` after the watchdog fired: the lease stays renewed while the stuck work
    runs; once it returns it is released (``release=True``) or left to expire."""
    acts = Acts()
    work = HangsThenActs(acts, "stuck")
    first = start(
        electors,
        Elector(lease_name, identity="stuck", backend=backend, watchdog=WATCHDOG, **FAST),
        work,
    )
    try:
        assert first.wait_for_leadership(WAIT)
        lease = first.lease
        assert lease is not None
        second = start(
            electors,
            Elector(lease_name, identity="second", backend=backend, **FAST),
            acts_then_waits(acts, "second"),
        )
        work.hang()
        assert lease.lost.wait(WAIT)
        first.stop(release=release, timeout=0.1)  # the work runs on: it cannot wait for it
        assert first.stuck_for is not None
        acted_while_stuck = acts.wait("second", 2 * TTL)
        while_stuck = backend.read(lease_name)
    finally:
        work.resume()
    first.stop(release=release, timeout=WAIT)  # now it ends (stop() has the last word)
    assert second.wait_for_leadership(WAIT)
    wait_until(lambda: acts.of("second"), timeout=WAIT, message="the second never acted")
    assert max(acts.of("stuck")) < min(acts.of("second")), acts.done
    assert not acted_while_stuck
    assert while_stuck is not None and while_stuck.holder == "stuck", while_stuck
    events = [event[:2] for event in history(backend, lease_name)]
    assert events[:2] == [
        ("acquired", "stuck"),
        ("released", "stuck") if release else ("taken_over", "second"),
    ], events


@stores_db
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # any store will do
def test_work_that_keeps_beating_keeps_the_lease(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    work = Hangs()
    first = start(
        electors,
        Elector(lease_name, identity="beating", backend=backend, watchdog=0.3, **FAST),
        work,
    )
    try:
        assert first.wait_for_leadership(WAIT)
        lease = first.lease
        assert lease is not None
        second = start(electors, Elector(lease_name, identity="second", backend=backend, **FAST))
        # Four watchdog periods of beating: the watchdog must not fire meanwhile.
        time.sleep(1.2)
        assert work.beats >= 8
        assert first.is_leader and first.lease is lease and not lease.lost.is_set()
        assert first.stuck_for is None
        assert not second.is_leader
        assert backend.read(lease_name).holder == "beating"
    finally:
        work.hang()
        work.resume()


def test_live_view_waits_for_the_grace_period(
    leader_backend: MemoryBackend, electors: list[Elector]
) -> None:
    """Without ``?grace=``, the grace period is each elector's ttl; a bad one is a 400."""
    work = Hangs()
    elector = start(electors, Elector("live-view", identity="stuck", watchdog=0.2, **FAST), work)
    try:
        assert elector.wait_for_leadership(WAIT)
        work.hang()
        stuck_for = wait_until(
            lambda: elector.stuck_for, timeout=WAIT, message="the watchdog did not fire"
        )
        if stuck_for < TTL:  # the call below raced the grace period: tell it
            status, body = live()
            assert status == 200 and body["live"] is True and body["electors"] >= 1, body
        wait_until(
            lambda: (elector.stuck_for or 0) > TTL, timeout=WAIT, message="not stuck past ttl"
        )
        status, body = live()
        assert status == 503 and body["live"] is False, body
        assert body["stuck"][0]["grace"] == TTL and body["stuck"][0]["stuck_for"] > TTL
        assert live(grace=60)[0] == 200
        for bad in ("x", "-1", "nan", "inf"):
            status, body = live(grace=bad)
            assert status == 400 and "grace must be" in body["error"], body
    finally:
        work.resume()
    wait_until(lambda: elector.stuck_for is None, timeout=WAIT, message="the work never returned")
    assert live()[0] == 200
