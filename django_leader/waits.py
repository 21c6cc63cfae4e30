"""Waits that wake an event loop from another thread: the asyncio primitives below both
the :class:`~django_leader.Lease` value object and the asyncio bridge
(:mod:`django_leader.aio`), which import them from here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds; whether it was set.

    Not ``asyncio.wait_for(event.wait(), timeout)``: before Python 3.12, that swallows a
    cancellation of the waiting task that arrives together with the event (the task then
    goes on as if nothing happened). ``asyncio.wait`` never does."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)


def wakeable() -> tuple[asyncio.Event, Callable[[], None]]:
    """An event of the running loop, and a function any thread may call to set it there
    (a no-op once the loop is closed: nobody waits any more)."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def wake() -> None:
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)

    return event, wake
