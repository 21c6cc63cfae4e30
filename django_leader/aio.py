"""The bridge between the campaign's threads and asyncio.

The campaign, the renewals and the local deadline run in threads (an Elector's, the
session's), whatever the event loop does; this module only carries what coroutines must
hear or run: a coroutine ``work(lease)`` run as a task and cancelled when the lease is
lost, and coroutine callbacks. The waits that wake a loop from another thread are
:mod:`django_leader.waits`' (below the Lease, which waits with them too); they are named
here as well, for the electors. The decisions of a term that a coroutine awaits are the
steps of :mod:`django_leader.core`, driven by its asyncio driver.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from .lease import Lease, _use_lease
from .waits import wait_event, wakeable

logger = logging.getLogger("django_leader")

__all__ = [
    "Awaited",
    "bounded",
    "call_back",
    "lead",
    "run_term",
    "running_loop",
    "terms_of",
    "wait_event",
    "wakeable",
]

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


#: The running work tasks of each elector (what ``stop()`` called from the work must not
#: wait for).
_terms: weakref.WeakKeyDictionary[object, set[asyncio.Task[Any]]] = weakref.WeakKeyDictionary()


def terms_of(owner: object) -> set[asyncio.Task[Any]]:
    """The work tasks ``owner`` (an elector) runs now."""
    return set(_terms.get(owner, ()))


async def lead(work: Awaitable[T], lease: Lease, owner: object) -> T | None:
    """Await ``work`` (one term's coroutine, of elector ``owner``) as a task with
    ``current_lease()`` set, and cancel it when ``lease`` is lost; None if it was
    cancelled so."""

    async def with_lease() -> T:
        with _use_lease(lease):
            return await work

    task = asyncio.ensure_future(with_lease())
    running = _terms.setdefault(owner, set())
    running.add(task)
    task.add_done_callback(running.discard)
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()  # leadership ended: the work must stop
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and lost.done():
                return None  # cancelled by us, as it should be
            raise
    finally:
        lost.cancel()


def run_term(
    work: Awaitable[T],
    lease: Lease,
    loop: asyncio.AbstractEventLoop | None,
    owner: object,
    label: str,
) -> T | None:
    """Run one term's coroutine ``work`` from a (work) thread, until it returns or, once
    ``lease`` is lost, until it has been cancelled: on ``loop`` if there is one (the loop
    that started the elector), else on an event loop of this thread's own."""
    if loop is None:
        return asyncio.run(lead(work, lease, owner))
    future = asyncio.run_coroutine_threadsafe(lead(work, lease, owner), loop)
    while True:
        try:
            return future.result(timeout=1.0)
        except concurrent.futures.TimeoutError:
            if loop.is_closed():  # nothing will ever run it: the term ends
                logger.warning("the event loop of %s closed while its work ran", label)
                if asyncio.iscoroutine(work):
                    work.close()
                return None


async def bounded(outcome: Awaitable[Any], timeout: float | None, label: str) -> None:
    """Await what a coroutine callback returned, as a task, for at most ``timeout`` seconds
    (None: until it ends); then cancel it, log a warning and return — without waiting for
    the cancellation: a callback that ignores it runs on, and nothing waits for it. What it
    raises, even after the bound, is logged."""
    task = asyncio.ensure_future(outcome)
    task.add_done_callback(lambda done: _log_failure(done, label))
    try:
        finished, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:  # the caller was cancelled: so is the callback
        task.cancel()
        raise
    if not finished:
        task.cancel()
        logger.warning("%s did not return within %gs: cancelled", label, timeout)


def _log_failure(task: asyncio.Future[Any], label: str) -> None:
    if not task.cancelled() and isinstance(task.exception(), Exception):
        logger.error("%s raised", label, exc_info=task.exception())


def call_back(
    outcome: Awaitable[Any],
    loop: asyncio.AbstractEventLoop | None,
    label: str,
    timeout: float | None = None,
) -> None:
    """Run what a coroutine callback returned: as a task on ``loop`` (not waited for), or,
    without a loop, on an event loop of this thread's own until it ends or ``timeout``
    passes (:func:`bounded`). Errors are logged."""
    guarded = bounded(outcome, timeout, f"callback of {label}")
    if loop is None:
        asyncio.run(guarded)
        return
    try:
        asyncio.run_coroutine_threadsafe(guarded, loop)
    except RuntimeError:  # the loop is closed
        logger.warning("callback of %s not run: its event loop is closed", label)
        guarded.close()
        if asyncio.iscoroutine(outcome):
            outcome.close()


class Awaited(Generic[T]):
    """What a blocking method returns when called from a coroutine: ``await`` it.

    Taken as a truth value it raises ``TypeError``: code that forgot to await would
    otherwise see a result that is always true."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, T]], what: str) -> None:
        self._make = make
        self._what = what

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    def __bool__(self) -> bool:
        raise TypeError(
            f"{self._what} was called from a coroutine, where it returns an awaitable "
            f"(so as not to block the event loop): use `await {self._what}`"
        )

    def __repr__(self) -> str:
        return f"<awaitable {self._what}>"
