"""The asyncio pieces on their own: ``StoreCaller.acall``, the hand-back of a grant whose
waiter was cancelled, ``Lease.wait_lost``, ``observe()`` both ways, and the bridge of
``AsyncElector`` to the loop (callbacks, work, stop from inside).

The in-process ``MemoryBackend`` stands in for a store: these are the rules of the code
between the loop and the store. The same API against every real store, and across
processes, is in tests/contract/test_async_conformance.py and
tests/processes/test_async_multiprocess.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from django_leader import AsyncElector, Elector, Lease, LeaseHeld, alock, current_lease, observe
from django_leader.caller import StoreCaller
from django_leader.lease import LossReason, clock
from django_leader.testing import MemoryBackend
from tests.support.waiting import wait_until

T = TypeVar("T")

FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "retry_interval": 0.1}
WAIT = 10.0  # generous bound for anything that should happen "soon"


def run(coroutine: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, 60)

    return asyncio.run(bounded())


@pytest.fixture
def memory() -> MemoryBackend:
    return MemoryBackend()


class Gate:
    """A store call that blocks until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.ran = 0

    def __call__(self, value: T) -> T:
        self.ran += 1
        self.entered.set()
        self.opened.wait(WAIT)
        return value


async def ticking(until: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``until()``'s result, and how often another task ran on the loop meanwhile."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.ensure_future(ticker())
    try:
        return await until(), ticks
    finally:
        stop.set()
        await task


# -- StoreCaller.acall ----------------------------------------------------------------------------
def test_acall_runs_on_the_worker_while_the_loop_runs_on(memory: MemoryBackend) -> None:
    caller = StoreCaller(memory, "acall")
    gate = Gate()
    threading.Timer(0.2, gate.opened.set).start()
    try:
        (value, thread), ticks = run(
            ticking(lambda: caller.acall(WAIT, lambda: (gate(7), threading.current_thread())))
        )
    finally:
        caller.shutdown()
    assert value == 7
    assert thread.name.startswith("leader-io:acall")
    assert ticks >= 5  # the loop ran other tasks for the 0.2 s the call took


def test_acall_gives_up_after_its_timeout_and_the_next_call_gets_a_new_worker(
    memory: MemoryBackend,
) -> None:
    caller = StoreCaller(memory, "acall")
    gate = Gate()
    try:

        async def scenario() -> str:
            with pytest.raises(TimeoutError, match=r"still running after 0\.20s"):
                await caller.acall(0.2, gate, "hung")
            return await caller.acall(WAIT, lambda: threading.current_thread().name)

        assert run(scenario()) == "leader-io:acall#2"
        assert caller.abandoned == 1  # the hung call kept its worker; the next got another
    finally:
        gate.opened.set()
        caller.shutdown()


def test_a_cancelled_acall_hands_its_late_answer_to_on_late(memory: MemoryBackend) -> None:
    caller = StoreCaller(memory, "acall")
    gate = Gate()
    late: list[str] = []
    answered = threading.Event()

    def on_late(value: str) -> None:
        late.append(value)
        answered.set()

    async def scenario() -> None:
        task = asyncio.ensure_future(caller.acall(WAIT, gate, "granted", on_late=on_late))
        await asyncio.get_running_loop().run_in_executor(None, gate.entered.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        run(scenario())
        assert not late  # not answered yet
        gate.opened.set()
        assert answered.wait(WAIT), "on_late never ran"
        assert late == ["granted"]
        assert caller.abandoned == 0  # cancelling does not throw the connection away
    finally:
        gate.opened.set()
        caller.shutdown()


def test_a_cancelled_acall_that_was_still_queued_never_runs(memory: MemoryBackend) -> None:
    caller = StoreCaller(memory, "acall")
    first, second = Gate(), Gate()

    async def scenario() -> None:
        ahead = asyncio.ensure_future(caller.acall(WAIT, first, 1))
        await asyncio.get_running_loop().run_in_executor(None, first.entered.wait, WAIT)
        queued = asyncio.ensure_future(caller.acall(WAIT, second, 2))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        first.opened.set()
        assert await ahead == 1
        assert await caller.acall(WAIT, lambda: "after") == "after"  # the queue moved on

    try:
        run(scenario())
    finally:
        first.opened.set()
        second.opened.set()
        caller.shutdown()
    assert second.ran == 0


# -- alock: what only a slow store shows ----------------------------------------------------------
class SlowAcquire(MemoryBackend):
    """A store whose acquisitions wait for a gate (when one is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: Gate | None = None

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        if self.gate is not None:
            self.gate("acquire")
        return super().acquire(name, holder, ttl)


def test_a_grant_that_comes_after_its_waiter_was_cancelled_is_released(lease_name: str) -> None:
    store = SlowAcquire()
    store.gate = Gate()

    async def scenario() -> None:
        task = asyncio.ensure_future(alock(lease_name, backend=store, **_ttl()).__aenter__())
        await asyncio.get_running_loop().run_in_executor(None, store.gate.entered.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert store.read(lease_name) is None
    store.gate.opened.set()  # now the store grants it, to nobody
    wait_until(
        lambda: ("released", lease_name) in [(kind, name) for kind, name, _, _ in store.events],
        timeout=WAIT,
        message="the late grant was not handed back",
    )
    assert store.read(lease_name) is None


def _ttl() -> dict[str, Any]:
    return {"ttl": FAST["ttl"]}


def test_a_task_cancelled_inside_the_block_still_releases(
    memory: MemoryBackend, lease_name: str
) -> None:
    entered = asyncio.Event

    async def scenario() -> None:
        inside = entered()

        async def holder() -> None:
            async with alock(lease_name, backend=memory, **_ttl()):
                inside.set()
                await asyncio.sleep(WAIT)

        task = asyncio.ensure_future(holder())
        await inside.wait()
        assert memory.read(lease_name) is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert memory.read(lease_name) is None


def test_alock_waits_for_a_release_without_blocking_the_loop(
    memory: MemoryBackend, lease_name: str
) -> None:
    held = memory.acquire(lease_name, "someone-else", 30)[0]
    assert held is not None
    threading.Timer(0.3, memory.release, args=(held,)).start()

    async def wait_for_it() -> int:
        async with alock(lease_name, backend=memory, timeout=WAIT, **_ttl()) as lease:
            return lease.token

    token, ticks = run(ticking(wait_for_it))
    assert token == held.token + 1
    assert ticks >= 5


def test_alock_times_out_with_lease_held(memory: MemoryBackend, lease_name: str) -> None:
    memory.acquire(lease_name, "someone-else", 30)

    async def scenario() -> float:
        started = clock()
        with pytest.raises(LeaseHeld, match="someone-else"):
            async with alock(lease_name, backend=memory, timeout=0.3, **_ttl()):
                pass
        return clock() - started

    assert 0.3 <= run(scenario()) < WAIT


# -- Lease.wait_lost ------------------------------------------------------------------------------
def _held(deadline_in: float) -> Lease:
    lease = Lease("n", "me", 1, None, None, None, 0)
    lease.deadline = clock() + deadline_in
    return lease


def test_wait_lost_wakes_when_another_thread_marks_the_lease_lost() -> None:
    lease = _held(WAIT * 2)
    threading.Timer(0.2, lease._mark_lost, args=(LossReason.REFUSED,)).start()
    lost, ticks = run(ticking(lambda: lease.wait_lost(WAIT)))
    assert lost and lease.lost_cause is LossReason.REFUSED
    assert ticks >= 5


def test_wait_lost_times_out_while_held() -> None:
    lease = _held(WAIT * 2)
    assert run(lease.wait_lost(0.2)) is False
    assert lease.held and not lease._waiters  # its waiter removed


def test_wait_lost_sees_the_local_deadline_pass_unmarked() -> None:
    lease = _held(0.2)  # nobody renews it, nobody marks it
    assert run(lease.wait_lost(WAIT)) is True
    assert lease.lost_cause is LossReason.LOCAL_DEADLINE


# -- observe() ------------------------------------------------------------------------------------
def test_async_observe_yields_the_holder_then_each_change(
    memory: MemoryBackend, lease_name: str
) -> None:
    async def scenario() -> list[tuple[str, int] | None]:
        seen: list[tuple[str, int] | None] = []
        watching = observe(lease_name, backend=memory, interval=0.05)
        async for lease in watching:
            seen.append(None if lease is None else (lease.holder, lease.token))
            if len(seen) == 1:
                memory.acquire(lease_name, "first", 30)
            elif len(seen) == 2:
                assert seen[-1] is not None
                first = memory.read(lease_name)
                assert first is not None
                memory.release(first)
            else:
                break
        await watching.aclose()
        return seen

    seen = run(scenario())
    assert seen[0] is None and seen[1] is not None and seen[1][0] == "first" and seen[2] is None


def test_an_observation_is_iterated_one_way_only(memory: MemoryBackend, lease_name: str) -> None:
    watching = observe(lease_name, backend=memory, interval=0.05)
    assert next(watching) is None

    async def the_other_way() -> None:
        async for _ in watching:
            pass

    with pytest.raises(RuntimeError, match="iterated with for already"):
        run(the_other_way())
    watching.close()


# -- AsyncElector ---------------------------------------------------------------------------------
def test_async_elector_runs_callbacks_and_work_on_the_loop(
    memory: MemoryBackend, lease_name: str
) -> None:
    calls: list[tuple[str, bool]] = []

    class Recording(AsyncElector):
        async def on_elected(self, lease: Lease) -> None:
            calls.append(("elected", threading.current_thread() in loop_thread))

        def on_lost(self, lease: Lease) -> None:  # plain: in the campaign thread, at once
            calls.append(("lost", threading.current_thread().name.startswith("leader-elector")))

    async def work(lease: Lease) -> None:
        calls.append(("work", current_lease() is lease))
        working.set()
        try:
            await asyncio.sleep(WAIT * 2)
        except asyncio.CancelledError:
            calls.append(("cancelled", lease.lost.is_set()))
            raise

    async def scenario() -> None:
        loop_thread.append(threading.current_thread())
        elector = Recording(lease_name, backend=memory, **FAST)
        await elector.start(work)
        assert await elector.wait_for_leadership(WAIT)
        leader = await elector.leader()
        assert leader is not None and leader.holder == elector.identity
        await asyncio.wait_for(working.wait(), WAIT)  # else stop() may cancel it unstarted
        await elector.stop()
        assert not elector.is_leader
        assert await elector.leader() is None  # released on stop

    working = asyncio.Event()
    loop_thread: list[threading.Thread] = []
    run(scenario())
    assert calls == [("elected", True), ("work", True), ("lost", True), ("cancelled", True)] or (
        calls == [("elected", True), ("work", True), ("cancelled", True), ("lost", True)]
    )


def test_async_work_that_raises_ends_the_term_and_the_elector_campaigns_again(
    memory: MemoryBackend, lease_name: str
) -> None:
    terms: list[int] = []

    async def work(lease: Lease) -> None:
        terms.append(lease.token)
        if len(terms) == 1:
            raise RuntimeError("first term fails")
        await asyncio.sleep(WAIT * 2)

    async def scenario() -> None:
        elector = AsyncElector(lease_name, backend=memory, **FAST)
        await elector.start(work)
        started = clock()
        while len(terms) < 2 and clock() - started < WAIT:
            await asyncio.sleep(0.02)
        await elector.stop()

    run(scenario())
    assert len(terms) == 2 and terms[1] > terms[0]


def test_async_work_may_stop_its_own_elector(memory: MemoryBackend, lease_name: str) -> None:
    async def scenario() -> None:
        elector = AsyncElector(lease_name, backend=memory, **FAST)

        async def work(lease: Lease) -> None:
            await elector.stop()  # only asks: awaiting the end here would never return
            await lease.wait_lost(WAIT)

        await asyncio.wait_for(elector.run(work), WAIT)
        assert memory.read(lease_name) is None

    run(scenario())


def test_async_elector_steps_down_on_time_while_the_loop_is_blocked(
    memory: MemoryBackend, lease_name: str
) -> None:
    """The session thread, not the loop, keeps the deadline: a lease the store takes away
    is given up while the loop is still blocked."""

    async def scenario() -> tuple[bool, bool, bool]:
        elector = AsyncElector(lease_name, backend=memory, **FAST)
        await elector.start()
        assert await elector.wait_for_leadership(WAIT)
        lease = elector.lease
        assert lease is not None
        memory.force_release(lease_name)  # the next renewal is refused
        give_up = time.monotonic() + WAIT
        while not lease.lost.is_set() and time.monotonic() < give_up:
            time.sleep(0.05)  # the loop is blocked all along
        lost_while_blocked = lease.lost.is_set()
        leader_while_blocked = elector.is_leader
        await elector.stop()
        return lost_while_blocked, leader_while_blocked, lease.lost_cause is LossReason.REFUSED

    assert run(scenario()) == (True, False, True)


def test_async_with_an_elector_campaigns_for_the_block(
    memory: MemoryBackend, lease_name: str
) -> None:
    async def scenario() -> None:
        async with AsyncElector(lease_name, backend=memory, **FAST) as elector:
            assert await elector.wait_for_leadership(WAIT)
            follower = AsyncElector(lease_name, backend=memory, **FAST)
            await follower.start()
            assert not await follower.wait_for_leadership(0.3)
        assert not elector.is_leader
        assert await follower.wait_for_leadership(WAIT)  # released at the block's end
        await follower.stop()

    run(scenario())


# -- Elector from a coroutine ---------------------------------------------------------------------
def test_an_elector_started_from_a_coroutine_is_awaitable_and_runs_coroutines_on_the_loop(
    memory: MemoryBackend, lease_name: str
) -> None:
    seen: list[str] = []

    class Recording(Elector):
        async def on_elected(self, lease: Lease) -> None:
            seen.append(f"elected on loop: {threading.current_thread() is loop_thread[0]}")

    async def work(lease: Lease) -> None:
        seen.append(f"work on loop: {threading.current_thread() is loop_thread[0]}")
        await lease.wait_lost()
        await asyncio.sleep(WAIT * 2)  # cancelled: the term is over

    async def scenario() -> None:
        loop_thread.append(threading.current_thread())
        elector = Recording(lease_name, backend=memory, **FAST)
        await elector.start(work)
        with pytest.raises(TypeError, match=r"use `await Elector\.wait_for_leadership"):
            bool(elector.wait_for_leadership(WAIT))  # forgot to await: loud, not True
        # Typed for sync callers (AsyncElector is the typed async API): hence the ignores.
        assert await elector.wait_for_leadership(WAIT)  # type: ignore[misc]
        await elector.stop()  # type: ignore[func-returns-value,misc]  # without blocking
        assert not elector.is_leader and memory.read(lease_name) is None

    loop_thread: list[threading.Thread] = []
    run(scenario())
    assert seen == ["elected on loop: True", "work on loop: True"]


def test_elector_run_outside_a_loop_runs_a_coroutine_work_on_a_loop_of_its_own(
    memory: MemoryBackend, lease_name: str
) -> None:
    leases: list[Lease | None] = []
    elector = Elector(lease_name, backend=memory, **FAST)

    async def work(lease: Lease) -> None:
        leases.append(current_lease())
        elector.stop()  # from the work's own loop: only asks
        await asyncio.sleep(WAIT * 2)  # cancelled once the lease is lost

    thread = threading.Thread(target=elector.run, args=(work,))
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert len(leases) == 1 and leases[0] is not None and leases[0].lost.is_set()
    assert memory.read(lease_name) is None
