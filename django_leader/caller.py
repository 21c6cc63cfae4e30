"""Bounded store calls: :class:`StoreCaller` runs a term's store calls on a thread of its
own, each waited for only up to a hard bound, so that a hung store never hangs its caller
(see docs/safety.md, "Bounded store calls")."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future
from contextlib import suppress
from typing import Any, Protocol, TypeVar

from .backends.base import Backend
from .lease import clock

logger = logging.getLogger("django_leader")

T = TypeVar("T")


class _Call:
    """One store call queued on, or running on, a :class:`_Worker`."""

    __slots__ = (
        "args",
        "bound",
        "finished",
        "fn",
        "future",
        "given_up",
        "on_late",
        "started",
        "worker",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        bound: float | None,
        on_late: Callable[[Any], None] | None,
        worker: _Worker,
    ) -> None:
        self.fn = fn
        self.args = args
        self.bound = bound
        self.on_late = on_late
        self.worker = worker
        self.future: Future[Any] = Future()
        self.started: float | None = None
        self.finished = False
        self.given_up = False  # its caller stopped waiting for it


class _Worker:
    """One thread, hence one store connection (the backends keep one per thread), running
    the calls of a :class:`StoreCaller` one after the other."""

    def __init__(self, caller: StoreCaller, number: int) -> None:
        self.caller = caller
        self.queue: deque[_Call] = deque()
        self.running: _Call | None = None
        self.abandoned = False  # left to a hung call: ends after it, taking no other
        self.closing = False  # ends once its queue is empty
        self.thread = threading.Thread(
            target=self._loop, name=f"leader-io:{caller.name}#{number}", daemon=True
        )

    def hung(self, now: float) -> bool:
        """True if the call running here has outlived its bound."""
        call = self.running
        return (
            call is not None
            and call.bound is not None
            and call.started is not None
            and now >= call.started + call.bound
        )

    def _loop(self) -> None:
        cond = self.caller._cond
        try:
            while True:
                with cond:
                    while not self.queue and not (self.closing or self.abandoned):
                        cond.wait()
                    if self.abandoned or not self.queue:
                        return
                    call = self.queue.popleft()
                    if not call.future.set_running_or_notify_cancel():
                        continue
                    call.started = clock()
                    self.running = call
                error: BaseException | None = None
                result: Any = None
                try:
                    result = call.fn(*call.args)
                except BaseException as exc:  # handed to whoever waits for the future
                    error = exc
                with cond:
                    self.running = None
                    call.finished = True
                    late = call.given_up
                    cond.notify_all()
                if error is None:
                    call.future.set_result(result)
                else:
                    call.future.set_exception(error)
                if late and error is None:
                    hand_late(call.fn, call.on_late, result, f" for {self.caller.name!r}")
        finally:
            # This thread's connection: after a hang it is not trusted again.
            with suppress(Exception):
                self.caller.backend.close()


def direct_call(
    timeout: float,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    on_late: Callable[[T], None] | None,
) -> T:
    """``fn(*args)`` in this thread, its driver bounding it. Answered after ``timeout``
    (the driver's timeouts add up: a pool wait, a connect, the answer), it counts as
    unanswered, as a call left behind by a ``StoreCaller`` does: ``TimeoutError``, and
    ``on_late(result)`` (a grant nobody acts on is handed back)."""
    sent = clock()
    result = fn(*args)
    took = clock() - sent
    if took <= timeout:
        return result
    hand_late(fn, on_late, result)
    raise TimeoutError(
        f"store call {getattr(fn, '__name__', fn)} answered after {took:.2f}s, "
        f"past its {timeout:.2f}s"
    )


def hand_late(
    fn: Callable[..., T], on_late: Callable[[T], None] | None, result: T, whose: str = ""
) -> None:
    """``on_late(result)``, the late answer of ``fn`` that nobody waited for; what it raises
    is logged (``whose``: the caller, for the log line)."""
    if on_late is None:
        return
    try:
        on_late(result)
    except Exception as exc:
        logger.warning(
            "handling the late answer of %s%s failed: %s", getattr(fn, "__name__", fn), whose, exc
        )


class Caller(Protocol):
    """What runs a holder's store calls: a :class:`StoreCaller`, or the
    :class:`~django_leader.session.Session` every holder of a store shares."""

    def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        bound: float | None = None,
        on_late: Callable[[T], None] | None = None,
        urgent: bool = False,
    ) -> Future[T]: ...

    def call(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T: ...

    async def acall(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T: ...


class StoreCaller:
    """Runs store calls on a worker thread of its own, each with a hard bound.

    The caller waits for a result only until a deadline, and can step down while a call
    still hangs (a local deadline never waits for the store). A call that outlives its
    bound (a frozen server, or a TCP peer that accepts and never answers: libpq has no
    read timeout) is left behind with its thread — and so with its connection, which the
    backends keep per thread — and the calls queued behind it move to a new worker thread
    with a new connection: the next call never waits for a hung one (docs/safety.md). The
    abandoned thread ends, closing its connection, whenever its call returns; a late
    success can be handed back through ``on_late`` (a lease nobody waits for any more is
    released rather than held).
    """

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self.name = name
        self._cond = threading.Condition(threading.RLock())
        self._worker: _Worker | None = None  # started with the first call
        self._workers = 0
        self._closed = False
        #: How many workers were left to a hung call.
        self.abandoned = 0

    def __repr__(self) -> str:
        return f"<StoreCaller {self.name!r}>"

    # -- calls ----------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        bound: float | None = None,
        on_late: Callable[[T], None] | None = None,
        urgent: bool = False,
    ) -> Future[T]:
        """Queue ``fn(*args)``; the future of its outcome. ``bound``: seconds after which
        the call, if still running, is deemed hung and left behind. ``urgent``: ahead of
        every call queued (a renewal)."""
        return self._submit(fn, args, bound, on_late, urgent).future

    def call(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(*args)`` on the worker; ``TimeoutError`` if it takes longer than ``timeout``
        (then it is left behind: ``on_late(result)`` runs should it succeed after all)."""
        call = self._submit(fn, args, timeout, on_late)
        for wait in self._waits(call, timeout):
            with self._cond:
                if not call.finished:  # else it was, and notified, while we looked
                    self._cond.wait(wait)
        result: T = call.future.result()  # being set, if not yet
        return result

    async def acall(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T:
        """:meth:`call` for a coroutine: the event loop runs on while the worker calls the
        store. ``TimeoutError`` after ``timeout``, as :meth:`call`. Should the awaiting task
        be cancelled, the call is given up: ``on_late(result)`` runs (on the worker) should
        it succeed after all, or right away if it already had."""
        call = self._submit(fn, args, timeout, on_late)
        done = asyncio.wrap_future(call.future)
        try:
            for wait in self._waits(call, timeout):
                if not done.done():
                    await asyncio.wait({done}, timeout=wait)
            result: T = await done  # being set, if not yet
        except asyncio.CancelledError:
            # Nobody will act on the outcome: hand it to on_late, as for a late answer.
            done.add_done_callback(_swallow)
            with self._cond:
                finished = call.finished
                if not finished:
                    self._give_up(call, abandon=False)
            future = call.future
            answered = finished and not future.cancelled() and future.exception() is None
            if answered and on_late is not None:
                self.submit(on_late, future.result())
            raise
        return result

    def _waits(self, call: _Call, timeout: float) -> Generator[float, None, None]:
        """How long a waiter of ``call`` should wait, again and again, until the call has
        finished: until its give-up time, or until the call running ahead of it outlives
        its bound (then, moved to a new worker, ``call`` waits for no hung one).
        ``TimeoutError`` once ``timeout`` passes: the call is given up, left behind if it
        runs. Written once for :meth:`call` and :meth:`acall`."""
        give_up = clock() + max(0.0, timeout)
        while True:
            with self._cond:
                if call.finished:
                    return
                now = clock()
                if now >= give_up:
                    self._give_up(call)
                    raise TimeoutError(
                        f"store call {getattr(call.fn, '__name__', call.fn)} still running "
                        f"after {timeout:.2f}s"
                    )
                wait = self._next_check(call, now, give_up) - now
            yield max(0.0, wait)

    def _next_check(self, call: _Call, now: float, give_up: float) -> float:
        """When a waiter of ``call`` should look again (call with ``_cond`` held): at its
        give-up time, or when the call running ahead of it outlives its bound — then, moved
        to a new worker, ``call`` waits for no hung one."""
        wake = give_up
        worker = call.worker
        running = worker.running
        if running is not None and running is not call:
            if worker.hung(now):
                self._abandon(worker)
                return now
            if running.bound is not None and running.started is not None:
                wake = min(wake, running.started + running.bound)
        return wake

    def _give_up(self, call: _Call, abandon: bool = True) -> None:
        """Stop waiting for ``call`` (with ``_cond`` held): a queued call is dropped; a
        running one is left to its worker (``abandon``: with its connection, the next
        calls moving to a new worker), and its late success goes to ``on_late``."""
        call.given_up = True
        if call.started is None:
            with suppress(ValueError):
                call.worker.queue.remove(call)
            call.future.cancel()
        elif abandon:
            self._abandon(call.worker)

    def _submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        bound: float | None,
        on_late: Callable[[Any], None] | None,
        urgent: bool = False,
    ) -> _Call:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            worker = self._worker
            if worker is None:
                worker = self._worker = self._new_worker()
            elif worker.hung(clock()):
                worker = self._abandon(worker)
            call = _Call(fn, args, None if bound is None else max(0.0, bound), on_late, worker)
            if urgent:
                worker.queue.appendleft(call)
            else:
                worker.queue.append(call)
            self._cond.notify_all()
            return call

    def _new_worker(self) -> _Worker:
        self._workers += 1
        worker = _Worker(self, self._workers)
        worker.thread.start()  # it waits for self._cond, held by our caller
        return worker

    def _abandon(self, worker: _Worker) -> _Worker:
        """Leave ``worker`` to its hung call; the worker that takes the calls from now on."""
        if worker.abandoned:
            return self._worker or worker
        worker.abandoned = True
        self.abandoned += 1
        running = worker.running
        logger.warning(
            "store call %s for %r still running after %.2fs: left behind with its "
            "connection; the next calls use a new one",
            getattr(running.fn, "__name__", running.fn) if running else "?",
            self.name,
            clock() - running.started if running and running.started is not None else 0.0,
        )
        pending, worker.queue = worker.queue, deque()
        if self._closed and not pending:
            if self._worker is worker:
                self._worker = None
            self._cond.notify_all()
            return worker
        new = self._new_worker()
        new.closing = self._closed
        new.queue = pending
        for call in pending:
            call.worker = new
        if self._worker is worker or self._worker is None:
            self._worker = new
        self._cond.notify_all()
        return new

    def unstick(self, force: bool = False) -> None:
        """Leave the running call to its thread if it has outlived its bound (``force``:
        whatever it has run), so that the calls queued behind it run on a new thread and
        connection now; the call left behind still completes for whoever waits for it.
        For a caller that only submits, and so never waits in :meth:`call`, which does
        this itself."""
        with self._cond:
            worker = self._worker
            if (
                worker is not None
                and not worker.abandoned
                and worker.running is not None
                and (force or worker.hung(clock()))
            ):
                self._abandon(worker)

    def leave(self, future: Future[Any]) -> None:
        """Leave the worker that ``future``'s call is on to the call it runs (``future``'s
        own, hung, or one ahead of it), so that the calls queued there, ``future``'s
        included, move to a new thread and connection. Nothing if that worker was left
        already (the call moved on, or hangs on a worker already replaced) or the call
        is done."""
        with self._cond:
            worker = self._worker
            if worker is None or worker.abandoned or worker.running is None:
                return
            if worker.running.future is future or any(c.future is future for c in worker.queue):
                self._abandon(worker)

    # -- end ------------------------------------------------------------------------------
    def close(self) -> None:
        """Take no more calls; the worker runs those queued, closes its connection and
        ends. Returns at once, even while a call hangs."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
            if worker is not None:
                worker.closing = True
                if worker.hung(clock()):  # what is queued behind it runs on a new one
                    self._abandon(worker)
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the current worker to end (after :meth:`close`)."""
        worker = self._worker
        if worker is None:
            return True
        worker.thread.join(timeout)
        return not worker.thread.is_alive()

    def shutdown(self, wait: bool = True) -> None:
        """:meth:`close`, then (``wait``) :meth:`join` (the ``Executor`` spelling)."""
        self.close()
        if wait:
            self.join()


def _swallow(future: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a future nobody awaits any more (no "never retrieved")."""
    if not future.cancelled():
        future.exception()
