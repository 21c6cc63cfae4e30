"""``lock()`` and ``alock()``: a term held for a ``with`` / ``async with`` block, reentrant
per thread and asyncio task.

The term itself (grant, renewal, release, signals) is :mod:`django_leader.term`'s. Entering
a block is written once, as steps (:mod:`django_leader.core`) that ``with`` drives in its
thread and ``async with`` in its task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import jitter
from .backends.base import Backend, Watch
from .caller import Caller
from .conf import default_identity, resolve_timing, validate_identity, validate_name
from .core import REARM, Listen, Pause, Steps, arun, run
from .exceptions import BackendUnavailable, LeaseHeld, StoreBusy
from .lease import Lease, clock
from .session import Session
from .session import session as session_of
from .term import Term, attempting, call_bound, resolve_backend

__all__ = ["Lock", "alock", "lock"]

#: Who holds a hold: (process id, thread, asyncio task or None).
_Owner = tuple[int, threading.Thread, "asyncio.Task[Any] | None"]


def _owner() -> _Owner:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop running in this thread
        task = None
    return (os.getpid(), threading.current_thread(), task)


logger = logging.getLogger("django_leader")


class _Hold:
    """One holder's hold of a lease name: its term (lease, renewer, store connection).

    A holder is a thread, or an asyncio task: holds are kept in a context variable (each
    task runs in a context of its own; a new thread starts with an empty one) and carry
    their owner, so that a context that was copied — into a task or, where Python makes
    threads inherit it, a thread started inside the block — or inherited by a forked
    child never re-enters a hold that is not its own.
    """

    def __init__(self, term: Term, owner: _Owner, shadowed: _Hold | None) -> None:
        self.term = term
        self.lease = term.lease
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


class _Polling:
    """No wake-ups from this store: the waiting lock polls."""

    live = False

    def close(self) -> None:
        pass


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
        self._busy = False  # whether this acquisition has logged a busy store

    def __repr__(self) -> str:
        return f"<Lock {self.name!r}>"

    def __enter__(self) -> Lease:
        return run(self._entering())

    async def __aenter__(self) -> Lease:
        """``async with``: as ``with``, but waiting and store calls never block the event
        loop; reentrant per asyncio task (see :func:`~django_leader.alock`)."""
        return await arun(self._entering())

    def _entering(self) -> Steps[Lease]:
        """The steps of entering the block: a nested block re-enters its owner's hold, an
        outer one acquires and holds."""
        owner = _owner()
        outer = _holds.get().get(self.name)
        if outer is not None and outer.owned_by(owner):
            return self._reenter(outer)
        caller = self._caller()
        lease = yield from self._acquiring(caller)
        return self._hold(lease, caller, owner, outer)

    def _reenter(self, outer: _Hold) -> Lease:
        outer.lease.check()
        outer.depth += 1
        self.lease = outer.lease
        return outer.lease

    def _caller(self) -> Session:
        if self._own_identity:  # a Lock made before a fork must not use the parent's
            self.identity = default_identity()
        # Every lock of the process on this store shares one caller and one renewal loop.
        return session_of(self.backend)

    def _hold(self, lease: Lease, caller: Caller, owner: _Owner, outer: _Hold | None) -> Lease:
        """Hold a granted lease: its term begins (renewed by the session from now on)."""
        self.lease = lease
        # A loss is signalled at once, by the renewer: the block's thread runs user code.
        term = Term(
            self.backend,
            lease,
            self.timing,
            caller,
            sender=self,
            label=self._label,
            on_lost=Term.signal_lost,
            # A lock may be taken thousands of times a second: its routine lines are
            # DEBUG (the history keeps every term); a loss is a warning all the same.
            log_level=logging.DEBUG,
        )
        term.begin()
        _set_hold(self.name, _Hold(term, owner, outer))
        term.signal_elected()
        return lease

    def _acquiring(self, caller: Caller) -> Steps[Lease]:
        """Acquire, waiting while blocking: woken by the store when the lease is released
        (PostgreSQL, Redis), else trying every ``retry_interval``. Given up (a timeout, a
        cancelled task), it leaves nothing held."""
        give_up = None if self.timeout is None else clock() + self.timeout
        watch: Watch | None = None
        self._busy = False
        try:
            while True:
                yield REARM  # a release from now on wakes the wait below
                lease, pause = yield from self._attempting(caller, give_up)
                if lease is not None:
                    return lease
                if watch is None:
                    watch = yield Listen(self._watch)
                yield Pause(pause)
        finally:
            if watch is not None:
                watch.close()

    def _watch(self, wake: Callable[[], None]) -> Watch:
        try:
            watch = self.backend.watch(self.name, wake)
        except Exception as exc:  # then it polls
            logger.debug("cannot watch %r for releases, polling: %s", self.name, exc)
            watch = None
        return watch if watch is not None else _Polling()

    def _attempting(
        self, caller: Caller, give_up: float | None
    ) -> Steps[tuple[Lease | None, float]]:
        """One acquisition: the lease, or (None, how long to wait before the next); raises
        ``LeaseHeld`` when not blocking or out of time."""
        bound = self._bound(give_up)
        try:
            granted = yield from attempting(
                self.backend, caller, self.name, self.identity, self.timing, bound, self._label
            )
        except TimeoutError:
            raise self._unanswered(bound) from None
        except StoreBusy as exc:  # another's write: contention, as if the lease were held
            own = self.backend.own_transaction()  # this thread's: waiting would not end it
            if own:
                raise StoreBusy(f"{exc}{own}") from exc
            if not self._may_wait(give_up):
                raise
            if not self._busy:
                logger.warning("%s: the store is busy, trying again: %s", self._label, exc)
            self._busy = True
            return None, self._pause(give_up)
        return self._outcome(*granted, give_up)

    def _bound(self, give_up: float | None) -> float:
        timing = self.timing
        bound = call_bound(timing)
        if give_up is not None:
            bound = min(bound, max(timing.call_timeout, give_up - clock()))
        return bound

    def _unanswered(self, bound: float) -> BackendUnavailable:
        return BackendUnavailable(
            f"lease {self.name!r}: the store did not answer within {bound:.2f}s "
            "(a frozen server or connection); should the attempt succeed later, "
            "the lease is released at once"
        )

    def _outcome(
        self, acquired: Lease | None, current: Lease | None, give_up: float | None
    ) -> tuple[Lease | None, float]:
        if acquired is not None:
            return acquired, 0.0
        if not self._may_wait(give_up):
            holder = (
                f" by {current.holder} (token {current.token})"
                if current
                else " (no holder, yet refused: it was force-released and the term of "
                "its holder is not over, or the store may have lost its leases and the "
                "lock-delay is not over — no one may take it until every earlier holder "
                "has stopped believing it leads; or it was released just now)"
            )
            raise LeaseHeld(f"lease {self.name!r} is held{holder}")
        return None, self._pause(give_up)

    def _may_wait(self, give_up: float | None) -> bool:
        return self.blocking and (give_up is None or clock() < give_up)

    def _pause(self, give_up: float | None) -> float:
        """How long to wait before the next attempt: about ``retry_interval`` (waiters not
        in lockstep), no longer than the time left."""
        pause = jitter.shorter(self.timing.retry_interval)
        if give_up is not None:
            pause = min(pause, give_up - clock())
        return max(0.0, pause)

    @property
    def _label(self) -> str:
        return f"lock {self.name!r}"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._leave()
        if hold is not None:
            hold.term.end()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._leave()
        if hold is not None:
            # Shielded: a task cancelled while it leaves still releases the lease.
            await asyncio.shield(hold.term.aend())

    def _leave(self) -> _Hold | None:
        """Leave the block: the hold whose term now ends, or None (an inner block, or a
        hold inherited across a fork)."""
        hold = _holds.get().get(self.name)
        owner = _owner()
        if hold is not None and hold.owner[0] != owner[0]:
            # Inherited across a fork: the parent's hold. Forget it; never release it.
            _set_hold(self.name, hold.shadowed)
            return None
        if hold is None or not hold.owned_by(owner):
            raise RuntimeError(
                f"lock {self.name!r} exited by a thread or task that did not enter it"
            )
        if hold.depth > 1:
            hold.depth -= 1
            return None
        _set_hold(self.name, hold.shadowed)
        return hold


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


def alock(
    name: str,
    *,
    ttl: float | None = None,
    blocking: bool = True,
    timeout: float | None = None,
    identity: str | None = None,
    backend: Backend | str | None = None,
) -> Lock:
    """Hold lease ``name`` for an ``async with`` block, renewing it in the background.

    ``async with alock("nightly-report") as lease:`` — :func:`lock` for coroutines, with
    the same arguments and rules. Waiting for the lease and every store call are awaited:
    the event loop runs other tasks meanwhile. Reentrant per asyncio task: a nested
    ``alock()`` of a name this task holds succeeds at once; any other task, a task started
    inside the block included, waits its turn, so two tasks never both hold the lease.

    The renewals, and the local deadline, are kept by the process's session thread, not by
    the event loop: they go on while the loop is blocked by synchronous code, and
    ``lease.lost`` is set at the deadline even then. ``await lease.wait_lost()`` waits for
    it; ``await lease.afenced(fn)`` writes through ``fenced()``. Cancelling a task that waits
    in ``alock()`` leaves nothing held; a task cancelled inside the block still releases
    the lease on the way out.
    """
    return Lock(
        name, ttl=ttl, blocking=blocking, timeout=timeout, identity=identity, backend=backend
    )
