"""``lock()`` and the :class:`Renewer` that keeps a held lease alive (shared with the Elector
and ``singleton_task``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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


class StoreCaller:
    """Runs store calls on a worker thread of its own.

    The caller waits for a result only until a deadline, and can step down while a call
    still hangs (SPEC rule 2). The worker thread owns its store connection, which
    :meth:`close` closes.
    """

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self._used = False
        # The thread starts with the first call: a short lock() may never need one.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"leader-io:{name}")

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        self._used = True
        return self._executor.submit(fn, *args)

    def call(self, timeout: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker; ``TimeoutError`` if it takes longer than ``timeout``."""
        future = self.submit(fn, *args)
        try:
            return future.result(timeout=max(0.0, timeout))
        except FutureTimeout:
            raise TimeoutError(
                f"store call {fn.__name__} still running after {timeout:.2f}s"
            ) from None

    def close(self) -> None:
        if self._used:  # else no thread, and no connection of its own to close
            try:
                self._executor.submit(self.backend.close)
            except RuntimeError:  # already shut down
                return
        self._executor.shutdown(wait=False)


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
            future = self.caller.submit(self.backend.renew, lease, timing.ttl)
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
            self.caller.submit(self.backend.record, "lost", lease, reason)
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


class _Hold:
    """One thread's hold of a lease name: kept per thread, so that one ``Lock`` object
    used by several threads never mixes up their leases, renewers or connections."""

    def __init__(self, lease: Lease, renewer: Renewer, caller: StoreCaller) -> None:
        self.lease = lease
        self.renewer = renewer
        self.caller = caller
        self.depth = 1


class _Held(threading.local):
    def __init__(self) -> None:
        self.locks: dict[str, _Hold] = {}


_held = _Held()


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
        self.backend = resolve_backend(backend, self.timing)
        #: The lease of the last ``with`` block entered (in any thread).
        self.lease: Lease | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r}>"

    def __enter__(self) -> Lease:
        outer = _held.locks.get(self.name)
        if outer is not None:
            outer.lease.check()
            outer.depth += 1
            self.lease = outer.lease
            return outer.lease
        lease = self._acquire()
        self.lease = lease
        caller = StoreCaller(self.backend, self.name)
        renewer = Renewer(self.backend, lease, self.timing, caller, on_lost=self._lost)
        renewer.start()
        _held.locks[self.name] = _Hold(lease, renewer, caller)
        logger.info(
            "acquired lock %r (token %s)",
            lease.name,
            lease.token,
            extra=log_extra(lease),
        )
        signals.send(signals.leader_elected, self, lease=lease)
        return lease

    def _acquire(self) -> Lease:
        give_up = None if self.timeout is None else clock() + self.timeout
        while True:
            acquired, current = acquire_once(self.backend, self.name, self.identity, self.timing)
            if acquired is not None:
                if acquired.held:
                    return acquired
                # Answered after its own deadline: never act on it; hand it back.
                self.backend.release(acquired)
                current = None
            now = clock()
            if not self.blocking or (give_up is not None and now >= give_up):
                # No holder, yet refused: force-released, its term not over (or the
                # holder released in between, and the next attempt would win).
                holder = (
                    f" by {current.holder} (token {current.token})"
                    if current
                    else " (no holder: force-released, or released just now; the term of a "
                    "force-released lease must end before anyone may take it)"
                )
                raise LeaseHeld(f"lease {self.name!r} is held{holder}")
            pause = self.timing.retry_interval
            if give_up is not None:
                pause = min(pause, give_up - now)
            time.sleep(max(0.0, pause))

    def _lost(self, lease: Lease) -> None:
        signals.send(signals.leader_lost, self, lease=lease)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = _held.locks[self.name]
        if hold.depth > 1:
            hold.depth -= 1
            return
        del _held.locks[self.name]
        lease = hold.lease
        hold.renewer.stop()
        was_held = lease.held
        lease._mark_lost("released")
        try:
            released = self.backend.release(lease)
        except BackendUnavailable as exc:
            released = False
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
