"""``lock()`` and the :class:`Renewer` that keeps a held lease alive (shared with the Elector
and ``singleton_task``)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from types import TracebackType
from typing import Any, TypeVar

from . import hooks, signals
from .backends import get_backend
from .backends.base import Backend
from .conf import Timing, default_identity, resolve_timing, validate_identity, validate_name
from .exceptions import BackendUnavailable, LeaseHeld
from .lease import Lease, clock

logger = logging.getLogger("django_leader")

T = TypeVar("T")


def resolve_backend(backend: Backend | str | None, timing: Timing | None = None) -> Backend:
    """The backend to use: an instance as given, else the one named (default: settings),
    with store-call timeouts short enough for ``timing`` (SPEC rule 6)."""
    if backend is None or isinstance(backend, str):
        return get_backend(backend, timeout=None if timing is None else timing.call_timeout)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend or a dotted path, got {backend!r}")
    return backend


def log_extra(lease: Lease) -> dict[str, Any]:
    return {"lease": lease.name, "holder": lease.holder, "token": lease.token}


def call_bound(timing: Timing) -> float:
    """The hard bound of one store call of a lock or an Elector (acquire, release, read):
    three times the store's own call timeout (its socket and statement timeouts fire
    first, normally), never past the local deadline an acquisition sent now would have."""
    return max(timing.call_timeout, min(3 * timing.call_timeout, timing.ttl - timing.safety_margin))


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
                if late and error is None and call.on_late is not None:
                    try:
                        call.on_late(result)
                    except Exception as exc:
                        logger.warning(
                            "handling the late answer of %s for %r failed: %s",
                            getattr(call.fn, "__name__", call.fn),
                            self.caller.name,
                            exc,
                        )
        finally:
            # This thread's connection: after a hang it is not trusted again.
            with suppress(Exception):
                self.caller.backend.close()


class StoreCaller:
    """Runs store calls on a worker thread of its own, each with a hard bound.

    The caller waits for a result only until a deadline, and can step down while a call
    still hangs (SPEC rule 2). A call that outlives its bound (a frozen server, or a TCP
    peer that accepts and never answers: libpq has no read timeout) is left behind with
    its thread — and so with its connection, which the backends keep per thread — and the
    calls queued behind it move to a new worker thread with a new connection: the next
    call never waits for a hung one (SPEC rule 6). The abandoned thread ends, closing its
    connection, whenever its call returns; a late success can be handed back through
    ``on_late`` (a lease nobody waits for any more is released rather than held).
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
    ) -> Future[T]:
        """Queue ``fn(*args)``; the future of its outcome. ``bound``: seconds after which
        the call, if still running, is deemed hung and left behind."""
        return self._submit(fn, args, bound, on_late).future

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
        if not self._wait(call, timeout):
            raise TimeoutError(
                f"store call {getattr(fn, '__name__', fn)} still running after {timeout:.2f}s"
            )
        result: T = call.future.result()
        return result

    def _submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        bound: float | None,
        on_late: Callable[[Any], None] | None,
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
            worker.queue.append(call)
            self._cond.notify_all()
            return call

    def _wait(self, call: _Call, timeout: float) -> bool:
        """Wait for ``call`` up to ``timeout``, moving it off a worker whose running call
        hangs; False (the call given up, left behind if it runs) if it did not finish."""
        give_up = clock() + max(0.0, timeout)
        with self._cond:
            while True:
                if call.finished:
                    return True
                now = clock()
                worker = call.worker
                if now >= give_up:
                    call.given_up = True
                    if call.started is None:
                        with suppress(ValueError):
                            worker.queue.remove(call)
                        call.future.cancel()
                    else:
                        self._abandon(worker)
                    return False
                wake = give_up
                running = worker.running
                if running is not None and running is not call:
                    if worker.hung(now):
                        self._abandon(worker)  # ours moves to a new worker
                        continue
                    if running.bound is not None and running.started is not None:
                        wake = min(wake, running.started + running.bound)
                self._cond.wait(max(0.0, wake - now))

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
            running.bound if running and running.bound is not None else 0.0,
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


class Renewer:
    """Renews one held lease every ``renew_interval`` in a background thread.

    The lease is marked lost (``lease.lost`` set, ``on_lost(lease)`` called once) as soon
    as: a renewal is refused, or the local deadline (send time of the last successful
    acquire/renew + TTL - safety margin) passes, even if a renewal is still in flight.
    Transient store errors are retried until that deadline.
    """

    def __init__(
        self,
        backend: Backend,
        lease: Lease,
        timing: Timing,
        caller: StoreCaller,
        on_lost: Callable[[Lease], None] | None = None,
    ) -> None:
        if lease.deadline is None:
            raise ValueError("Renewer needs a held lease (with a deadline)")
        self.backend = backend
        self.lease = lease
        self.timing = timing
        self.caller = caller
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._kick = threading.Event()  # set by stop() and by a renewal that completes
        self._report_lock = threading.Lock()
        self._reported = False
        self._thread = threading.Thread(
            target=self._run, name=f"leader-renew:{lease.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (does not release). Returns at once, even while a renewal hangs.

        A lease whose deadline passed before the thread could notice is reported lost here.
        """
        self._stop.set()
        self._kick.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        deadline = self.lease.deadline
        if deadline is not None and clock() >= deadline:
            self._lose("deadline passed without a successful renewal")

    def _run(self) -> None:
        try:
            self._renew_until_lost()
        except Exception as exc:  # a bug or a foreign backend's error: never die silently
            logger.exception("renewer of %r failed", self.lease.name)
            self._lose(f"renewer failed: {exc!r}")

    def _renew_until_lost(self) -> None:
        lease, timing = self.lease, self.timing
        assert lease.deadline is not None
        next_renew = lease.deadline - timing.ttl + timing.safety_margin + timing.renew_interval
        while True:
            deadline = lease.deadline
            assert deadline is not None
            if self._stop.wait(max(0.0, min(next_renew, deadline) - clock())):
                return
            now = clock()
            if now >= deadline:
                self._lose("deadline passed without a successful renewal")
                return
            self._kick.clear()
            future = self.caller.submit(
                self.backend.renew, lease, timing.ttl, bound=max(0.0, deadline - now)
            )
            future.add_done_callback(lambda _: self._kick.set())
            self._kick.wait(max(0.0, deadline - now))
            if self._stop.is_set():
                return
            if not future.done():
                hooks.notify("renew_failed", lease.name)
                self._lose("deadline passed while a renewal was still in flight")
                return
            try:
                renewed = future.result()
            except BackendUnavailable as exc:
                hooks.notify("renew_failed", lease.name)
                now = clock()
                logger.warning(
                    "renewing %r failed, retrying: %s", lease.name, exc, extra=log_extra(lease)
                )
                next_renew = now + min(timing.retry_interval, max(0.05, (deadline - now) / 2))
                continue
            if renewed is None:
                hooks.notify("renew_refused", lease.name)
                self._lose("renewal refused: the lease was taken over or released")
                return
            hooks.notify("renew", lease.name, clock() - now)
            if not lease._update(renewed, now + timing.ttl - timing.safety_margin):
                # Answered, but too late: callers may already have seen the lease as lost,
                # and it must never come back to life.
                self._lose("deadline passed before the renewal was answered")
                return
            next_renew = now + timing.renew_interval

    def _lose(self, reason: str) -> None:
        """Mark the lease lost and report it, exactly once, whoever marked it first (a
        reader of ``lease.held`` may have seen the deadline pass before this thread did)."""
        lease = self.lease
        lease._mark_lost(reason)
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        reason = lease.lost_reason
        logger.warning(
            "lost lease %r (token %s): %s",
            lease.name,
            lease.token,
            reason,
            extra=log_extra(lease),
        )
        with suppress(RuntimeError):  # the owner may already have closed the caller
            self.caller.submit(
                self.backend.record, "lost", lease, reason, bound=self.timing.call_timeout
            )
        if self.on_lost is not None:
            try:
                self.on_lost(lease)
            except Exception:
                logger.exception("on_lost handler for %r raised", lease.name)


def acquire_once(
    backend: Backend, name: str, holder: str, timing: Timing
) -> tuple[Lease | None, Lease | None]:
    """One acquisition attempt; the lease it returns carries its local deadline."""
    sent = clock()
    acquired, current = backend.acquire(name, holder, timing.ttl)
    if acquired is not None:
        acquired.deadline = sent + timing.ttl - timing.safety_margin
        acquired.backend = backend
    return acquired, current


#: Who holds a hold: (process id, thread, asyncio task or None).
_Owner = tuple[int, threading.Thread, "asyncio.Task[Any] | None"]


def _owner() -> _Owner:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop running in this thread
        task = None
    return (os.getpid(), threading.current_thread(), task)


class _Hold:
    """One holder's hold of a lease name: its lease, renewer and store connection.

    A holder is a thread, or an asyncio task: holds are kept in a context variable (each
    task runs in a context of its own; a new thread starts with an empty one) and carry
    their owner, so that a context that was copied — into a task or, where Python makes
    threads inherit it, a thread started inside the block — or inherited by a forked
    child never re-enters a hold that is not its own.
    """

    def __init__(
        self,
        lease: Lease,
        renewer: Renewer,
        caller: StoreCaller,
        owner: _Owner,
        shadowed: _Hold | None,
    ) -> None:
        self.lease = lease
        self.renewer = renewer
        self.caller = caller
        self.owner = owner
        self.shadowed = shadowed  # another owner's hold of the name this one hides
        self.depth = 1

    def owned_by(self, owner: _Owner) -> bool:
        return self.owner[0] == owner[0] and self.owner[1] is owner[1] and self.owner[2] is owner[2]


#: Lease name -> hold, in this context. Never changed in place: each change sets a copy,
#: so that a context copied earlier keeps what it saw.
_holds: contextvars.ContextVar[dict[str, _Hold]] = contextvars.ContextVar(
    "django_leader_holds",
    default={},  # noqa: B039 (never mutated)
)


def _set_hold(name: str, hold: _Hold | None) -> None:
    holds = dict(_holds.get())
    if hold is None:
        holds.pop(name, None)
    else:
        holds[name] = hold
    _holds.set(holds)


class Lock:
    """Holds lease ``name`` for a ``with`` block and renews it in the background.

    Use through :func:`~django_leader.lock`.
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | None = None,
        identity: str | None = None,
        backend: Backend | str | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.timing = resolve_timing(ttl)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        self.blocking = blocking
        self.timeout = timeout
        self.identity = validate_identity(identity) if identity is not None else default_identity()
        self._own_identity = identity is None  # the process's, made anew after a fork
        self.backend = resolve_backend(backend, self.timing)
        #: The lease of the last ``with`` block entered (in any thread).
        self.lease: Lease | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r}>"

    def __enter__(self) -> Lease:
        owner = _owner()
        outer = _holds.get().get(self.name)
        if outer is not None and outer.owned_by(owner):
            outer.lease.check()
            outer.depth += 1
            self.lease = outer.lease
            return outer.lease
        if self._own_identity:  # a Lock made before a fork must not use the parent's
            self.identity = default_identity()
        caller = StoreCaller(self.backend, self.name)
        try:
            lease = self._acquire(caller)
        except BaseException:
            caller.close()
            raise
        self.lease = lease
        renewer = Renewer(self.backend, lease, self.timing, caller, on_lost=self._lost)
        renewer.start()
        _set_hold(self.name, _Hold(lease, renewer, caller, owner, outer))
        logger.info(
            "acquired lock %r (token %s)",
            lease.name,
            lease.token,
            extra=log_extra(lease),
        )
        signals.send(signals.leader_elected, self, lease=lease)
        return lease

    def _acquire(self, caller: StoreCaller) -> Lease:
        timing = self.timing
        give_up = None if self.timeout is None else clock() + self.timeout
        while True:
            bound = call_bound(timing)
            if give_up is not None:
                bound = min(bound, max(timing.call_timeout, give_up - clock()))
            try:
                acquired, current = caller.call(
                    bound,
                    acquire_once,
                    self.backend,
                    self.name,
                    self.identity,
                    timing,
                    on_late=self._hand_back_late,
                )
            except TimeoutError:
                raise BackendUnavailable(
                    f"lease {self.name!r}: the store did not answer within {bound:.2f}s "
                    "(a frozen server or connection); should the attempt succeed later, "
                    "the lease is released at once"
                ) from None
            if acquired is not None:
                if acquired.held:
                    return acquired
                # Answered after its own deadline: never act on it; hand it back.
                with suppress(BackendUnavailable, TimeoutError):
                    caller.call(bound, self.backend.release, acquired)
                current = None
            now = clock()
            if not self.blocking or (give_up is not None and now >= give_up):
                holder = (
                    f" by {current.holder} (token {current.token})"
                    if current
                    else " (no holder, yet refused: it was force-released and the term of "
                    "its holder is not over, or the store may have lost its leases and the "
                    "lock-delay is not over — no one may take it until every earlier holder "
                    "has stopped believing it leads; or it was released just now)"
                )
                raise LeaseHeld(f"lease {self.name!r} is held{holder}")
            pause = timing.retry_interval
            if give_up is not None:
                pause = min(pause, give_up - now)
            time.sleep(max(0.0, pause))

    def _hand_back_late(self, result: tuple[Lease | None, Lease | None]) -> None:
        """An acquisition that answered after lock() gave up on it: release, not hold.
        Runs on the thread that was left behind with the call (its connection answers)."""
        acquired = result[0]
        if acquired is not None:
            self.backend.release(acquired)
            logger.info(
                "released lock %r (token %s): acquired after lock() had given up",
                acquired.name,
                acquired.token,
                extra=log_extra(acquired),
            )

    def _lost(self, lease: Lease) -> None:
        signals.send(signals.leader_lost, self, lease=lease)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = _holds.get().get(self.name)
        owner = _owner()
        if hold is not None and hold.owner[0] != owner[0]:
            # Inherited across a fork: the parent's hold. Forget it; never release it.
            _set_hold(self.name, hold.shadowed)
            return
        if hold is None or not hold.owned_by(owner):
            raise RuntimeError(
                f"lock {self.name!r} exited by a thread or task that did not enter it"
            )
        if hold.depth > 1:
            hold.depth -= 1
            return
        _set_hold(self.name, hold.shadowed)
        lease = hold.lease
        hold.renewer.stop()
        was_held = lease.held
        lease._mark_lost("released")
        released = False
        try:
            released = hold.caller.call(call_bound(self.timing), self.backend.release, lease)
        except (BackendUnavailable, TimeoutError) as exc:
            logger.warning(
                "could not release lock %r, it will expire: %s",
                lease.name,
                exc,
                extra=log_extra(lease),
            )
        finally:
            hold.caller.close()
        if released:
            logger.info(
                "released lock %r (token %s)", lease.name, lease.token, extra=log_extra(lease)
            )
            signals.send(signals.lease_released, self, lease=lease)
        elif was_held:
            logger.warning(
                "lock %r was no longer ours at release", lease.name, extra=log_extra(lease)
            )


def lock(
    name: str,
    *,
    ttl: float | None = None,
    blocking: bool = True,
    timeout: float | None = None,
    identity: str | None = None,
    backend: Backend | str | None = None,
) -> Lock:
    """Hold lease ``name`` for a ``with`` block, renewing it in the background.

    ``with lock("nightly-report") as lease:`` yields the :class:`~django_leader.Lease`;
    check ``lease.lost`` / call ``lease.check()`` in long blocks, or write through
    ``lease.fenced()``. If the lease is held elsewhere: wait (``blocking=True``, up to
    ``timeout`` seconds), else raise :class:`~django_leader.LeaseHeld`. Reentrant within a
    thread: a nested ``lock()`` of a name this thread holds succeeds at once, and the lease
    is released when the outermost block exits.
    """
    return Lock(
        name, ttl=ttl, blocking=blocking, timeout=timeout, identity=identity, backend=backend
    )
