"""The decisions of a term, written once, and the two drivers that run them.

A decision that must call the store or wait (acquire a lease, release it, wait for a
lock's turn, follow a name) is a generator that *yields effects* — what it needs done —
and receives their outcome: a :class:`Call` is answered with the store call's result (or
has its exception thrown in), :data:`NOW` with a clock reading, a :class:`Pause` with
whether it was woken. It does no I/O itself, so the same steps serve a thread and a
coroutine:

- :func:`run` drives them in a thread, blocking (store calls on the caller's worker,
  waits on a ``threading.Event``);
- :func:`arun` drives them in a coroutine, awaiting (store calls on the same worker
  threads, waits on an ``asyncio.Event``); a cancellation of the awaiting task is thrown
  into the steps, which clean up on the way out;
- :func:`iterate` / :func:`aiterate` drive steps that also :class:`Emit` values, as a
  generator / an asynchronous generator of them.

A test drives the steps by hand against a model store, with whatever answers, timeouts
and clock readings it likes (tests/core).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from .caller import Caller
from .lease import clock
from .waits import wait_event, wakeable

T = TypeVar("T")
P = ParamSpec("P")

__all__ = [
    "NOW",
    "REARM",
    "Call",
    "Emit",
    "Listen",
    "Pause",
    "Steps",
    "aiterate",
    "arun",
    "awaiting",
    "blocking",
    "iterate",
    "run",
    "stamped",
]


@dataclass(frozen=True)
class Call:
    """Call ``fn(*args)`` on ``caller``'s worker, waiting at most ``bound`` seconds: its
    result, or its exception (``TimeoutError`` after the bound; ``on_late(result)`` runs
    should it succeed after its waiter gave up)."""

    caller: Caller
    bound: float
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    on_late: Callable[[Any], None] | None = None


class _Now:
    """Read the clock (:func:`django_leader.lease.clock`): the reading."""

    def __repr__(self) -> str:
        return "NOW"


class _Rearm:
    """Forget any wake-up so far: only one from now on ends the next :class:`Pause`."""

    def __repr__(self) -> str:
        return "REARM"


NOW = _Now()
REARM = _Rearm()


@dataclass(frozen=True)
class Listen:
    """Call ``open(wake)`` here (not on a worker): ``wake`` ends the current or next
    :class:`Pause`, from any thread. Its outcome: what ``open`` returned (a watch)."""

    open: Callable[[Callable[[], None]], Any]


@dataclass(frozen=True)
class Pause:
    """Wait until woken (see :class:`Listen`) or ``timeout`` seconds pass (None: until
    woken): whether it was woken."""

    timeout: float | None


@dataclass(frozen=True)
class Emit:
    """Hand ``value`` to whoever iterates the steps (:func:`iterate`); outcome None."""

    value: Any


Effect = Call | _Now | _Rearm | Listen | Pause | Emit
#: Steps that yield effects and return a ``T``.
Steps = Generator[Effect, Any, T]


def stamped(fn: Callable[..., T], *args: Any) -> tuple[float, T]:
    """``fn(*args)`` with the clock read just before it runs (on the worker: the time the
    request is sent, which a local deadline counts from): ``(sent, result)``."""
    sent = clock()
    return sent, fn(*args)


class _Returned:
    """The value the steps returned, emitted last (see :func:`_returning`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _returning(steps: Steps[T]) -> Generator[Effect, Any, None]:
    """``steps``, emitting what they return as their last value."""
    value = yield from steps
    yield Emit(_Returned(value))


class _Drive:
    """Where a driver is in its steps: the outcome of the last effect, handed in next."""

    __slots__ = ("error", "steps", "value")

    def __init__(self, steps: Generator[Effect, Any, Any]) -> None:
        self.steps = steps
        self.value: Any = None
        self.error: BaseException | None = None

    def next(self) -> Effect | None:
        """Hand the last outcome to the steps: the next effect, None once they end."""
        error, self.error = self.error, None  # no reference cycle through the traceback
        value, self.value = self.value, None
        try:
            return self.steps.throw(error) if error is not None else self.steps.send(value)
        except StopIteration:
            return None

    def failed(self, error: BaseException) -> None:
        """The effect raised ``error`` (a cancellation too): thrown into the steps, which
        clean up and decide."""
        self.error = error


def _local(effect: Effect, woken: threading.Event | asyncio.Event, wake: Callable[[], None]) -> Any:
    """The outcome of an effect both drivers take alike (no wait, no store call)."""
    if isinstance(effect, _Now):
        return clock()
    if isinstance(effect, _Rearm):
        woken.clear()
        return None
    if isinstance(effect, Listen):
        return effect.open(wake)
    raise TypeError(f"not an effect the driver takes here: {effect!r}")


def _only(emitted: Any) -> Any:
    """What :func:`run` / :func:`arun` take from their steps: only the returned value."""
    if not isinstance(emitted, _Returned):
        raise TypeError(f"steps emitted {emitted!r}: iterate them instead")
    return emitted.value


# -- the thread driver ----------------------------------------------------------------------
def _perform(effect: Effect, woken: threading.Event | None, drive: _Drive) -> None:
    try:
        if isinstance(effect, Call):
            drive.value = effect.caller.call(
                effect.bound, effect.fn, *effect.args, on_late=effect.on_late
            )
        else:
            assert woken is not None
            if isinstance(effect, Pause):
                drive.value = woken.wait(effect.timeout)
            else:
                drive.value = _local(effect, woken, woken.set)
    except BaseException as exc:
        drive.failed(exc)


def iterate(steps: Generator[Effect, Any, Any]) -> Generator[Any, None, None]:
    """Drive ``steps`` in this thread, blocking, yielding what they :class:`Emit`.
    Closing the generator closes the steps (they clean up)."""
    drive = _Drive(steps)
    woken: threading.Event | None = None  # made for the first effect that is no Call
    try:
        while (effect := drive.next()) is not None:
            if isinstance(effect, Emit):
                yield effect.value
            else:
                if woken is None and not isinstance(effect, Call):
                    woken = threading.Event()
                _perform(effect, woken, drive)
    finally:
        steps.close()


def run(steps: Steps[T]) -> T:
    """Drive ``steps`` in this thread, blocking: what they return."""
    driver = iterate(_returning(steps))
    try:
        result: T = _only(next(driver))
    finally:
        driver.close()
    return result


# -- the asyncio driver ---------------------------------------------------------------------
async def _aperform(
    effect: Effect, woken: asyncio.Event, wake: Callable[[], None], drive: _Drive
) -> None:
    try:
        if isinstance(effect, Call):
            drive.value = await effect.caller.acall(
                effect.bound, effect.fn, *effect.args, on_late=effect.on_late
            )
        elif isinstance(effect, Pause):
            drive.value = await wait_event(woken, effect.timeout)
        else:
            drive.value = _local(effect, woken, wake)
    except BaseException as exc:  # a cancellation too
        drive.failed(exc)


async def aiterate(steps: Generator[Effect, Any, Any]) -> AsyncGenerator[Any, None]:
    """:func:`iterate` for a coroutine: ``async for`` over what the steps emit, the event
    loop running on while they wait. A cancellation is thrown into the steps."""
    drive = _Drive(steps)
    woken, wake = wakeable()
    try:
        while (effect := drive.next()) is not None:
            if isinstance(effect, Emit):
                yield effect.value
            else:
                await _aperform(effect, woken, wake, drive)
    finally:
        steps.close()


async def arun(steps: Steps[T]) -> T:
    """Drive ``steps`` in a coroutine, awaiting: what they return. Cancelled, the
    cancellation is thrown into the steps (they clean up, and it goes on up)."""
    driver = aiterate(_returning(steps))
    try:
        result: T = _only(await driver.__anext__())
    finally:
        await driver.aclose()
    return result


# -- entry points -----------------------------------------------------------------------------
def blocking(steps: Callable[P, Steps[T]]) -> Callable[P, T]:
    """The function that runs ``steps`` (a function making steps) in the calling thread."""

    @functools.wraps(steps)
    def driven(*args: P.args, **kwargs: P.kwargs) -> T:
        return run(steps(*args, **kwargs))

    return driven


def awaiting(steps: Callable[P, Steps[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """The coroutine function that runs ``steps`` (a function making steps) in its task."""

    @functools.wraps(steps)
    async def driven(*args: P.args, **kwargs: P.kwargs) -> T:
        return await arun(steps(*args, **kwargs))

    return driven
