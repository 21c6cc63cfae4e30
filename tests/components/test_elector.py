"""The election loop against real stores, with faults injected into renewals."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from django_leader import Elector, Lease, current_lease, signals
from django_leader.election import Candidate
from django_leader.lease import clock
from django_leader.models import Lease as LeaseRow
from django_leader.models import LeaseEvent
from tests.support.electing import start
from tests.support.faults import FaultyBackend
from tests.support.stores import history, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "retry_interval": 0.1}
WAIT = 10.0  # generous bound for anything that should happen "soon"


def test_elected_then_stop_releases_to_follower(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    events: list[tuple[str, str, int]] = []

    def note(kind: str) -> Any:
        return lambda lease: events.append((kind, lease.holder, lease.token))

    first = start(
        electors,
        Elector(
            lease_name,
            identity="first",
            backend=backend,
            on_elected=note("elected"),
            on_lost=note("lost"),
            **FAST,
        ),
    )
    assert first.wait_for_leadership(WAIT)
    assert first.is_leader and first.lease is not None
    assert first.leader().holder == "first"
    second = start(
        electors,
        Elector(lease_name, identity="second", backend=backend, **{**FAST, "retry_interval": 0.05}),
    )
    assert not second.wait_for_leadership(0.5)

    first.stop()
    assert not first.is_leader and first.lease is None
    assert second.wait_for_leadership(WAIT)
    assert second.lease.token == first_token(events) + 1
    token = first_token(events)
    assert events == [("elected", "first", token), ("lost", "first", token)]
    kinds = [event[:2] for event in history(backend, lease_name)]
    assert kinds == [("acquired", "first"), ("released", "first"), ("acquired", "second")]


def first_token(events: list[tuple[str, str, int]]) -> int:
    return events[0][2]


def test_work_gets_lease_and_is_waited_for(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    seen: dict[str, Any] = {}
    finished = threading.Event()

    def work(lease: Lease) -> None:
        seen["current"] = current_lease()
        seen["lease"] = lease
        lease.lost.wait()
        # Still winding down: the lease must not be handed on yet.
        seen["held_while_winding_down"] = backend.read(lease_name)
        time.sleep(0.3)  # winding down takes a moment; stop() must wait for it
        finished.set()

    elector = start(electors, Elector(lease_name, identity="w", backend=backend, **FAST), work)
    assert elector.wait_for_leadership(WAIT)
    elector.stop()
    assert finished.is_set()  # stop() returned only after the work did
    assert seen["current"] is seen["lease"]
    assert seen["lease"].lost.is_set()
    assert seen["held_while_winding_down"].token == seen["lease"].token
    assert backend.read(lease_name) is None  # released after the work returned
    assert current_lease() is None


def test_work_that_raises_hands_leadership_on(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    def broken(lease: Lease) -> None:
        raise RuntimeError("boom")

    first = start(
        electors,
        Elector(lease_name, identity="broken", backend=backend, **{**FAST, "retry_interval": 1.0}),
        broken,
    )
    assert first.wait_for_leadership(WAIT)
    second = start(
        electors,
        Elector(
            lease_name, identity="healthy", backend=backend, **{**FAST, "retry_interval": 0.05}
        ),
        lambda lease: lease.lost.wait(),
    )
    assert second.wait_for_leadership(WAIT)
    assert second.lease.holder == "healthy"


def test_steps_down_at_deadline_while_renew_hangs(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    faulty = FaultyBackend(backend)
    lost = threading.Event()
    lost_at: list[float] = []
    elector = Elector(
        lease_name,
        identity="hangs",
        backend=faulty,
        on_lost=lambda lease: (lost_at.append(clock()), lost.set()),  # type: ignore[func-returns-value]
        **FAST,
    )
    start(electors, elector)
    assert elector.wait_for_leadership(WAIT)
    lease = elector.lease
    faulty.hang_renew.set()
    faulty.renew_started.clear()
    assert faulty.renew_started.wait(WAIT)  # a renewal is now in flight, and hangs
    assert lost.wait(WAIT)
    # The renewer (its call still in flight) or the elector (waking at the deadline) says so.
    assert lease.lost.is_set()
    assert lease.lost_reason in (
        "deadline passed while a renewal was still in flight",
        "local deadline passed",
    )
    assert lost_at[0] >= lease.deadline  # not before its deadline...
    # ...and before the store could give the lease away (its expiry is later still).
    assert backend.read(lease_name) is not None or lost_at[0] < lease.deadline + 0.5
    assert not elector.is_leader
    with pytest.raises(Exception, match="lost"):
        lease.check()
    faulty.unblock.set()  # the hung call returns; the lease must not come back to life
    assert faulty.hung_renew_returned.wait(WAIT)
    assert not lease.held


def test_transient_renew_errors_are_retried(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    faulty = FaultyBackend(backend)
    elector = start(electors, Elector(lease_name, identity="flaky", backend=faulty, **FAST))
    assert elector.wait_for_leadership(WAIT)
    token = elector.lease.token
    faulty.fail_renew = 1
    calls = faulty.renew_calls
    wait_until(
        lambda: faulty.renew_calls >= calls + 3,
        timeout=WAIT,
        message=lambda: f"{faulty.renew_calls - calls} renewals since the failure",
    )
    assert faulty.fail_renew == 0
    assert elector.is_leader and elector.lease.token == token


def test_force_release_makes_holder_step_down(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    lost_signals: list[Lease] = []

    def receiver(sender: Any, lease: Lease, **kwargs: Any) -> None:
        lost_signals.append(lease)

    signals.leader_lost.connect(receiver)
    try:
        elector = start(
            electors,
            Elector(
                lease_name, identity="victim", backend=backend, **{**FAST, "retry_interval": 5.0}
            ),
        )
        assert elector.wait_for_leadership(WAIT)
        lease = elector.lease
        backend.force_release(lease_name, actor="ops")
        assert lease.lost.wait(WAIT)
        assert "refused" in lease.lost_reason
        wait_until(lambda: lost_signals, timeout=WAIT, message="no leader_lost signal")
        assert lost_signals == [lease]
        wait_until(
            lambda: "lost" in [event[0] for event in history(backend, lease_name)],
            timeout=WAIT,
            message="no lost event recorded",
        )
    finally:
        signals.leader_lost.disconnect(receiver)


def test_signals_and_new_leader_callback(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    received: list[tuple[str, Any, int]] = []

    def on(kind: str) -> Any:
        def receiver(sender: Any, lease: Lease, **kwargs: Any) -> None:
            if lease.name == lease_name:
                received.append((kind, sender, lease.token))

        return receiver

    handlers = {signals.leader_elected: on("elected"), signals.lease_released: on("released")}
    for signal, handler in handlers.items():
        signal.connect(handler)
    try:
        leader = start(electors, Elector(lease_name, identity="leader", backend=backend, **FAST))
        assert leader.wait_for_leadership(WAIT)
        observed: list[str] = []
        follower = start(
            electors,
            Elector(
                lease_name,
                identity="follower",
                backend=backend,
                on_new_leader=lambda lease: observed.append(lease.holder),
                **FAST,
            ),
        )
        wait_until(lambda: observed, timeout=WAIT, message="on_new_leader never called")
        assert observed[:1] == ["leader"]
        leader.stop()
        assert follower.wait_for_leadership(WAIT)
        assert observed[-1] == "follower"
        # leader_elected is sent just after wait_for_leadership() can return: wait for it.
        wait_until(
            lambda: any(r[0] == "elected" and r[1] is follower for r in received),
            timeout=WAIT,
            message=lambda: received,
        )
        # The two electors' signals may interleave; each one's own come in order.
        mine = [r for r in received if r[1] is leader]
        token = mine[0][2]
        assert mine == [("elected", leader, token), ("released", leader, token)]
        assert ("elected", follower, token + 1) in received
    finally:
        for signal, handler in handlers.items():
            signal.disconnect(handler)


def test_stop_without_release_leaves_lease_to_expire(backend: Any, lease_name: str) -> None:
    elector = Elector(lease_name, identity="keeps", backend=backend, **FAST)
    elector.start()
    assert elector.wait_for_leadership(WAIT)
    elector.stop(release=False, timeout=WAIT)
    assert not elector.is_leader
    assert backend.read(lease_name).holder == "keeps"


def test_followers_are_listed_as_candidates_until_they_stop(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    leader = start(electors, Elector(lease_name, identity="c-leader", backend=backend, **FAST))
    assert leader.wait_for_leadership(WAIT)
    slow: dict[str, Any] = {
        "ttl": 6.0,
        "renew_interval": 1.0,
        "retry_interval": 0.1,
    }  # candidacy: 6 s
    followers = [
        start(electors, Elector(lease_name, identity=f"c-follower-{i}", backend=backend, **slow))
        for i in range(2)
    ]

    def waiting() -> list[str]:
        held = backend.read(lease_name)
        return sorted(
            c.identity
            for c in backend.candidates(lease_name)
            if held is None or c.identity != held.holder
        )

    wait_until(
        lambda: waiting() == ["c-follower-0", "c-follower-1"],
        timeout=WAIT,
        message=lambda: backend.candidates(lease_name),
    )
    followers[0].stop(timeout=WAIT)  # withdraws, not only lets its candidacy expire
    wait_until(
        lambda: waiting() == ["c-follower-1"],
        timeout=2.0,  # well before its candidacy would expire (6 s)
        message=lambda: backend.candidates(lease_name),
    )
    leader.stop(timeout=WAIT)  # the follower takes over; the old leader is no candidate
    assert followers[1].wait_for_leadership(WAIT)
    assert "c-leader" not in [c.identity for c in backend.candidates(lease_name)]


def test_run_twice_at_once_is_refused(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    elector = start(electors, Elector(lease_name, backend=backend, **FAST))
    assert elector.wait_for_leadership(WAIT)
    with pytest.raises(RuntimeError, match="already running"):
        elector.run()


NAME_ERRORS = [
    ({"name": ""}, ValueError, "empty"),
    ({"name": "   "}, ValueError, "empty"),
    ({"name": "x" * 201}, ValueError, "at most 200"),
    ({"name": 42}, TypeError, "str"),
    ({"name": None}, TypeError, "str"),
    ({"name": "bad\nname"}, ValueError, "control"),
    ({"name": "trailing "}, ValueError, "white space"),
    ({"ttl": 0}, ValueError, "ttl must be greater than 0"),
    ({"ttl": -5}, ValueError, "ttl must be greater than 0"),
    ({"ttl": "15"}, ValueError, "ttl must be a number"),
    ({"ttl": float("nan")}, ValueError, "ttl must be greater than 0"),
    ({"identity": ""}, ValueError, "identity"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        *NAME_ERRORS,
        ({"ttl": 10, "renew_interval": 10}, ValueError, "renew_interval must be less than ttl / 2"),
        ({"ttl": 10, "renew_interval": 5}, ValueError, "renew_interval must be less than ttl / 2"),
        ({"renew_interval": 100}, ValueError, "renew_interval must be less than ttl / 2"),
        ({"retry_interval": 0}, ValueError, "retry_interval must be greater than 0"),
    ],
)
def test_elector_bad_input_is_refused_and_writes_nothing(
    db_alias: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    args = {"name": "valid-name", **kwargs}
    before = LeaseRow.objects.using(db_alias).count(), LeaseEvent.objects.using(db_alias).count()
    with pytest.raises(error, match=message):
        Elector(args.pop("name"), **args)
    after = LeaseRow.objects.using(db_alias).count(), LeaseEvent.objects.using(db_alias).count()
    assert before == after


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [*NAME_ERRORS, ({"timeout": -1}, ValueError, "timeout must be")],
)
def test_lock_bad_input_is_refused_and_writes_nothing(
    db_alias: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    from django_leader import lock

    args = {"name": "valid-name", **kwargs}
    before = LeaseRow.objects.using(db_alias).count(), LeaseEvent.objects.using(db_alias).count()
    with pytest.raises(error, match=message), lock(args.pop("name"), **args):
        pytest.fail("entered the block")
    after = LeaseRow.objects.using(db_alias).count(), LeaseEvent.objects.using(db_alias).count()
    assert before == after


def test_stop_called_from_work_does_not_deadlock(backend: Any, lease_name: str) -> None:
    elector = Elector(lease_name, identity="self-stopping", backend=backend, **FAST)

    def work(lease: Lease) -> None:
        elector.stop()  # asks; must not wait for itself

    thread = elector.start(work)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert backend.read(lease_name) is None  # released on the way out


def test_run_again_after_stop(backend: Any, lease_name: str) -> None:
    elector = Elector(lease_name, identity="again", backend=backend, **FAST)
    for _ in range(2):
        elected = threading.Event()
        runner = threading.Thread(
            target=elector.run, args=(lambda lease, elected=elected: elected.set(),)
        )
        runner.start()
        assert elected.wait(WAIT)
        elector.stop()
        runner.join(WAIT)
        assert not runner.is_alive()


def test_stop_waits_for_run_in_another_thread(backend: Any, lease_name: str) -> None:
    """stop() returns once run() has stepped down and released, as with start()."""
    elector = Elector(lease_name, identity="runs", backend=backend, **FAST)
    wound_down = threading.Event()

    def work(lease: Lease) -> None:
        lease.lost.wait()
        time.sleep(0.3)  # winding down takes a moment; stop() must wait for it
        wound_down.set()

    runner = threading.Thread(target=elector.run, args=(work,), daemon=True)
    runner.start()
    assert elector.wait_for_leadership(WAIT)
    elector.stop(timeout=WAIT)
    assert wound_down.is_set()
    assert backend.read(lease_name) is None  # released before stop() returned
    runner.join(WAIT)
    assert not runner.is_alive()


def test_failed_announcement_backs_off_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A store that cannot record candidates (table not migrated) costs one warning and
    one attempt per back-off, not one per retry."""
    from django_leader import BackendUnavailable
    from django_leader.testing import MemoryBackend

    class NoCandidates(MemoryBackend):
        announced = 0
        attempts = 0

        def acquire(self, name: str, holder: str, ttl: float) -> Any:
            self.attempts += 1
            return super().acquire(name, holder, ttl)

        def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
            self.announced += 1
            raise BackendUnavailable("no such table: django_leader_leasecandidate")

    store = NoCandidates()
    store.pin("busy")  # held elsewhere for ever: the elector stays a follower
    elector = Elector("busy", backend=store, ttl=1.5, renew_interval=0.3, retry_interval=0.05)
    elector.start()
    # Some 30 campaign attempts, each after a retry_interval: more than two
    # announcement periods (ttl / 3) pass meanwhile.
    wait_until(
        lambda: store.attempts >= 30,
        timeout=WAIT,
        message=lambda: f"{store.attempts} campaign attempts",
    )
    elector.stop(timeout=WAIT)
    assert store.announced == 1
    warnings = [r for r in caplog.records if "could not announce" in r.getMessage()]
    assert len(warnings) == 1 and "no such table" in warnings[0].getMessage()


def test_start_right_after_stop_is_never_refused() -> None:
    """stop() returns once the campaign thread is gone, so start() may follow at once."""
    import sys

    from django_leader.testing import MemoryBackend

    store = MemoryBackend()
    elector = Elector("restart-quickly", identity="quick", backend=store, **FAST)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave threads as much as possible
    try:
        for _ in range(100):
            elector.start()  # RuntimeError("already running") if stop() returned early
            elector.stop(timeout=WAIT)
    finally:
        sys.setswitchinterval(switch)
    assert store.read("restart-quickly") is None


def test_short_ttl_gets_store_calls_bounded_by_its_own_deadline(db_alias: str) -> None:
    from django.test import override_settings

    from django_leader import lock
    from django_leader.conf import resolve_timing

    with override_settings(DJANGO_LEADER={"DATABASE": db_alias}):
        short = Elector("short-ttl", ttl=1.0)
        # Rounded down to a few steps (a bounded number of backends): never longer.
        wanted = resolve_timing(1.0).call_timeout
        store: Any = short.backend  # a DatabaseBackend: it has its own call timeout
        timeout = store.timeout
        assert wanted / 2 < timeout <= wanted
        assert timeout < 1.0 - short.timing.safety_margin
        assert lock("short-ttl", ttl=1.0).backend is short.backend
        default = Elector("default-ttl")
        store = default.backend
        assert store.timeout == pytest.approx(resolve_timing().call_timeout)


def test_loss_seen_first_by_a_reader_is_still_reported(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    """`lease.held` read at the deadline marks the lease lost; the renewer must still
    report it (on_lost, the lost event), not take it as already handled."""
    faulty = FaultyBackend(backend)
    lost = threading.Event()
    elector = start(
        electors,
        Elector(
            lease_name, identity="watched", backend=faulty, on_lost=lambda lease: lost.set(), **FAST
        ),
    )
    assert elector.wait_for_leadership(WAIT)
    lease = elector.lease
    faulty.hang_renew.set()
    # This thread races the renewer to see the deadline pass.
    wait_until(lambda: not lease.held, timeout=WAIT, interval=0.001, message="still held")
    assert lost.wait(WAIT)
    faulty.unblock.set()
    wait_until(
        lambda: "lost" in [event[0] for event in history(backend, lease_name)],
        timeout=WAIT,
        message="no lost event recorded",
    )


def test_unexpected_store_error_does_not_end_the_campaign(
    backend: Any, lease_name: str, electors: list[Elector]
) -> None:
    faulty = FaultyBackend(backend)
    calls = {"n": 0}
    real_acquire = faulty.acquire

    def flaky_acquire(name: str, holder: str, ttl: float) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a foreign backend's bug")
        return real_acquire(name, holder, ttl)

    faulty.acquire = flaky_acquire  # type: ignore[method-assign]
    elector = start(electors, Elector(lease_name, identity="survivor", backend=faulty, **FAST))
    assert elector.wait_for_leadership(WAIT)
    assert calls["n"] >= 2
