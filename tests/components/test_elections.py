"""Elections in one process: the modes (race, fifo, priority), hand-over, wake-ups, the
candidate registry and its signals, ``observe()``.

The logic runs on ``MemoryBackend``; what a store decides (the join order of its registry,
its hand-over gate, its wake-ups) runs on every real store as well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_leader import Elector, Lease, jitter, signals
from django_leader.backends.base import Backend
from django_leader.election import Candidate, Mode
from django_leader.elector import handover_window
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import LossReason, clock
from django_leader.observe import observe
from django_leader.testing import MemoryBackend
from tests.support.electing import start
from tests.support.faults import FaultyBackend
from tests.support.stores import (
    CACHE_STORES,
    DATABASE_STORES,
    OTHER_STORES,
    history,
    open_store,
    stores_db,
)
from tests.support.waiting import wait_until

# Each store call bounded at 0.6 s: with ttl 1.5 s (calls bounded at 0.3 s) a newcomer's
# announcements to Redis timed out for 10 s in a make test on a machine kept busy by
# stress-ng --cpu 1, and it never joined the queue.
FAST: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.6, "retry_interval": 0.2}
WAIT = 10.0  # generous bound for anything that should happen "soon"

# Every store, and MemoryBackend: for what a store decides (its registry's join order, its
# hand-over gate). The real stores need the database set up (their history is there).
ANY_STORE = [
    "memory",
    *(
        pytest.param(store, marks=stores_db)
        for store in [*DATABASE_STORES, *CACHE_STORES, *OTHER_STORES]
    ),
]


@pytest.fixture(params=ANY_STORE)
def any_store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
    else:
        yield from open_store(request.param)


@pytest.fixture
def memory() -> MemoryBackend:
    return MemoryBackend()


def queued(store: Backend, name: str) -> list[str]:
    """The identities in the store's registry of ``name``, in join order."""
    return [c.identity for c in store.candidates(name) or []]


def wait_queued(store: Backend, name: str, identity: str) -> None:
    wait_until(
        lambda: identity in queued(store, name),
        timeout=WAIT,
        message=lambda: f"{identity} never joined: {queued(store, name)}",
    )


def story(store: Backend, name: str) -> list[tuple[str, str]]:
    """``(kind, holder)`` of what the store decided about ``name``, oldest first:
    acquisitions, releases, hand-over requests."""
    if isinstance(store, MemoryBackend):
        events = [(kind, holder) for kind, n, holder, _ in store.events if n == name]
    else:
        events = [(kind, holder) for kind, holder, *_ in history(store, name)]
    return [(k, h) for k, h in events if k in ("acquired", "taken_over", "released", "handover")]


class Recorder:
    """Receives signals (those about ``name`` only) and callbacks, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str]] = []
        self._connected: list[tuple[Any, Callable[..., None]]] = []

    def note(self, kind: str, who: str) -> None:
        with self.lock:
            self.seen.append((kind, who))

    def callback(self, kind: str) -> Callable[[Lease], None]:
        return lambda lease: self.note(kind, lease.holder)

    def connect(self, signal: Any, kind: str) -> None:
        def receiver(sender: Any, name: str, candidate: Candidate, **kwargs: Any) -> None:
            if name == self.name:
                self.note(kind, candidate.identity)

        signal.connect(receiver)
        self._connected.append((signal, receiver))

    def disconnect(self) -> None:
        for signal, receiver in self._connected:
            signal.disconnect(receiver)

    def kinds(self, who: str) -> list[str]:
        with self.lock:
            return [kind for kind, w in self.seen if w == who]


@pytest.fixture
def membership(lease_name: str) -> Iterator[Recorder]:
    recorder = Recorder(lease_name)
    recorder.connect(signals.candidate_joined, "joined")
    recorder.connect(signals.candidate_left, "left")
    recorder.connect(signals.candidate_expired, "expired")
    yield recorder
    recorder.disconnect()


# -- fifo -----------------------------------------------------------------------------------------
def test_fifo_takes_turns_in_join_order(
    any_store: Backend, lease_name: str, electors: list[Elector]
) -> None:
    """Each leader steps down once the other two are queued; whoever joined first leads
    next, and the one that stepped down joins at the tail — although every follower polls
    every 0.1 s and would win a race now and then."""
    elected: list[str] = []
    done = threading.Event()
    by_identity: dict[str, Elector] = {}

    def work(lease: Lease) -> None:
        elected.append(lease.holder)
        if len(elected) >= 7:
            done.set()
            return
        others = {"a", "b", "c"} - {lease.holder}
        wait_until(
            lambda: set(queued(any_store, lease_name)) == others or lease.lost.is_set(),
            timeout=WAIT,
            message=lambda: f"{lease.holder}: queue {queued(any_store, lease_name)}",
        )
        by_identity[lease.holder].resign()

    def make(identity: str) -> Elector:
        elector = Elector(lease_name, identity=identity, backend=any_store, mode="fifo", **FAST)
        by_identity[identity] = elector
        return elector

    a = start(electors, make("a"), work)
    assert a.wait_for_leadership(WAIT)
    start(electors, make("b"), work)
    wait_queued(any_store, lease_name, "b")
    start(electors, make("c"), work)
    assert done.wait(WAIT), elected
    assert elected == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_leader_that_handed_over_to_a_dead_candidate_leads_again_at_once(
    memory: MemoryBackend, lease_name: str, electors: list[Elector]
) -> None:
    """priority: a higher-priority candidate is listed, but dead (its last heartbeat has
    not run out yet). The leader hands over to it once; when it does not take the lease,
    the leader takes it back after one retry_interval — not when the dead candidacy expires
    (30 s here) — and does not hand over to it again while it gives no sign of life."""
    low = start(
        electors,
        Elector(lease_name, identity="low", backend=memory, mode="priority", priority=1, **FAST),
    )
    assert low.wait_for_leadership(WAIT)
    first = low.lease
    assert first is not None
    memory.announce(lease_name, Candidate("ghost", priority=9), 30.0)  # then never again
    assert first.lost.wait(WAIT), "the leader never handed over"
    assert first.lost_cause is LossReason.HANDED_OVER, first.lost_reason
    handed = clock()
    assert low.wait_for_leadership(WAIT)
    again = low.lease
    assert again is not None and again.token > first.token
    bound = FAST["retry_interval"] + FAST["renew_interval"] + 1.0
    assert clock() - handed <= bound, clock() - handed
    # Several registry reads later (one per renew_interval) it still leads.
    time.sleep(4 * FAST["renew_interval"])  # the behaviour: no second hand-over meanwhile
    assert low.lease is again and not again.lost.is_set()


# -- priority -------------------------------------------------------------------------------------
def test_a_higher_priority_newcomer_takes_over_at_the_next_renewal(
    any_store: Backend, lease_name: str, electors: list[Elector]
) -> None:
    events = Recorder(lease_name)

    def make(identity: str, priority: int) -> Elector:
        return Elector(
            lease_name,
            identity=identity,
            backend=any_store,
            mode="priority",
            priority=priority,
            on_elected=events.callback("elected"),
            on_lost=events.callback("lost"),
            **FAST,
        )

    leases: dict[str, Lease] = {}

    def work(lease: Lease) -> None:
        leases[lease.holder] = lease
        lease.lost.wait()

    low = start(electors, make("low", 0), work)
    assert low.wait_for_leadership(WAIT)
    same = start(electors, make("same", 0), work)  # no higher priority: never preempts
    wait_queued(any_store, lease_name, "same")

    high = start(electors, make("high", 5), work)
    wait_queued(any_store, lease_name, "high")
    joined = clock()
    assert high.wait_for_leadership(WAIT)
    # At the leader's next renewal (it reads the registry then), with room for the wake-up
    # and the acquisition.
    assert clock() - joined < FAST["renew_interval"] + 1.0
    assert leases["low"].lost_reason.startswith(LossReason.HANDED_OVER)
    # No overlap: the old term ended, and its lease was released, before the new began.
    assert events.seen[:3] == [("elected", "low"), ("lost", "low"), ("elected", "high")]
    assert story(any_store, lease_name) == [
        ("acquired", "low"),
        ("released", "low"),
        ("acquired", "high"),
    ]
    # Neither the deposed leader nor a tie (priority 5 joining later) takes it back.
    tie = start(electors, make("tie", 5), work)
    wait_queued(any_store, lease_name, "tie")
    wait_queued(any_store, lease_name, "low")
    time.sleep(2 * FAST["renew_interval"])  # the behaviour: nothing happens for 2 renewals
    assert high.is_leader and not (low.is_leader or same.is_leader or tie.is_leader)
    assert [kind for kind, _ in story(any_store, lease_name)].count("acquired") == 2


# -- hand-over ------------------------------------------------------------------------------------
def test_hand_over_to_a_candidate_then_to_the_next_in_line(
    any_store: Backend, lease_name: str, electors: list[Elector]
) -> None:
    """Race mode, every follower polling every 0.1 s: only the store's hand-over gate lets
    the chosen one take the lease — not the other follower, nor the deposed holder."""
    leases: dict[str, list[Lease]] = {}

    def work(lease: Lease) -> None:
        leases.setdefault(lease.holder, []).append(lease)
        lease.lost.wait()

    def make(identity: str) -> Elector:
        return Elector(lease_name, identity=identity, backend=any_store, **FAST)

    a = start(electors, make("a"), work)
    assert a.wait_for_leadership(WAIT)
    b = start(electors, make("b"), work)
    wait_queued(any_store, lease_name, "b")
    c = start(electors, make("c"), work)
    wait_queued(any_store, lease_name, "c")

    a.hand_over("c")
    assert c.wait_for_leadership(WAIT)
    assert leases["a"][0].lost_reason.startswith(LossReason.HANDED_OVER)
    wait_queued(any_store, lease_name, "a")  # back in the race, at the tail

    c.hand_over()  # the next in line: b joined before a came back
    assert b.wait_for_leadership(WAIT)
    assert leases["c"][0].lost_reason.startswith(LossReason.HANDED_OVER)
    assert story(any_store, lease_name) == [
        ("acquired", "a"),
        ("handover", "a"),
        ("released", "a"),
        ("acquired", "c"),
        ("handover", "c"),
        ("released", "c"),
        ("acquired", "b"),
    ]
    assert not (a.is_leader or c.is_leader)


def test_hand_over_is_a_no_op_unless_leading(memory: MemoryBackend, lease_name: str) -> None:
    follower = Elector(lease_name, identity="f", backend=memory, **FAST)
    memory.pin(lease_name)
    follower.hand_over("anyone")
    follower.hand_over()
    assert story(memory, lease_name) == [("acquired", "another-instance")]


# -- wake-ups -------------------------------------------------------------------------------------
@stores_db
def test_a_release_wakes_the_race_at_once(
    backend: Backend, lease_name: str, electors: list[Elector]
) -> None:
    """PostgreSQL and Redis push a wake-up: the follower, which would otherwise sleep until
    the lease it saw runs out (10 s) or its retry_interval (5 s), is elected at once.
    SQLite and MariaDB cannot push: the follower finds the lease free by polling."""
    probe = backend.watch(lease_name, lambda: None)
    timing: dict[str, Any]
    if probe is not None:
        probe.close()
        timing = {"ttl": 10.0, "renew_interval": 1.0, "retry_interval": 5.0}
        bound = timing["retry_interval"] / 2
    else:
        timing = {"ttl": 2.0, "renew_interval": 0.5, "retry_interval": 0.3}
        bound = timing["retry_interval"] + 1.0
    leader = start(electors, Elector(lease_name, identity="l", backend=backend, **timing))
    assert leader.wait_for_leadership(WAIT)
    follower = start(electors, Elector(lease_name, identity="f", backend=backend, **timing))
    wait_queued(backend, lease_name, "f")  # it tried once, and sleeps
    if probe is not None:
        wait_until(
            lambda: follower._watch is not None and follower._watch.live,
            timeout=WAIT,
            message="the follower's watch never came live",
        )
    leader.stop(timeout=WAIT)
    assert follower.wait_for_leadership(bound)


# -- the registry and its signals -----------------------------------------------------------------
def test_candidates_lists_the_followers_in_join_order(
    memory: MemoryBackend, lease_name: str, electors: list[Elector]
) -> None:
    leader = start(
        electors, Elector(lease_name, identity="lead", backend=memory, mode="fifo", **FAST)
    )
    assert leader.wait_for_leadership(WAIT)
    second = start(
        electors,
        Elector(lease_name, identity="second", backend=memory, mode="fifo", priority=3, **FAST),
    )
    wait_queued(memory, lease_name, "second")
    start(electors, Elector(lease_name, identity="third", backend=memory, mode="fifo", **FAST))
    wait_queued(memory, lease_name, "third")

    for asked in (leader, second):
        found = asked.candidates()
        assert found is not None
        assert [c.identity for c in found] == ["second", "third"]
        assert [c.priority for c in found] == [3, 0]
        assert found[0].seq < found[1].seq
        here = Candidate.here("x")
        for candidate in found:
            assert (candidate.host, candidate.pid, candidate.version) == (
                here.host,
                here.pid,
                here.version,
            )
            assert candidate.joined_at is not None and candidate.expires_at is not None
            assert candidate.seen_at is not None and candidate.expires_at > candidate.seen_at
    # A store without a registry.
    assert Elector(lease_name, backend=FaultyBackend(memory), **FAST).candidates() is None


def test_membership_signals_joined_and_left(
    memory: MemoryBackend, lease_name: str, electors: list[Elector], membership: Recorder
) -> None:
    """The leader reads the registry every renew_interval and says what changed."""
    leader = start(electors, Elector(lease_name, identity="lead", backend=memory, **FAST))
    assert leader.wait_for_leadership(WAIT)
    wait_until(lambda: leader._members_read, timeout=WAIT, message="the leader never read")
    follower = start(electors, Elector(lease_name, identity="f", backend=memory, **FAST))
    wait_until(
        lambda: membership.kinds("f") == ["joined"], timeout=WAIT, message=membership.seen.copy
    )
    follower.stop(timeout=WAIT)  # withdraws
    wait_until(
        lambda: membership.kinds("f") == ["joined", "left"],
        timeout=WAIT,
        message=membership.seen.copy,
    )
    assert membership.kinds("lead") == []


def test_a_candidate_that_stops_heart_beating_is_reported_expired(
    memory: MemoryBackend, lease_name: str, electors: list[Elector], membership: Recorder
) -> None:
    """A candidate whose process died: its registry entry is never renewed, and the store
    drops it once it expires — ``candidate_expired``, not ``candidate_left``.

    Fails today: ``Elector._membership`` deems a vanished candidate expired only if the time
    since the *previous read* is at least 0.9 of its heartbeat lifetime; a leader reads
    every renew_interval (< ttl <= that lifetime), so it never is, and every crash is
    reported as ``candidate_left``."""
    leader = start(electors, Elector(lease_name, identity="lead", backend=memory, **FAST))
    assert leader.wait_for_leadership(WAIT)
    wait_until(lambda: leader._members_read, timeout=WAIT, message="the leader never read")
    memory.announce(lease_name, Candidate.here("crashed"), 1.5)  # then never again
    wait_until(
        lambda: membership.kinds("crashed") == ["joined"],
        timeout=WAIT,
        message=membership.seen.copy,
    )
    wait_until(
        lambda: len(membership.kinds("crashed")) == 2, timeout=3.0, message=membership.seen.copy
    )
    assert membership.kinds("crashed") == ["joined", "expired"]


# -- observe() ------------------------------------------------------------------------------------
def observer_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"leader-io:{name}:observe")]


def test_observe_yields_the_holder_then_each_change_and_ends_on_close(
    memory: MemoryBackend, lease_name: str, electors: list[Elector]
) -> None:
    watching = observe(lease_name, backend=memory, interval=0.05)
    assert next(watching) is None  # nobody leads yet
    first = start(electors, Elector(lease_name, identity="first", backend=memory, **FAST))
    seen = next(watching)
    assert seen is not None and seen.holder == "first" and not seen.held  # a snapshot
    token = seen.token
    second = start(electors, Elector(lease_name, identity="second", backend=memory, **FAST))
    wait_queued(memory, lease_name, "second")
    first.stop(timeout=WAIT)
    # Released, then taken: the free lease may be seen in between, or not.
    seen = next(watching)
    if seen is None:
        seen = next(watching)
    assert seen is not None and (seen.holder, seen.token) == ("second", token + 1)
    assert second.wait_for_leadership(WAIT)
    assert observer_threads(lease_name)

    watches = len(memory._watches[(lease_name, None)])  # the observer's and second's
    watching.close()
    assert len(memory._watches[(lease_name, None)]) == watches - 1  # its watch closed
    wait_until(
        lambda: not observer_threads(lease_name), timeout=WAIT, message="its store thread lives on"
    )
    with pytest.raises(StopIteration):
        next(watching)


def test_observe_refuses_a_bad_interval(memory: MemoryBackend) -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        next(observe("n", backend=memory, interval=0))


# -- settings and arguments -----------------------------------------------------------------------
def test_election_mode_setting(memory: MemoryBackend) -> None:
    assert Elector("n", backend=memory).mode is Mode.RACE  # the default
    with override_settings(DJANGO_LEADER={"ELECTION_MODE": "fifo"}):
        assert Elector("n", backend=memory).mode is Mode.FIFO
        assert Elector("n", backend=memory, mode="priority").mode is Mode.PRIORITY
    for bad in ("FIFO", "", None, 3):
        with (
            override_settings(DJANGO_LEADER={"ELECTION_MODE": bad}),
            pytest.raises(ImproperlyConfigured, match=r"DJANGO_LEADER\['ELECTION_MODE'\]: mode"),
        ):
            Elector("n", backend=memory)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "bad"}, ValueError, r"mode must be one of 'race', 'fifo', 'priority'"),
        ({"priority": "x"}, TypeError, r"priority must be an int, got 'x'"),
        ({"priority": 2**40}, ValueError, r"priority must fit in 32 bits"),
        ({"watchdog": 0}, ValueError, r"watchdog must be a number of seconds > 0, got 0"),
        ({"watchdog": -1.5}, ValueError, r"watchdog must be"),
        ({"watchdog": True}, ValueError, r"watchdog must be"),
        ({"watchdog": "5"}, ValueError, r"watchdog must be"),
        ({"watchdog": float("inf")}, ValueError, r"watchdog must be"),
        ({"watchdog": float("nan")}, ValueError, r"watchdog must be"),
    ],
)
def test_elector_refuses_bad_election_arguments(
    memory: MemoryBackend, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Elector("n", backend=memory, **kwargs)
    assert memory.names() == []


def test_elector_accepts_good_election_arguments(memory: MemoryBackend) -> None:
    elector = Elector("n", backend=memory, mode=Mode.PRIORITY, priority=-7, watchdog=2)
    assert (elector.mode, elector.priority, elector.watchdog) == (Mode.PRIORITY, -7, 2.0)


# -- how long a follower sleeps -------------------------------------------------------------------
class FakeWatch:
    def __init__(self, live: bool) -> None:
        self.live = live

    def close(self) -> None:
        self.live = False


def seen_lease(expires_in: float | None) -> Lease:
    """A snapshot of someone else's lease read just now, running out in ``expires_in``."""
    read_at = MemoryBackend().now()
    expires_at = None if expires_in is None else read_at + timedelta(seconds=expires_in)
    return Lease("n", "other", 1, read_at, read_at, expires_at, 1, read_at=read_at)


#: The most jitter adds past an expiry with retry_interval 0.5 (django_leader/jitter.py).
EXTRA = jitter.EXPIRY_SPREAD * 0.5


def is_retry(interval: float) -> bool:
    """A poll after retry_interval (0.5 s), shortened by at most the jitter's spread."""
    return (1 - jitter.SPREAD) * 0.5 <= interval <= 0.5


@pytest.mark.parametrize("mode", list(Mode))
def test_a_follower_polls_every_retry_interval_without_live_wake_ups(
    memory: MemoryBackend, mode: Mode
) -> None:
    elector = Elector("n", backend=memory, mode=mode, ttl=6, renew_interval=1, retry_interval=0.5)
    elector._place = 5
    elector._seen = seen_lease(4.0)
    elector._seen_sent = clock()
    elector._announce_due = clock() + 60  # its next heartbeat is not due
    for watch in (None, FakeWatch(live=False)):
        elector._watch = watch
        assert is_retry(elector._poll_interval())


def test_with_live_wake_ups_a_follower_sleeps_until_the_lease_it_saw_runs_out(
    memory: MemoryBackend,
) -> None:
    def interval(mode: Mode, place: int | None, expires_in: float | None, seen: bool) -> float:
        elector = Elector(
            "n", backend=memory, mode=mode, ttl=6, renew_interval=1, retry_interval=0.5
        )
        elector._watch = FakeWatch(live=True)
        elector._place = place
        elector._seen = seen_lease(expires_in) if seen else None
        elector._seen_sent = clock()
        elector._announce_due = clock() + 60  # its next heartbeat is not due
        return elector._poll_interval()

    # race: until the lease seen runs out (a crashed holder's), at most max(ttl, retry)...
    assert 3.9 < interval(Mode.RACE, None, 4.0, seen=True) <= 4.005 + EXTRA
    assert interval(Mode.RACE, None, 60.0, seen=True) == 6
    assert 0.005 <= interval(Mode.RACE, None, 0.0, seen=True) <= 0.005 + EXTRA
    # A lease seen past its expiry already (it cannot be: a guard against spinning).
    assert is_retry(interval(Mode.RACE, None, -1.0, seen=True))
    # ...and every retry_interval when it saw the lease free (yet could not take it), or
    # with no expiry to go by.
    assert is_retry(interval(Mode.RACE, None, None, seen=False))
    assert is_retry(interval(Mode.RACE, None, None, seen=True))
    # fifo, priority: the first two of the queue (and one not queued) poll every retry,
    # so that a dead head is skipped promptly; the others sleep like race followers.
    for mode in (Mode.FIFO, Mode.PRIORITY):
        for place in (None, 0, 1):
            assert is_retry(interval(mode, place, 4.0, seen=True))
        assert 3.9 < interval(mode, 2, 4.0, seen=True) <= 4.005 + EXTRA
        assert interval(mode, 7, 60.0, seen=True) == 6
        assert interval(mode, 2, None, seen=False) == 6


# -- bugs found in review: each of these failed on the first version of the elections ---------
class FlakyWithdraw(MemoryBackend):
    """A store that fails one ``withdraw`` of the identities in ``fail_withdraw`` (a blip of
    the store at that moment: the elector shrugs it off, best effort)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_withdraw: set[str] = set()

    def withdraw(self, name: str, identity: str) -> None:
        if identity in self.fail_withdraw:
            self.fail_withdraw.discard(identity)
            raise BackendUnavailable("injected: connection reset")
        super().withdraw(name, identity)


def test_fifo_hand_over_when_the_holder_could_not_leave_the_queue(
    lease_name: str, electors: list[Elector]
) -> None:
    """The new leader's withdrawal from the registry fails (once), so its entry stays at the
    head of the queue. It hands over to the next in line, b.

    Fails today: b is woken but ``Elector._my_turn`` calls ``may_try`` without ``holder=``
    and sees the deposed holder first, so b never tries; the deposed holder does (it is
    the head, and its heartbeats as a follower keep its old place), is kept out by the
    hand-over gate until the window ends, then takes the lease back. The same entry keeps
    every other candidate out for as long as it heartbeats."""
    store = FlakyWithdraw()

    def make(identity: str) -> Elector:
        return Elector(lease_name, identity=identity, backend=store, mode="fifo", **FAST)

    first = start(electors, make("first"))
    assert first.wait_for_leadership(WAIT)
    h = start(electors, make("h"))
    wait_queued(store, lease_name, "h")
    b = start(electors, make("b"))
    wait_queued(store, lease_name, "b")

    store.fail_withdraw.add("h")
    first.stop(timeout=WAIT)
    assert h.wait_for_leadership(WAIT)
    wait_until(lambda: not store.fail_withdraw, timeout=WAIT, message="h never withdrew")
    assert queued(store, lease_name) == ["h", "b"]  # the holder still listed, first

    h.hand_over()
    # The gate lets only b in for the hand-over window: it is elected within it.
    assert b.wait_for_leadership(handover_window(b.timing) + 1.0), story(store, lease_name)
    assert [kind for kind, who in story(store, lease_name) if who == "h"] == [
        "acquired",
        "handover",
        "released",
    ]


class SlowRegistry(MemoryBackend):
    """A store whose registry reads take 50 ms (a busy database, a distant Redis)."""

    def candidates(self, name: str) -> list[Candidate] | None:
        time.sleep(0.05)  # the behaviour: the latency of the store
        return super().candidates(name)


def test_a_fifo_follower_keeps_its_place_while_it_waits(
    lease_name: str, electors: list[Elector]
) -> None:
    """Three followers queue behind a holder; the third must keep its place (its ``seq``)
    for as long as it waits.

    Fails today: from the third place on, with live wake-ups, ``Elector._poll_interval``
    sleeps up to ``max(ttl, retry_interval)`` — as long as the candidacy it announced just
    before (``max(ttl, 3 * retry_interval)``) lives. It wakes as its entry expires: with a
    registry read slower than its announcement was, the entry is gone, and it joins again
    at the tail (a new seq, and ``candidate_left`` for itself). With equal latencies it is a
    coin toss at every sleep; the 50 ms reads here make it happen at the first."""
    store = SlowRegistry()
    timing: dict[str, Any] = {"ttl": 0.6, "renew_interval": 0.2, "retry_interval": 0.1}
    # The rule itself: a waiting candidate wakes to renew its candidacy (which lasts
    # max(ttl, 3 * retry_interval), see Elector._announce) with a store call's time to spare.
    third = Elector(lease_name, identity="x", backend=store, mode="fifo", **timing)
    third._watch, third._place = FakeWatch(live=True), 2
    third._last_seen, third._seen_sent = seen_lease(60.0), clock()
    candidacy = max(third.timing.ttl, 3 * third.timing.retry_interval)
    assert third._poll_interval() + third.timing.call_timeout <= candidacy
    # And what it does.
    store.acquire(lease_name, "holder", 60)  # held elsewhere, for longer than we look
    for identity in ("b", "c", "d"):
        start(
            electors,
            Elector(lease_name, identity=identity, backend=store, mode="fifo", **timing),
        )
        wait_queued(store, lease_name, identity)
    seqs = {c.identity: c.seq for c in store.candidates(lease_name) or []}
    give_up = clock() + 4 * timing["ttl"]
    while clock() < give_up:  # the behaviour: waiting in line, for a few of d's sleeps
        now = {c.identity: c.seq for c in store.candidates(lease_name) or []}
        assert now == seqs, f"the queue changed from {seqs} to {now}"


def test_a_race_leader_is_not_listed_as_a_candidate(
    memory: MemoryBackend, lease_name: str, electors: list[Elector]
) -> None:
    """``Elector.candidates()``: "this elector among them while it waits; not while it
    leads" (and ``Backend.withdraw``: "it stopped, or leads now").

    Fails today: ``Elector._leave_queue`` withdraws only in fifo and priority mode; in race
    mode the leader stays listed until its last announcement expires (up to ``max(ttl,
    3 * retry_interval)`` into its term), and then the leaders reading the registry send
    ``candidate_left`` about it (``leader status`` lists it as a candidate meanwhile)."""
    timing: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.3, "retry_interval": 0.1}
    first = start(electors, Elector(lease_name, identity="first", backend=memory, **timing))
    assert first.wait_for_leadership(WAIT)
    second = start(electors, Elector(lease_name, identity="second", backend=memory, **timing))
    wait_queued(memory, lease_name, "second")
    first.stop(timeout=WAIT)
    assert second.wait_for_leadership(WAIT)
    # Its candidacy would last >= 2 s more: 1 s is long enough for a withdrawal.
    wait_until(
        lambda: second.candidates() == [], timeout=1.0, message=lambda: queued(memory, lease_name)
    )
