"""Election logic without a store: the queue of ``django_leader.election`` and the wake-up
hub of ``django_leader.backends.wakeups`` over an in-memory transport."""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from django_leader import __version__, election
from django_leader.backends import wakeups
from django_leader.backends.wakeups import WakeHub, channel
from django_leader.election import (
    Candidate,
    Mode,
    may_try,
    next_in_line,
    place,
    preempted_by,
    validate_mode,
    validate_priority,
)
from tests.support.waiting import wait_until

WAIT = 5.0


def cand(identity: str, seq: int, priority: int = 0) -> Candidate:
    return Candidate(identity, priority=priority, seq=seq)


def ids(candidates: Iterable[Candidate]) -> list[str]:
    return [c.identity for c in candidates]


# The registry as a store returns it is in join order; these are shuffled on purpose.
MEMBERS = [cand("c", 3, priority=5), cand("a", 1), cand("d", 4, priority=5), cand("b", 2, 9)]


# -- the queue --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [Mode.RACE, Mode.FIFO, "fifo"])
def test_race_and_fifo_queue_in_join_order_whatever_the_priority(mode: Mode | str) -> None:
    assert ids(election.queue(MEMBERS, mode)) == ["a", "b", "c", "d"]


def test_priority_queue_highest_first_ties_in_join_order() -> None:
    assert ids(election.queue(MEMBERS, Mode.PRIORITY)) == ["b", "c", "d", "a"]
    negative = [cand("x", 1, priority=-3), cand("y", 2, priority=-1), cand("z", 3, priority=-3)]
    assert ids(election.queue(negative, "priority")) == ["y", "x", "z"]


@pytest.mark.parametrize(
    ("mode", "expected"), [(Mode.FIFO, ["a", "c", "d"]), (Mode.PRIORITY, ["c", "d", "a"])]
)
def test_queue_leaves_the_holder_out(mode: Mode, expected: list[str]) -> None:
    assert ids(election.queue(MEMBERS, mode, holder="b")) == expected
    assert ids(election.queue(MEMBERS, mode, holder="nobody")) == ids(election.queue(MEMBERS, mode))


def test_queue_of_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        election.queue(MEMBERS, "lottery")


# -- who may try -------------------------------------------------------------------------------
@pytest.mark.parametrize("who", ["a", "d", "not-joined"])
def test_race_lets_everyone_try(who: str) -> None:
    assert may_try(who, MEMBERS, Mode.RACE)
    assert may_try(who, MEMBERS, "race", holder="a")


@pytest.mark.parametrize("mode", [Mode.FIFO, Mode.PRIORITY])
@pytest.mark.parametrize("registry", [None, []])
def test_an_unknown_or_empty_registry_lets_everyone_try(
    mode: Mode, registry: list[Candidate] | None
) -> None:
    assert may_try("anyone", registry, mode)


def test_fifo_lets_only_the_head_try() -> None:
    assert [may_try(who, MEMBERS, Mode.FIFO) for who in "abcd"] == [True, False, False, False]


def test_priority_lets_only_the_highest_try() -> None:
    assert [may_try(who, MEMBERS, Mode.PRIORITY) for who in "abcd"] == [False, True, False, False]
    # Ties: the earliest to join.
    tied = [cand("late", 7, priority=1), cand("early", 2, priority=1)]
    assert may_try("early", tied, Mode.PRIORITY) and not may_try("late", tied, Mode.PRIORITY)


@pytest.mark.parametrize("mode", [Mode.FIFO, Mode.PRIORITY])
def test_a_candidate_not_joined_yet_may_not_try(mode: Mode) -> None:
    """It joins at the tail: trying before the queue it has not joined would jump it —
    even with a higher priority than everyone (it preempts once registered)."""
    assert not may_try("newcomer", MEMBERS, mode)
    assert not may_try("newcomer", [cand("a", 1)], mode)


@pytest.mark.parametrize("mode", [Mode.FIFO, Mode.PRIORITY])
def test_the_holder_listed_is_skipped(mode: Mode) -> None:
    members = [cand("holder", 1, priority=99), cand("next", 2)]
    assert not may_try("next", members, mode)
    assert may_try("next", members, mode, holder="holder")
    assert not may_try("holder", members, mode, holder="holder")
    # Nobody but the holder listed: the queue is empty, anyone may try.
    assert may_try("other", [cand("holder", 1)], mode, holder="holder")


def test_next_in_line() -> None:
    assert next_in_line(MEMBERS, Mode.FIFO) == MEMBERS[1]
    assert next_in_line(MEMBERS, Mode.FIFO, holder="a") == MEMBERS[3]
    assert next_in_line(MEMBERS, Mode.RACE, holder="a") == MEMBERS[3]
    assert next_in_line(MEMBERS, Mode.PRIORITY) == MEMBERS[3]
    assert next_in_line(MEMBERS, Mode.PRIORITY, holder="b") == MEMBERS[0]
    assert next_in_line([], Mode.FIFO) is None
    assert next_in_line([cand("h", 1)], Mode.PRIORITY, holder="h") is None


def test_place() -> None:
    assert [place(who, MEMBERS, Mode.FIFO) for who in "abcd"] == [0, 1, 2, 3]
    assert [place(who, MEMBERS, Mode.PRIORITY) for who in "abcd"] == [3, 0, 1, 2]
    assert place("nobody", MEMBERS, Mode.FIFO) is None
    assert place("a", [], Mode.PRIORITY) is None


def test_preempted_by_only_a_strictly_higher_priority() -> None:
    members = [cand("low", 1, priority=1), cand("high", 2, priority=5), cand("high2", 3, 5)]
    assert preempted_by(0, members, holder="me") == members[1]  # ties: the earliest
    assert preempted_by(4, members, holder="me") == members[1]
    assert preempted_by(5, members, holder="me") is None  # equal: the leader stays
    assert preempted_by(9, members, holder="me") is None
    assert preempted_by(0, [], holder="me") is None
    # The holder's own (stale) entry never preempts it.
    assert preempted_by(0, [cand("me", 1, priority=100)], holder="me") is None
    assert preempted_by(5, [cand("me", 1, priority=100), *members], holder="me") is None


# -- validation and the record -----------------------------------------------------------------
@pytest.mark.parametrize("value", ["race", "fifo", "priority", Mode.FIFO])
def test_validate_mode(value: Any) -> None:
    mode = validate_mode(value)
    assert isinstance(mode, Mode) and mode.value == str(value) and str(mode) == mode.value


@pytest.mark.parametrize("value", ["Race", "lifo", "", None, 1])
def test_validate_mode_names_the_choices(value: Any) -> None:
    with pytest.raises(ValueError, match=r"mode must be one of 'race', 'fifo', 'priority', got"):
        validate_mode(value)


@pytest.mark.parametrize("value", [0, -5, 2**31 - 1, -(2**31)])
def test_validate_priority(value: int) -> None:
    assert validate_priority(value) == value


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("x", TypeError, r"priority must be an int, got 'x'"),
        (1.5, TypeError, r"priority must be an int"),
        (True, TypeError, r"priority must be an int, got True"),
        (None, TypeError, r"priority must be an int"),
        (2**31, ValueError, r"priority must fit in 32 bits"),
        (-(2**31) - 1, ValueError, r"priority must fit in 32 bits"),
    ],
)
def test_validate_priority_refuses(value: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        validate_priority(value)


def test_candidate_here_describes_this_process() -> None:
    here = Candidate.here("me", priority=3)
    assert (here.identity, here.priority, here.pid) == ("me", 3, os.getpid())
    assert here.host == socket.gethostname() and here.version == __version__
    assert (here.seq, here.joined_at, here.seen_at, here.expires_at) == (0, None, None, None)


# -- wake-up channels ----------------------------------------------------------------------------
def test_channels_are_short_identifiers_apart_per_prefix_name_and_identity() -> None:
    names = [
        channel("p", "n"),
        channel("p", "n", "me"),
        channel("p", "n", "you"),
        channel("q", "n"),
        channel("p", "m"),
        channel("p", 'a "quoted"; DROP name' * 20),
    ]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name.encode()) <= 63 and name.isidentifier() and name.islower()
    assert channel("p", "n", None) == channel("p", "n", "")
    assert channel("p", "n", "me") != channel("p", "n")


# -- the hub over an in-memory transport ---------------------------------------------------------
class FakeTransport:
    """A pub/sub connection in memory: ``send`` publishes to a channel, ``cut`` drops the
    connection (the next ``wait`` raises), ``refuse`` makes ``connect`` fail."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.subscribed: set[str] = set()
        self.inbox: queue.Queue[str | Exception] = queue.Queue()
        self.connected = False
        self.connects = 0
        self.closes = 0
        self.refuse = False

    def connect(self) -> None:
        with self.lock:
            self.connects += 1
            if self.refuse:
                raise ConnectionError("refused")
            self.connected = True
            self.subscribed = set()

    def subscribe(self, names: Iterable[str]) -> None:
        with self.lock:
            self.subscribed |= set(names)

    def unsubscribe(self, names: Iterable[str]) -> None:
        with self.lock:
            self.subscribed -= set(names)

    def wait(self, timeout: float) -> list[str]:
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return []
        if isinstance(item, Exception):
            with self.lock:
                self.connected = False
            raise item
        with self.lock:
            return [item] if self.connected and item in self.subscribed else []

    def close(self) -> None:
        with self.lock:
            self.closes += 1
            self.connected = False
            self.subscribed = set()

    def send(self, name: str) -> None:
        self.inbox.put(name)

    def cut(self) -> None:
        self.inbox.put(ConnectionError("connection reset"))


class Calls:
    """Counts the calls of callbacks by label."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def callback(self, label: str) -> Callable[[], None]:
        def called() -> None:
            with self.lock:
                self.counts[label] = self.counts.get(label, 0) + 1

        return called

    def take(self) -> dict[str, int]:
        with self.lock:
            counts, self.counts = self.counts, {}
        return counts


@pytest.fixture
def fast_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wakeups, "POLL", 0.01)
    monkeypatch.setattr(wakeups, "MIN_BACKOFF", 0.02)
    monkeypatch.setattr(wakeups, "MAX_BACKOFF", 0.2)


@pytest.fixture
def hub(fast_hub: None) -> Iterator[tuple[WakeHub, FakeTransport]]:
    transport = FakeTransport()
    hub = WakeHub(transport, f"test-hub-{id(transport)}")
    yield hub, transport
    for watches in list(hub._watches.values()):
        for watch in list(watches):
            watch.close()
    until(lambda: not hub_threads(hub), "the hub thread never ended")


def until(predicate: Callable[[], Any], message: str | Callable[[], object]) -> Any:
    return wait_until(predicate, timeout=WAIT, interval=0.005, message=message)


def hub_threads(hub: WakeHub) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == hub.thread_name and t.is_alive()]


def quiesce(transport: FakeTransport) -> None:
    """Return once the hub has gone through a whole round (looked at its watches, synced
    its subscriptions, dispatched) begun after this call: two messages on a channel nobody
    watches, each consumed in a round of its own."""
    for _ in range(2):
        transport.send("nobody-watches-this")
        until(transport.inbox.empty, "the hub does not read its connection")


def settle(calls: Calls, expected: dict[str, int]) -> None:
    """Wait for exactly the ``expected`` calls (those a (re)subscription makes), then reset."""
    until(lambda: calls.counts == expected, lambda: calls.counts)
    assert calls.take() == expected


def drain(calls: Calls, transport: FakeTransport) -> None:
    """Forget the calls of watches just made: one whose channel was not subscribed yet is
    called (it may have missed a wake-up), maybe twice if made while the hub subscribed
    others (spurious wake-ups are allowed); one made on channels already subscribed is not."""
    quiesce(transport)
    assert all(count <= 2 for count in calls.take().values())


def test_hub_subscribes_what_its_watches_ask_for(hub: tuple[WakeHub, FakeTransport]) -> None:
    wake, transport = hub
    calls = Calls()
    a = wake.watch(["x", "y"], calls.callback("a"))
    until(lambda: a.live, "watch a never came live")
    assert transport.subscribed == {"x", "y"}
    settle(calls, {"a": 1})  # the first connection: a may have missed a wake-up

    b = wake.watch(["x", "z"], calls.callback("b"))
    until(lambda: b.live, "watch b never came live")
    assert transport.subscribed == {"x", "y", "z"}
    # A new watch is not woken: it was not live before (its owner polled meanwhile), and a
    # wake-up now would let a queue's candidate jump the queue.
    settle(calls, {})

    a.close()
    assert not a.live and b.live
    until(lambda: transport.subscribed == {"x", "z"}, "y kept")
    a.close()  # idempotent
    assert transport.connects == 1 and len(hub_threads(wake)) == 1
    assert calls.take() == {}


def test_hub_calls_the_watches_of_the_channel_that_got_a_message(
    hub: tuple[WakeHub, FakeTransport],
) -> None:
    wake, transport = hub
    calls = Calls()
    a = wake.watch(["name", "name/a"], calls.callback("a"))
    b = wake.watch(["name", "name/b"], calls.callback("b"))
    until(lambda: a.live and b.live, "never live")
    drain(calls, transport)

    def step(channel_name: str, expected: dict[str, int]) -> None:
        transport.send(channel_name)
        quiesce(transport)
        assert calls.take() == expected, channel_name

    step("name/b", {"b": 1})
    step("name/a", {"a": 1})
    step("name", {"a": 1, "b": 1})
    step("other", {})
    a.close()
    step("name", {"b": 1})
    step("name/a", {})


def test_a_failing_callback_does_not_stop_the_others(
    hub: tuple[WakeHub, FakeTransport], caplog: pytest.LogCaptureFixture
) -> None:
    wake, transport = hub
    calls = Calls()

    def broken() -> None:
        raise RuntimeError("receiver bug")

    bad = wake.watch(["n"], broken)
    good = wake.watch(["n"], calls.callback("good"))
    until(lambda: bad.live and good.live, "never live")
    drain(calls, transport)
    for _ in range(2):
        transport.send("n")
        quiesce(transport)
        assert calls.take() == {"good": 1}
    assert "wake-up callback" in caplog.text and "receiver bug" in caplog.text
    assert bad.live  # the hub lives on


def test_a_lost_connection_is_not_live_and_every_watch_looks_once_back(
    hub: tuple[WakeHub, FakeTransport],
) -> None:
    wake, transport = hub
    calls = Calls()
    a = wake.watch(["n", "n/a"], calls.callback("a"))
    b = wake.watch(["n", "n/b"], calls.callback("b"))
    c = wake.watch(["m"], calls.callback("c"))
    # A queue's candidate (its own channel): it polls, and is not woken after a reconnection.
    d = wake.watch(["n/d"], calls.callback("d"), resync=False)
    until(lambda: a.live and b.live and c.live and d.live, "never live")
    drain(calls, transport)

    transport.refuse = True
    connects = transport.connects
    transport.cut()
    until(lambda: transport.connects >= connects + 2, "no reconnect")
    assert not (a.live or b.live or c.live)
    assert not wake.live and transport.subscribed == set()
    assert calls.take() == {}

    transport.refuse = False
    until(lambda: a.live and b.live and c.live and d.live, "never live again")
    assert transport.subscribed == {"n", "n/a", "n/b", "m", "n/d"}
    # Whatever was sent meanwhile is lost: every watch is called, once (but d).
    settle(calls, {"a": 1, "b": 1, "c": 1})
    transport.send("n/b")
    until(lambda: calls.counts == {"b": 1}, lambda: calls.counts)


def test_reconnecting_backs_off(hub: tuple[WakeHub, FakeTransport]) -> None:
    """A store that refuses connections is not hammered: the attempts are MIN_BACKOFF
    (0.02 s here) apart, doubling up to MAX_BACKOFF (0.2 s) — about five in half a second.

    Fails today: ``watch()`` sets ``_changed``, which only a successful ``_sync`` clears, so
    the back-off's ``_changed.wait(backoff)`` returns at once and the thread reconnects in
    a busy loop for as long as the store is down (one CPU core, and a connection attempt
    per iteration against the store)."""
    wake, transport = hub
    transport.refuse = True
    watch = wake.watch(["n"], lambda: None)
    until(lambda: transport.connects >= 1, "never tried")
    first = transport.connects
    threading.Event().wait(0.5)  # the sleep is the behaviour: how often does it try?
    attempts = transport.connects - first
    assert not watch.live
    assert attempts <= 10, f"{attempts} connection attempts in 0.5 s: no back-off"


def test_the_thread_ends_with_the_last_watch_and_starts_again(
    hub: tuple[WakeHub, FakeTransport],
) -> None:
    wake, transport = hub
    calls = Calls()
    a = wake.watch(["n"], calls.callback("a"))
    b = wake.watch(["m"], calls.callback("b"))
    until(lambda: a.live and b.live, "never live")
    assert len(hub_threads(wake)) == 1
    a.close()
    until(lambda: transport.subscribed == {"m"}, "n kept")
    assert len(hub_threads(wake)) == 1 and transport.closes == 0
    b.close()
    until(lambda: not hub_threads(wake), "the thread lives on")
    assert transport.closes >= 1 and not transport.connected and not wake.live

    calls.take()
    c = wake.watch(["n"], calls.callback("c"))
    until(lambda: c.live, "a new watch never came live")
    assert len(hub_threads(wake)) == 1 and transport.connects == 2
    settle(calls, {"c": 1})
    transport.send("n")
    until(lambda: calls.counts == {"c": 1}, lambda: calls.counts)
    assert "a" not in calls.counts


def test_a_watch_made_as_the_thread_ends_is_served(hub: tuple[WakeHub, FakeTransport]) -> None:
    """The last watch closes, and a new one arrives just as the thread is about to end —
    after it last looked at the watches (here: while it closes its connection)."""
    wake, transport = hub
    first = wake.watch(["n"], lambda: None)
    until(lambda: first.live, "never live")
    made: list[Any] = []
    real_close = transport.close

    def close_and_watch() -> None:
        real_close()
        if not made and threading.current_thread().name == wake.thread_name:
            watcher = threading.Thread(target=lambda: made.append(wake.watch(["m"], lambda: None)))
            watcher.start()
            watcher.join()

    transport.close = close_and_watch  # type: ignore[method-assign]
    first.close()
    until(lambda: made, "the thread never ended")
    until(lambda: made[0].live, "the new watch was never served")
    assert transport.subscribed == {"m"} and len(hub_threads(wake)) == 1
