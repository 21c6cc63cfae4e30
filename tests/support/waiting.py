"""Waiting in tests for something to happen: poll it, with a deadline, never a fixed sleep.

Wait on an event (``threading.Event.wait``, a queue, a condition) where there is one;
:func:`wait_until` is for what can only be looked at: a store's row, a file, a process,
a counter another thread bumps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.05,
    message: str | Callable[[], object] = "the condition never held",
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value, and
    return that value; fail the test (AssertionError, as a failed ``assert``) if it has
    not within ``timeout`` seconds.

    The failure says ``message`` (a callable is called then, so that it can describe the
    state at the deadline) and the last value ``predicate`` returned. An exception raised
    by ``predicate`` is not caught: it fails the test at once.
    """
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = give_up - time.monotonic()
        if left <= 0:
            text = message() if callable(message) else message
            raise AssertionError(f"{text}\n(not within {timeout:g} s; last value: {value!r})")
        time.sleep(min(interval, left))


def in_thread(fn: Callable[[], Any], name: str = "test-call") -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a daemon thread; its outcome (return value or exception) lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def returns_within(call: Callable[[], Any], timeout: float, what: str) -> Any:
    """``call()`` in a daemon thread: what it returned, or the exception it raised; fail
    the test (``what`` never returned) if it has not within ``timeout`` seconds. For calls
    that the code before a fix left hanging for ever."""
    caller, outcome = in_thread(call, name="returns-within")
    caller.join(timeout)
    assert not caller.is_alive(), f"{what} never returned (not within {timeout:g} s)"
    return outcome[0]
