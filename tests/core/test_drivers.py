"""The two drivers of ``django_leader.core`` run the same steps alike: a thread blocking,
a coroutine awaiting. No service, no database: the store calls are a stand-in's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import pytest

from django_leader.core import (
    NOW,
    REARM,
    Call,
    Emit,
    Listen,
    Pause,
    Steps,
    aiterate,
    arun,
    iterate,
    run,
)


class InlineCaller:
    """Runs a store call in place (the drivers' caller: ``call`` / ``acall``)."""

    def call(self, timeout: float, fn: Callable[..., Any], *args: Any, on_late: Any = None) -> Any:
        return fn(*args)

    async def acall(
        self, timeout: float, fn: Callable[..., Any], *args: Any, on_late: Any = None
    ) -> Any:
        return fn(*args)


def fail() -> None:
    raise TimeoutError("no answer")


def watch(wake: Callable[[], None]) -> str:
    """A watch that wakes its waiter as soon as it opens."""
    wake()
    return "watch"


def script(log: list[str]) -> Steps[tuple[Any, ...]]:
    """Every effect once: a call, a failing call, the clock, a wake-up, a pause."""
    answer = yield Call(InlineCaller(), 1.0, lambda x: x * 2, (21,))  # type: ignore[arg-type]
    try:
        yield Call(InlineCaller(), 1.0, fail)  # type: ignore[arg-type]
    except TimeoutError as exc:
        log.append(f"caught {exc}")
    now = yield NOW
    yield REARM
    opened = yield Listen(watch)
    woken = yield Pause(30.0)  # woken at once: the watch woke it
    yield REARM  # a wake-up stands until forgotten
    timed_out = yield Pause(0.0)  # not woken again since
    return answer, isinstance(now, float), opened, woken, timed_out


def test_run_and_arun_take_the_same_steps_alike() -> None:
    blocking: list[str] = []
    awaited: list[str] = []
    expected = (42, True, "watch", True, False)
    assert run(script(blocking)) == expected
    assert asyncio.run(arun(script(awaited))) == expected
    assert blocking == awaited == ["caught no answer"]


def following(closed: list[str]) -> Generator[Any, Any, None]:
    try:
        for value in range(10):
            yield Emit(value)
            yield Pause(0.0)
    finally:
        closed.append("closed")


def test_iterate_and_aiterate_emit_and_clean_up_when_closed() -> None:
    closed: list[str] = []
    values = iterate(following(closed))
    assert [next(values), next(values)] == [0, 1]
    values.close()

    async def follow() -> list[int]:
        taken = aiterate(following(closed))
        got = [await taken.__anext__(), await taken.__anext__()]
        await taken.aclose()
        return got

    assert asyncio.run(follow()) == [0, 1]
    assert closed == ["closed", "closed"]


def test_a_cancelled_task_cancels_its_steps_which_clean_up() -> None:
    cleaned: list[str] = []

    def waiting() -> Steps[None]:
        try:
            yield Pause(None)  # until woken: never
        finally:
            cleaned.append("cleaned")

    async def cancel() -> None:
        task = asyncio.ensure_future(arun(waiting()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert cleaned == ["cleaned"]
