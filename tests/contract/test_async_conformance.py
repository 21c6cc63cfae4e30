"""The async API's conformance on every store (issue 16): ``alock()``, ``Lease.wait_lost()``
and ``Lease.afenced()``, ``AsyncElector`` and ``async for ... in observe()``, checked from
the user's side against real stores with what tests/components/test_lock.py,
tests/components/test_elector.py and tests/contract/test_conformance.py check for the sync
API.

Each case runs one ``asyncio.run()`` (no pytest plugin: the suite has none). Django's ORM
refuses to be called from a coroutine, so the test reads the store from a coroutine only
through :func:`in_thread` (a worker thread that closes its connection after). A ``Ticker``
task shows the event loop runs on while the API waits: waiting that blocked the loop would
stop it ticking.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import override_settings

from django_leader import (
    AsyncElector,
    LeadershipLost,
    Lease,
    LeaseHeld,
    alock,
    current_lease,
    lock,
    observe,
)
from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from django_leader.conf import get_settings, resolve_timing
from django_leader.lease import clock
from django_leader.term import acquire_once
from testproject.demoapp.models import FencedWrite
from tests.support.faults import FaultyBackend
from tests.support.stores import history, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

T = TypeVar("T")

#: A generous bound for anything that should happen "soon" (not a measured time).
WAIT = 10.0
#: The bound of one test's whole asyncio.run() (a hang fails the test, not the run).
RUN_BOUND = 90.0
#: The Elector timing of the sync tests (tests/components/test_elector.py).
FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "retry_interval": 0.1}


@pytest.fixture
def fast_retry() -> Any:
    """RETRY_INTERVAL 0.05 s: waiters on a store that does not wake them (SQLite, MariaDB)
    poll that often, so that contended cases stay short."""
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "RETRY_INTERVAL": 0.05}):
        yield


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one test's coroutine on a new event loop, bounded."""

    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, RUN_BOUND)

    return asyncio.run(bounded())


async def in_thread(backend: Backend, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a worker thread (the ORM refuses a coroutine's thread), whose
    store and database connections are closed after."""

    def work() -> T:
        try:
            return call(*args)
        finally:
            backend.close()
            connections.close_all()

    return await asyncio.to_thread(work)


async def close_sync_thread(backend: Backend) -> None:
    """Close the store and database connections of Django's sync thread (where
    ``afenced()`` runs its function: ``sync_to_async(thread_sensitive=True)``); a test
    database with a connection left open cannot be dropped."""

    def close() -> None:
        backend.close()
        connections.close_all()

    await sync_to_async(close)()


async def read(backend: Backend, name: str) -> Lease | None:
    return await in_thread(backend, backend.read, name)


async def eventually(predicate: Callable[[], object], what: str) -> None:
    """Wait (without blocking the loop) until ``predicate()`` is true; fail after WAIT."""
    give_up = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < give_up, f"{what}: not within {WAIT:g} s"
        await asyncio.sleep(0.02)


class Ticker:
    """Counts the event loop's turns: a task that ticks every 10 ms while the loop runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    def start(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def fence_using(backend: Backend) -> tuple[str | None, str]:
    """``(using, alias)``: the ``fenced(using=...)`` argument and the database written to.
    A database store fences with its own lease row; the others with a fence row in the
    settings' database (docs/safety.md)."""
    if isinstance(backend, DatabaseBackend):
        return None, backend.alias
    alias = get_settings().database
    return alias, alias


def write_row(alias: str, name: str, token: int, note: str) -> int:
    return int(FencedWrite.objects.using(alias).create(writer=name, token=token, note=note).pk)


def written(alias: str, name: str) -> list[tuple[int, str]]:
    rows = FencedWrite.objects.using(alias).filter(writer=name).order_by("id")
    return list(rows.values_list("token", "note"))


# -- alock(): acquire, refuse, time out, wait ------------------------------------------------
def test_alock_holds_and_releases(backend: Backend, lease_name: str) -> None:
    async def main() -> tuple[Lease, Lease | None, Lease]:
        async with alock(lease_name, ttl=30, backend=backend) as lease:
            assert lease.held and lease.holder and lease.token >= 1
            assert lease.name == lease_name
            assert lease.expires_at is not None
            seen = await read(backend, lease_name)
        async with alock(lease_name, ttl=30, backend=backend) as again:
            pass
        return lease, seen, again

    lease, seen, again = run(main())
    assert seen is not None and (seen.holder, seen.token) == (lease.holder, lease.token)
    assert not lease.held and not again.held
    assert again.token > lease.token  # a new term, a greater fencing token
    assert backend.read(lease_name) is None
    kinds = [event[0] for event in history(backend, lease_name)]
    assert kinds == ["acquired", "released", "acquired", "released"]


def test_async_with_lock_works_too(backend: Backend, lease_name: str) -> None:
    """``lock()`` returns the same Lock class: ``async with lock(...)`` holds too."""

    async def main() -> tuple[Lease, Lease | None]:
        async with lock(lease_name, ttl=30, backend=backend) as lease:
            return lease, await read(backend, lease_name)

    lease, seen = run(main())
    assert seen is not None and seen.token == lease.token
    assert not lease.held
    assert backend.read(lease_name) is None


def test_non_blocking_alock_of_held_lease_raises(backend: Backend, lease_name: str) -> None:
    backend.acquire(lease_name, "someone-else", 30)

    async def main() -> None:
        async with alock(lease_name, backend=backend, blocking=False):
            pytest.fail("entered a lock held elsewhere")

    with pytest.raises(LeaseHeld, match="someone-else"):
        run(main())
    assert backend.read(lease_name).holder == "someone-else"


def test_blocking_alock_times_out_without_blocking_the_loop(
    backend: Backend, lease_name: str
) -> None:
    backend.acquire(lease_name, "someone-else", 30)

    async def main() -> tuple[float, int]:
        ticker = Ticker().start()
        started = time.monotonic()
        try:
            with pytest.raises(LeaseHeld):
                async with alock(lease_name, backend=backend, timeout=0.5):
                    pytest.fail("entered a lock held elsewhere")
            return time.monotonic() - started, ticker.ticks
        finally:
            await ticker.stop()

    waited, ticks = run(main())
    assert 0.5 <= waited < WAIT
    # The loop turned while alock() waited (10 ms ticks over 0.5 s: far more than 5).
    assert ticks >= 5, ticks
    assert backend.read(lease_name).holder == "someone-else"


def test_blocking_alock_waits_for_release_without_blocking_the_loop(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """The lease is released from another thread only once the loop has ticked 20 times
    while alock() waits (or, if the loop never turns, after WAIT): a waiter that blocked
    the loop is caught either way."""
    other, _ = backend.acquire(lease_name, "someone-else", 30)
    assert other is not None
    seen: dict[str, Any] = {}

    def releaser(ticker: Ticker) -> None:
        try:
            give_up = time.monotonic() + WAIT
            while ticker.ticks < 20 and time.monotonic() < give_up:
                time.sleep(0.01)
            seen["ticks_before_release"] = ticker.ticks
            backend.release(other)
        finally:
            backend.close()

    async def main() -> None:
        ticker = Ticker().start()
        thread = threading.Thread(target=releaser, args=(ticker,))
        thread.start()
        try:
            async with alock(lease_name, backend=backend, timeout=3 * WAIT) as lease:
                seen["token"] = lease.token
                seen["ticks_at_entry"] = ticker.ticks
        finally:
            await ticker.stop()
            await asyncio.to_thread(thread.join, WAIT)

    run(main())
    assert seen["ticks_before_release"] >= 20, seen
    assert seen["token"] == other.token + 1
    assert backend.read(lease_name) is None


# -- reentrancy per task ---------------------------------------------------------------------
def test_nested_alock_in_one_task_reenters(backend: Backend, lease_name: str) -> None:
    async def main() -> tuple[bool, Lease | None, Lease]:
        async with alock(lease_name, ttl=30, backend=backend) as outer:
            await asyncio.sleep(0)
            async with alock(lease_name, blocking=False, backend=backend) as inner:
                same = inner is outer
                await asyncio.sleep(0)
            # The inner exit did not release.
            assert outer.held
            after_inner = await read(backend, lease_name)
        return same, after_inner, outer

    same, after_inner, outer = run(main())
    assert same
    assert after_inner is not None and after_inner.token == outer.token
    assert backend.read(lease_name) is None


def test_child_task_created_inside_the_block_does_not_enter(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """A task created inside the block inherits its context, yet contends like any other
    holder: refused without blocking, and a blocking one enters only after the block."""

    async def try_once() -> str:
        try:
            async with alock(lease_name, blocking=False, backend=backend):
                return "entered"
        except LeaseHeld:
            return "refused"

    async def hold() -> int:
        async with alock(lease_name, timeout=3 * WAIT, backend=backend) as lease:
            return lease.token

    async def main() -> tuple[str, bool, int, int]:
        async with alock(lease_name, ttl=30, backend=backend) as parent:
            refused = await asyncio.create_task(try_once())
            waiter = asyncio.create_task(hold())
            # A child that re-entered would be done at once; give it every chance to.
            done, _ = await asyncio.wait({waiter}, timeout=0.5)
            waiting = not done
        return refused, waiting, parent.token, await waiter

    refused, waiting, parent_token, child_token = run(main())
    assert refused == "refused"
    assert waiting, "the child task entered its parent's lock"
    assert child_token == parent_token + 1
    assert backend.read(lease_name) is None


def test_two_coroutines_on_one_loop_never_both_hold(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """Six tasks on one loop, five rounds each, contend for one alock(): at no instant are
    two inside, and the fencing tokens grow with each entry."""
    tasks, rounds = 6, 5
    inside = [0]
    most = [0]
    tokens: list[int] = []

    async def contender() -> None:
        for _ in range(rounds):
            async with alock(lease_name, ttl=30, timeout=6 * WAIT, backend=backend) as lease:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                tokens.append(lease.token)
                # Stay inside over several loop turns, so that an overlap would show.
                for _ in range(3):
                    await asyncio.sleep(0.005)
                inside[0] -= 1
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(contender() for _ in range(tasks)))

    run(main())
    assert most[0] == 1, f"{most[0]} tasks were inside at once"
    assert len(tokens) == tasks * rounds
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing, in entry order
    assert backend.read(lease_name) is None
    granted = [e[3] for e in history(backend, lease_name) if e[0] in ("acquired", "taken_over")]
    assert sorted(granted) == tokens


def test_cancelled_waiter_leaves_nothing_held(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """A waiting task is cancelled while the lease is held elsewhere, and (twelve times) just
    as it is released: every time, the name is free afterwards (a grant that arrived after
    the cancellation was handed back) and acquirable at once."""

    async def wait_for_it(entered: list[int]) -> None:
        async with alock(lease_name, ttl=30, timeout=6 * WAIT, backend=backend) as lease:
            entered.append(lease.token)
            await asyncio.sleep(3600)

    async def one_round(number: int, release_first: bool, delay: float) -> list[int]:
        other, _ = await in_thread(backend, backend.acquire, lease_name, "someone-else", 30)
        assert other is not None
        entered: list[int] = []
        waiter = asyncio.create_task(wait_for_it(entered))
        await asyncio.sleep(0.2)  # let it start waiting
        if release_first:
            await in_thread(backend, backend.release, other)
            await asyncio.sleep(delay)  # the grant may be in flight, or in, or not yet
        waiter.cancel()
        done, _ = await asyncio.wait({waiter}, timeout=WAIT)
        if not done:  # the cancel was swallowed: the task went on, into the block
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            pytest.fail(
                f"the cancelled waiter went on (round {number}, release first: {release_first}, "
                f"cancelled {delay:g} s after the release): "
                f"it entered the block with token(s) {entered} and ran there"
            )
        if not release_first:
            await in_thread(backend, backend.release, other)
        # A late grant is handed back: the name becomes free.
        give_up = time.monotonic() + WAIT
        while (current := await read(backend, lease_name)) is not None:
            assert time.monotonic() < give_up, f"still held after the cancel: {current}"
            await asyncio.sleep(0.05)
        async with alock(lease_name, blocking=False, backend=backend) as lease:
            assert lease.held
        return entered

    async def main() -> list[list[int]]:
        # Cancelled at several moments after the release, across the wake-up's and the
        # grant's way in; most at once, when the store's wake-up may be in the loop's queue.
        delays = [0.0] * 8 + [0.002, 0.005, 0.01, 0.02]
        rounds = [(False, 0.0)] + [(True, delay) for delay in delays]
        return [await one_round(n, *args) for n, args in enumerate(rounds)]

    outcomes = run(main())
    assert outcomes[0] == [], "entered a lease held elsewhere"
    assert backend.read(lease_name) is None


class GatedBackend(FaultyBackend):
    """A real store whose next ``acquire`` can be held at a gate (before it reaches the
    store) or reported once it returned a grant: to cancel a waiter at a chosen point of
    its acquisition. Waiters are woken by the real store's watch (where it has one)."""

    def __init__(self, real: Backend) -> None:
        super().__init__(real)
        self.hold_next = threading.Event()  # set: the next acquire waits at the gate
        self.at_gate = threading.Event()  # set by an acquire waiting at the gate
        self.open = threading.Event()
        self.granted = threading.Event()  # set when an acquire returned a lease

    def watch(self, name: str, callback: Callable[[], None], **kwargs: Any) -> Any:
        return self.real.watch(name, callback, **kwargs)

    def wake(self, name: str, identity: str | None = None) -> None:
        self.real.wake(name, identity)

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        if self.hold_next.is_set():
            self.hold_next.clear()
            self.at_gate.set()
            self.open.wait(WAIT)
        lease, current = self.real.acquire(name, holder, ttl)
        if lease is not None:
            self.granted.set()
        return lease, current


async def cancel_at(
    backend: Backend,
    gated: GatedBackend,
    name: str,
    moment: Callable[[asyncio.Task[None], Lease], Coroutine[Any, Any, None]],
) -> tuple[bool, list[int], Lease | None]:
    """A task waits in ``alock(name)`` (held by ``other``, then released);
    ``moment(task, other)`` cancels it at a chosen point. Returns whether it ended
    cancelled, what it entered, and the store's lease once the name is free again (None;
    a lease if it never is)."""
    other, _ = await in_thread(backend, backend.acquire, name, "someone-else", 30)
    assert other is not None
    entered: list[int] = []

    async def waiter() -> None:
        async with alock(name, ttl=30, timeout=6 * WAIT, backend=gated) as lease:
            entered.append(lease.token)
            await asyncio.sleep(3600)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.2)  # it polls, refused
    await moment(task, other)
    done, _ = await asyncio.wait({task}, timeout=WAIT)
    if not done:  # the cancel was swallowed: the task went on, into the block
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False, entered, None
    give_up = time.monotonic() + WAIT
    while (current := await read(backend, name)) is not None and time.monotonic() < give_up:
        await asyncio.sleep(0.05)
    return task.cancelled(), entered, current


def test_waiter_cancelled_while_its_grant_is_in_flight_hands_it_back(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """The waiter's acquisition is on its way to the store (held at a gate) when the task
    is cancelled; then the store grants it: the grant is released, the task ends
    cancelled, having entered nothing."""
    gated = GatedBackend(backend)

    async def moment(task: asyncio.Task[None], other: Lease) -> None:
        gated.hold_next.set()
        assert await asyncio.to_thread(gated.at_gate.wait, WAIT), "no acquire reached the gate"
        await in_thread(backend, backend.release, other)
        task.cancel()
        await asyncio.sleep(0.1)  # the cancellation is seen before the grant comes in
        gated.open.set()

    cancelled, entered, current = run(cancel_at(backend, gated, lease_name, moment))
    assert entered == [], f"the cancelled task entered the block (tokens {entered})"
    assert cancelled, "the task did not end cancelled"
    assert current is None, f"the late grant was never released: {current}"


def test_waiter_cancelled_after_its_grant_came_back_hands_it_back(
    backend: Backend, lease_name: str, fast_retry: None
) -> None:
    """The store granted the waiter's acquisition while the loop was blocked (so the task
    has not run since), and the task is cancelled before the loop runs again: the task
    ends cancelled, entered nothing, and the grant is released."""
    gated = GatedBackend(backend)

    async def moment(task: asyncio.Task[None], other: Lease) -> None:
        gated.hold_next.set()
        assert await asyncio.to_thread(gated.at_gate.wait, WAIT), "no acquire reached the gate"
        await in_thread(backend, backend.release, other)
        # From here the loop is blocked: the poll at the gate goes on and is granted, and
        # a little more time lets the grant's way back to the loop be queued.
        gated.open.set()
        assert gated.granted.wait(WAIT), "the waiter's poll was not granted"
        time.sleep(0.1)
        task.cancel()

    cancelled, entered, current = run(cancel_at(backend, gated, lease_name, moment))
    assert entered == [], f"the cancelled task entered the block (tokens {entered})"
    assert cancelled, "the task did not end cancelled"
    assert current is None, f"the grant was never released: {current}"


def test_task_cancelled_inside_the_block_releases_on_its_way_out(
    backend: Backend, lease_name: str
) -> None:
    async def main() -> tuple[bool, Lease | None]:
        inside = asyncio.Event()

        async def holder() -> None:
            async with alock(lease_name, ttl=30, backend=backend):
                inside.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(holder())
        await asyncio.wait_for(inside.wait(), WAIT)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # Released before the task finished (the release is shielded from the cancel).
        return task.cancelled(), await read(backend, lease_name)

    cancelled, seen = run(main())
    assert cancelled
    assert seen is None, seen


def test_alock_released_when_block_raises(backend: Backend, lease_name: str) -> None:
    async def main() -> None:
        async with alock(lease_name, ttl=30, backend=backend):
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        run(main())
    assert backend.read(lease_name) is None


# -- renewal and the deadline, with the loop blocked -----------------------------------------
def test_renewed_while_the_loop_is_blocked(backend: Backend, lease_name: str) -> None:
    """A synchronous call blocks the loop for 2.5 TTLs: the session thread renews the lease
    meanwhile, so it is still held, by the same token, afterwards."""

    async def main() -> tuple[Lease, Any, bool, Lease | None]:
        async with alock(lease_name, ttl=1.0, backend=backend) as lease:
            first_expiry = lease.expires_at
            time.sleep(2.5)  # blocks the event loop (the fault tested)
            held = lease.held and not lease.lost.is_set()
            return lease, first_expiry, held, await read(backend, lease_name)

    lease, first_expiry, held, seen = run(main())
    assert held, lease.lost_reason
    assert lease.expires_at > first_expiry
    assert seen is not None and seen.token == lease.token
    assert backend.read(lease_name) is None


def test_deadline_is_kept_while_the_loop_is_blocked(backend: Backend, lease_name: str) -> None:
    """Renewals hang, and the loop is blocked (a synchronous wait): ``lease.lost`` is set
    and ``lease.held`` false at the deadline all the same."""
    faulty = FaultyBackend(backend)

    async def main() -> tuple[bool, bool, Lease]:
        async with alock(lease_name, ttl=1.0, backend=faulty) as lease:
            faulty.hang_renew.set()
            lost = lease.lost.wait(WAIT)  # blocks the event loop
            held = lease.held
            faulty.unblock.set()
            return lost, held, lease

    lost, held, lease = run(main())
    assert lost, "lease.lost never set while the loop was blocked"
    assert not held
    with pytest.raises(LeadershipLost):
        lease.check()


def test_wait_lost(backend: Backend, lease_name: str) -> None:
    """``await lease.wait_lost()``: False after its timeout while held, True once the
    lease is lost (force-released from outside), without blocking the loop."""

    async def main() -> tuple[bool, bool, int, Lease]:
        ticker = Ticker().start()
        try:
            async with alock(lease_name, ttl=1.0, backend=backend) as lease:
                early = await lease.wait_lost(0.3)
                ticks = ticker.ticks
                forced = await in_thread(backend, backend.force_release, lease_name)
                assert forced is not None and forced.token == lease.token
                late = await lease.wait_lost(WAIT)
            return early, late, ticks, lease
        finally:
            await ticker.stop()

    early, late, ticks, lease = run(main())
    assert early is False
    assert ticks >= 5, ticks  # the loop turned during the 0.3 s wait
    assert late is True
    assert lease.lost.is_set() and not lease.held


# -- afenced() -------------------------------------------------------------------------------
def test_afenced_write_commits_while_held(backend: Backend, lease_name: str) -> None:
    using, alias = fence_using(backend)

    async def main() -> tuple[Lease, int]:
        async with alock(lease_name, ttl=30, backend=backend) as lease:
            pk = await lease.afenced(
                write_row, alias, lease_name, lease.token, note="held", using=using
            )
            await close_sync_thread(backend)
            return lease, pk

    lease, pk = run(main())
    assert written(alias, lease_name) == [(lease.token, "held")]
    assert FencedWrite.objects.using(alias).get(pk=pk).token == lease.token


def test_afenced_write_rejected_after_takeover(backend: Backend, lease_name: str) -> None:
    """The lease is force-released and taken by a successor, who writes: the old holder's
    afenced() raises LeadershipLost, with its own lease and with a copy that does not know
    it lost (only the database's lease row or fence row can refuse that one)."""
    using, alias = fence_using(backend)

    def take_over() -> Lease:
        backend.force_release(lease_name, actor="test")
        # Taken once the force-released term is over (its lock-delay: at most the TTL).
        successor = wait_until(
            lambda: acquire_once(backend, lease_name, "bob", resolve_timing(30))[0],
            timeout=WAIT,
            message="the successor never got the lease",
        )
        with successor.fenced(using=using):
            write_row(alias, lease_name, successor.token, "successor")
        return successor

    async def main() -> tuple[Lease, Lease, list[str]]:
        outcomes = []
        async with alock(lease_name, ttl=1.0, backend=backend) as lease:
            await lease.afenced(write_row, alias, lease_name, lease.token, "before", using=using)
            unaware = dataclasses.replace(
                lease, lost=threading.Event(), lost_reason="", deadline=clock() + 60
            )
            successor = await in_thread(backend, take_over)
            for held, note in ((lease, "after"), (unaware, "after-unaware")):
                try:
                    await held.afenced(write_row, alias, lease_name, held.token, note, using=using)
                    outcomes.append("committed")
                except LeadershipLost:
                    outcomes.append("rejected")
        await in_thread(backend, backend.release, successor)
        await close_sync_thread(backend)
        return lease, successor, outcomes

    lease, successor, outcomes = run(main())
    assert outcomes == ["rejected", "rejected"]
    assert successor.token > lease.token
    assert written(alias, lease_name) == [(lease.token, "before"), (successor.token, "successor")]


# -- AsyncElector ----------------------------------------------------------------------------
class RecordingElector(AsyncElector):
    """Records its async callbacks, and whether each ran on the loop that started it."""

    events: list[tuple[str, str, int, bool]]
    loop: asyncio.AbstractEventLoop

    def _note(self, kind: str, lease: Lease) -> None:
        on_loop = asyncio.get_running_loop() is self.loop
        self.events.append((kind, lease.holder, lease.token, on_loop))

    async def on_elected(self, lease: Lease) -> None:
        self._note("elected", lease)

    async def on_lost(self, lease: Lease) -> None:
        self._note("lost", lease)

    async def on_new_leader(self, lease: Lease) -> None:
        self._note("new_leader", lease)


def campaign(events: list[tuple[str, str, int, bool]]) -> list[tuple[str, str, int, bool]]:
    """The on_elected and on_lost calls (on_new_leader is called for every leader, this
    elector included)."""
    return [event for event in events if event[0] != "new_leader"]


def recording(name: str, identity: str, backend: Backend, **timing: Any) -> RecordingElector:
    elector = RecordingElector(name, identity=identity, backend=backend, **{**FAST, **timing})
    elector.events = []
    elector.loop = asyncio.get_running_loop()
    return elector


def test_async_elector_elected_then_stop_hands_over(backend: Backend, lease_name: str) -> None:
    async def main() -> dict[str, Any]:
        first = recording(lease_name, "first", backend)
        second = recording(lease_name, "second", backend, retry_interval=0.05)
        try:
            await first.start()
            assert await first.wait_for_leadership(WAIT)
            assert first.is_leader and first.lease is not None
            assert first.name == lease_name and first.identity == "first"
            token = first.lease.token
            leader = await first.leader()
            await second.start()
            assert not await second.wait_for_leadership(0.5)
            await eventually(lambda: second.events, "second's on_new_leader")
            await first.stop()
            stopped = (first.is_leader, first.lease)
            assert await second.wait_for_leadership(WAIT)
            await eventually(
                lambda: any(e[0] == "elected" for e in second.events), "second's on_elected"
            )
            await eventually(lambda: campaign(first.events)[1:], "first's on_lost")
            return {
                "token": token,
                "leader": leader,
                "stopped": stopped,
                "first": first.events,
                "second": second.events,
                "second_token": second.lease.token,
            }
        finally:
            await first.stop()
            await second.stop()

    out = run(main())
    token = out["token"]
    assert out["leader"] is not None and (out["leader"].holder, out["leader"].token) == (
        "first",
        token,
    )
    assert out["stopped"] == (False, None)
    assert campaign(out["first"]) == [
        ("elected", "first", token, True),
        ("lost", "first", token, True),
    ]
    assert out["second"][0] == ("new_leader", "first", token, True)
    assert ("elected", "second", token + 1, True) in out["second"]
    assert out["second_token"] == token + 1
    kinds = [event[:2] for event in history(backend, lease_name)]
    assert kinds[:3] == [("acquired", "first"), ("released", "first"), ("acquired", "second")]


def test_async_with_async_elector(backend: Backend, lease_name: str) -> None:
    async def main() -> tuple[AsyncElector, Lease | None]:
        async with AsyncElector(lease_name, identity="ctx", backend=backend, **FAST) as elector:
            assert await elector.wait_for_leadership(WAIT)
            seen = await read(backend, lease_name)
        return elector, seen

    elector, seen = run(main())
    assert seen is not None and seen.holder == "ctx"
    assert not elector.is_leader
    assert backend.read(lease_name) is None  # exiting stopped it and released


def test_async_work_runs_on_the_loop_and_stop_waits_for_it(
    backend: Backend, lease_name: str
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        async def wind_down(lease: Lease) -> None:
            seen["while_winding_down"] = await read(backend, lease_name)
            await asyncio.sleep(0.2)  # winding down takes a moment: stop() must wait
            seen["finished"] = True

        async def work(lease: Lease) -> None:
            seen["lease"] = lease
            seen["current"] = current_lease()
            seen["on_loop"] = asyncio.get_running_loop() is loop
            started.set()
            cancelled = False
            try:
                await lease.wait_lost()
            except asyncio.CancelledError:
                cancelled = True
            # The work is cancelled at the loss: it finishes its cleanup all the same, as
            # a task may (shielded from further cancels), then ends as cancelled.
            cleanup = asyncio.ensure_future(wind_down(lease))
            while not cleanup.done():
                try:
                    await asyncio.shield(cleanup)
                except asyncio.CancelledError:
                    cancelled = True
            if cancelled:
                raise asyncio.CancelledError

        elector = AsyncElector(lease_name, identity="w", backend=backend, **FAST)
        await elector.start(work)
        try:
            await asyncio.wait_for(started.wait(), WAIT)
            seen["elector_lease"] = elector.lease
        finally:
            await elector.stop()
        seen["finished_at_stop"] = seen.get("finished", False)

    run(main())
    assert seen["on_loop"]
    assert seen["lease"] is seen["elector_lease"]
    assert seen["current"] is seen["lease"]  # current_lease() is set in the work
    assert seen["finished_at_stop"], "stop() returned before the work did"
    assert seen["while_winding_down"].token == seen["lease"].token
    assert backend.read(lease_name) is None  # released after the work returned


def test_async_work_is_cancelled_when_leadership_is_lost(backend: Backend, lease_name: str) -> None:
    """The lease is force-released from outside: the elector loses it, its async work is
    cancelled (on the loop) and on_lost runs."""
    seen: dict[str, Any] = {}

    async def main() -> None:
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def work(lease: Lease) -> None:
            seen["lease"] = lease
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen["lost_when_cancelled"] = lease.lost.is_set() or not lease.held
                cancelled.set()
                raise

        # A long retry interval: it does not campaign again before the test looks.
        elector = recording(lease_name, "victim", backend, retry_interval=5.0)
        await elector.start(work)
        try:
            await asyncio.wait_for(started.wait(), WAIT)
            forced = await in_thread(backend, backend.force_release, lease_name)
            assert forced is not None and forced.token == seen["lease"].token
            await asyncio.wait_for(cancelled.wait(), WAIT)
            await eventually(lambda: campaign(elector.events)[1:], "on_lost")
            seen["events"] = list(elector.events)
        finally:
            await elector.stop()

    run(main())
    token = seen["lease"].token
    assert seen["lost_when_cancelled"]
    assert campaign(seen["events"])[:2] == [
        ("elected", "victim", token, True),
        ("lost", "victim", token, True),
    ]


# -- observe() -------------------------------------------------------------------------------
def test_async_observe_sees_the_holder_then_a_change(backend: Backend, lease_name: str) -> None:
    """The holder is handed over from another thread only once the loop has ticked 10
    times after the first snapshot, while ``async for`` waits for the next change (or, if
    the loop never turns, after WAIT): an observer that blocked the loop is caught."""
    first, _ = backend.acquire(lease_name, "alice", 30)
    assert first is not None
    seen_first = threading.Event()
    ticked: list[bool] = []

    def hand_over(ticker: Ticker) -> None:
        try:
            if not seen_first.wait(WAIT):
                return
            target = ticker.ticks + 10
            give_up = time.monotonic() + WAIT
            while ticker.ticks < target and time.monotonic() < give_up:
                time.sleep(0.01)
            ticked.append(ticker.ticks >= target)
            backend.release(first)
            backend.acquire(lease_name, "bob", 30)
        finally:
            backend.close()

    async def main() -> list[tuple[str, int] | None]:
        ticker = Ticker().start()
        thread = threading.Thread(target=hand_over, args=(ticker,))
        thread.start()
        seen: list[tuple[str, int] | None] = []
        try:
            async for lease in observe(lease_name, backend=backend, interval=0.1):
                seen.append(None if lease is None else (lease.holder, lease.token))
                seen_first.set()
                if lease is not None and lease.holder == "bob":
                    break
            return seen
        finally:
            seen_first.set()
            await ticker.stop()
            await asyncio.to_thread(thread.join, WAIT)

    seen = run(main())
    assert ticked == [True], "the loop did not turn while observe() waited for a change"
    assert seen[0] == ("alice", first.token)
    assert seen[-1] is not None and seen[-1][0] == "bob" and seen[-1][1] > first.token
    assert seen[1:-1] in ([], [None]), seen  # the free lease may be seen in between


def test_async_observe_aclose(backend: Backend, lease_name: str) -> None:
    async def main() -> tuple[Lease | None, bool]:
        watching = observe(lease_name, backend=backend, interval=0.1)
        first = await watching.__anext__()
        await watching.aclose()
        try:
            await watching.__anext__()
        except StopAsyncIteration:
            return first, True
        return first, False

    first, ended = run(main())
    assert first is None  # nobody holds it
    assert ended, "observe() yielded again after aclose()"


def test_async_elector_run_with_plain_work_and_callbacks(backend: Backend, lease_name: str) -> None:
    """``await run(work)`` campaigns until ``stop()``; a plain ``def work`` runs in a thread
    of its own (not the loop's), plain callbacks are called; a follower lists itself
    among the candidates."""
    seen: dict[str, Any] = {}
    calls: list[tuple[str, int]] = []

    class Plain(AsyncElector):
        def on_elected(self, lease: Lease) -> None:
            calls.append(("elected", lease.token))

        def on_lost(self, lease: Lease) -> None:
            calls.append(("lost", lease.token))

    started = threading.Event()

    def work(lease: Lease) -> None:
        seen["work_thread"] = threading.get_ident()
        seen["lease"] = lease
        started.set()
        lease.lost.wait(6 * WAIT)

    async def main() -> None:
        seen["loop_thread"] = threading.get_ident()
        elector = Plain(lease_name, identity="plain", backend=backend, **FAST)
        follower = AsyncElector(lease_name, identity="waiting", backend=backend, **FAST)
        runner = asyncio.create_task(elector.run(work))
        try:
            assert await asyncio.to_thread(started.wait, WAIT), "the work never started"
            seen["is_leader"] = elector.is_leader
            await follower.start()
            give_up = time.monotonic() + WAIT
            while "waiting" not in [c.identity for c in await follower.candidates() or []]:
                assert time.monotonic() < give_up, await follower.candidates()
                await asyncio.sleep(0.05)
            seen["running_before_stop"] = not runner.done()
        finally:
            await follower.stop()
            await elector.stop()
        await asyncio.wait_for(runner, WAIT)  # run() returns once stopped

    run(main())
    token = seen["lease"].token
    assert seen["is_leader"] and seen["running_before_stop"]
    assert seen["work_thread"] != seen["loop_thread"]
    assert calls == [("elected", token), ("lost", token)]
    assert backend.read(lease_name) is None


def test_async_with_observe(backend: Backend, lease_name: str) -> None:
    """``async with observe(name) as watching``: closed at the end of the block."""
    holder, _ = backend.acquire(lease_name, "alice", 30)
    assert holder is not None

    async def main() -> tuple[Lease | None, bool]:
        async with observe(lease_name, backend=backend, interval=0.1) as watching:
            first = await watching.__anext__()
        try:
            await watching.__anext__()
        except StopAsyncIteration:
            return first, True
        return first, False

    first, ended = run(main())
    assert first is not None and (first.holder, first.token) == ("alice", holder.token)
    assert ended, "observe() yielded again after its block"


def test_plain_on_lost_runs_while_the_loop_is_blocked(backend: Backend, lease_name: str) -> None:
    """A plain ``on_lost`` runs in the campaign thread: on time, while the loop is blocked by
    a synchronous call (here: the wait for that very callback); ``is_leader`` is false
    then. Once the loop runs, the async work is cancelled."""
    lost = threading.Event()

    class PlainLost(AsyncElector):
        def on_lost(self, lease: Lease) -> None:
            lost.set()

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        started = asyncio.Event()
        ended = asyncio.Event()

        async def work(lease: Lease) -> None:
            out["token"] = lease.token
            started.set()
            try:
                await asyncio.sleep(3600)
            finally:
                ended.set()

        elector = PlainLost(lease_name, identity="p", backend=backend, **FAST)
        await elector.start(work)
        try:
            await asyncio.wait_for(started.wait(), WAIT)
            out["forced"] = await in_thread(backend, backend.force_release, lease_name)
            out["lost_while_blocked"] = lost.wait(WAIT)  # blocks the loop
            out["leader_while_blocked"] = elector.is_leader
            await asyncio.wait_for(ended.wait(), WAIT)
        finally:
            await elector.stop()
        return out

    out = run(main())
    assert out["forced"] is not None and out["forced"].token == out["token"]
    assert out["lost_while_blocked"], "on_lost did not run while the loop was blocked"
    assert out["leader_while_blocked"] is False


def test_observer_cancelled_as_a_change_comes_in_ends_cancelled(
    backend: Backend, lease_name: str
) -> None:
    """A task iterating ``async for ... in observe()`` is cancelled just as the lease it
    watches is released (the store's wake-up may be in the loop's queue): eight times, the
    task ends cancelled, rather than going on to the next change."""

    async def one_round(number: int) -> tuple[bool, list[tuple[str, int] | None]]:
        name = f"{lease_name}-{number}"
        holder, _ = await in_thread(backend, backend.acquire, name, "alice", 30)
        assert holder is not None
        seen: list[tuple[str, int] | None] = []
        first = asyncio.Event()

        async def consume() -> None:
            # A long interval: the next change comes from the store's wake-up (or, on a
            # store without one, after the cancellation).
            async for lease in observe(name, backend=backend, interval=5.0):
                seen.append(None if lease is None else (lease.holder, lease.token))
                first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), WAIT)
        await asyncio.sleep(0.1)  # it waits for a change now
        await in_thread(backend, backend.release, holder)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=WAIT)
        if not done:  # the cancel was swallowed: it went on observing
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False, seen
        return task.cancelled(), seen

    async def main() -> tuple[int, list[tuple[str, int] | None]] | None:
        for number in range(8):
            cancelled, seen = await one_round(number)
            if not cancelled:
                return number, seen  # (the first such round is enough)
        return None

    swallowed = run(main())
    assert swallowed is None, f"an observer went on after its cancel (round, seen): {swallowed}"
