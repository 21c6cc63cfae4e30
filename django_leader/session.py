"""Sessions: one renewal loop per process and store for every lease the process holds.

etcd's ``concurrency.Session``, ZooKeeper's session and Consul's session keep many keys
alive with one heartbeat. A :class:`Session` does the same for leases: every renewer of a
process on one backend (``lock()``, :class:`~django_leader.Elector`, ``singleton_task``)
registers with it, and one thread renews all those that are due together, in one
:meth:`~django_leader.backends.base.Backend.renew_many` call per ttl (one round trip where
the store can batch). Each lease keeps its own local deadline, token and loss: the loop
marks a lease lost when *its* renewal is refused or *its* deadline passes (even while a
batch is in flight); one lease refused, or whose row its holder's ``fenced()`` locks (the
others are answered; it is tried again alone, ``RenewedInPart``), costs no other its own.

Two threads and one store connection, whatever the number of leases: ``leader-session``,
the loop (batches, deadlines, results), and ``leader-io:session#<n>``, a ``StoreCaller``
worker (one connection per thread) for the batches, the holders' other calls (acquire,
release, an Elector's campaign, history; in the holder's own thread where the driver
bounds them, ``Backend.driver_bound``) and the reports (``on_lost``, ``on_renewed``).
While holders wait on calls at once, up to three more callers run them (``callers.py``).

A batch goes ahead of every queued call. Not started within its leases' call timeout, or
run past its bound, the worker is left to the call ahead with its connection and the next
calls go to a new thread (docs/safety.md, "Bounded store calls"). A session idle for
:data:`IDLE_TIMEOUT` seconds (no lease, no call) ends its threads, closes its connection
and leaves the registry; a later use goes to the backend's registered session."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from . import hooks, jitter
from .backends.base import Backend
from .backends.partial import RenewedInPart
from .caller import StoreCaller, direct_call
from .callers import CallerPool
from .exceptions import BackendUnavailable
from .lease import LossReason, clock
from .renewal_batch import Batch, Renewer

logger = logging.getLogger("django_leader")

T = TypeVar("T")

#: Seconds a session without leases and calls keeps its threads and connections.
IDLE_TIMEOUT = 30.0


class Session:
    """Renews every lease this process holds on ``backend``, and runs its holders' calls.

    Get one with :func:`session`; a renewer joins with :meth:`add` and leaves with
    :meth:`remove`. :meth:`call` and :meth:`submit` are those of a
    ``django_leader.caller.StoreCaller`` shared by every holder.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._renewers: set[Renewer] = set()
        self._batches: list[Batch] = []  # in flight
        self._done: list[Batch] = []  # answered, not applied yet
        self._thread: threading.Thread | None = None
        self._pool: CallerPool | None = None
        self._users = 0  # calls being waited for
        self._last_use = clock()
        self._wake_at: float | None = None  # when the loop means to wake, if it waits

    def __repr__(self) -> str:
        return f"<Session {self.backend!r}: {len(self._renewers)} leases>"

    # -- the holders' calls ---------------------------------------------------------------
    def _callers(self) -> CallerPool:
        """The callers, started on demand (call with ``_cond`` held)."""
        if self._pool is None:
            self._pool = CallerPool(self.backend, "session")
        self._last_use = clock()
        self._start()
        return self._pool

    def _caller(self) -> StoreCaller:
        """The first caller: batches, reports, submitted calls (``_cond`` held)."""
        return self._callers().first

    def submit(
        self,
        fn: Callable[..., T],
        *args: Any,
        bound: float | None = None,
        on_late: Callable[[T], None] | None = None,
        urgent: bool = False,
    ) -> Future[T]:
        """``StoreCaller.submit`` on the session's caller."""
        with _registry_lock:
            live = self._live()
            with live._cond:
                return live._caller().submit(fn, *args, bound=bound, on_late=on_late, urgent=urgent)

    def call(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T:
        """``StoreCaller.call`` on a caller of the session's (``callers.py``); in this
        thread, with no hand-off, if the driver itself ends the call within ``timeout``
        (``backend.driver_bound``)."""
        driver_bound = self.backend.driver_bound
        if driver_bound is not None and driver_bound <= timeout:
            return direct_call(timeout, fn, args, on_late)
        with self._waiting() as caller:
            return caller.call(timeout, fn, *args, on_late=on_late)

    async def acall(
        self,
        timeout: float,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
    ) -> T:
        """``StoreCaller.acall`` on the session's caller (for coroutines)."""
        with self._waiting() as caller:
            return await caller.acall(timeout, fn, *args, on_late=on_late)

    @contextmanager
    def _waiting(self) -> Iterator[StoreCaller]:
        """A caller (``CallerPool.take``), counted as in use while somebody waits for a
        call on it (an idle session is one nobody waits on)."""
        with _registry_lock:
            live = self._live()
            with live._cond:
                pool = live._callers()
                caller = pool.take()
                live._users += 1
        try:
            yield caller
        finally:
            with live._cond:
                pool.give(caller)
                live._users -= 1
                live._last_use = clock()
                shrink = pool.next_shrink()
                waking = live._wake_at
                if shrink is not None and waking is not None and shrink < waking:
                    live._cond.notify_all()  # the loop ends unused callers in time

    def _live(self) -> Session:
        """This session while registered, else the registered one (``_registry_lock``
        held): one that ended idle or was closed is never started again, out of reach
        of :func:`close_all` (an Elector keeps its session across long waits)."""
        if _registry.get(id(self.backend)) is self and self.pid == os.getpid():
            return self
        return _registered(self.backend)

    # -- renewers -------------------------------------------------------------------------
    @property
    def leases(self) -> int:
        """How many leases the session renews now."""
        return len(self._renewers)

    def add(self, renewer: Renewer) -> Session:
        """Renew ``renewer``'s lease from now on, first at its ``next_renew``; the session
        that does (see ``_live()``)."""
        with _registry_lock:
            live = self._live()
            with live._cond:
                live._renewers.add(renewer)
                live._last_use = clock()
                live._start()
                wake = live._wake_at
                if wake is None or min(renewer.next_renew, renewer.deadline) < wake:
                    live._cond.notify_all()
        return live

    def remove(self, renewer: Renewer) -> None:
        """Stop renewing ``renewer``'s lease (a batch in flight is not waited for: its
        answer for this lease is ignored). Returns at once."""
        with self._cond:
            self._renewers.discard(renewer)
            self._last_use = clock()

    # -- the loop -------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the loop if it is not running (call with ``_cond`` held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="leader-session", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception:  # a bug: never die silently, and let the leases go
            logger.exception("the renewal session of %r failed", self.backend)
            with self._cond:
                renewers = list(self._renewers)
                self._renewers.clear()
                self._thread = None
            for renewer in renewers:
                renewer._lost_in_session(LossReason.RENEWER_FAILED, "the session loop failed")

    def _step(self) -> bool:
        """One turn of the loop: apply answers, enforce deadlines, send what is due, then
        wait until something is due. False when the session ends (idle or closed)."""
        with _registry_lock, self._cond:
            if self._idle():
                if _registry.get(id(self.backend)) is self:
                    del _registry[id(self.backend)]
                self._thread = None
                self._stop_callers()
                return False
            done, self._done = self._done, []
            now = clock()
            lost, due = self._scan(now)
        for batch in done:
            self._apply(batch)
        for renewer, cause in lost:
            renewer._lost_in_session(cause)
        with self._cond:
            for ttl, renewers in due.items():
                self._send(renewers, ttl, now)
            self._unstick(clock())
            if self._pool is not None:
                self._pool.shrink(clock())
            wake = self._next_wake(clock())
            if not self._done:
                self._wake_at = wake
                self._cond.wait(max(0.0, wake - clock()))
                self._wake_at = None
        return True

    def _idle(self) -> bool:
        return (
            not self._renewers
            and not self._batches
            and not self._done
            and self._users == 0
            and clock() - self._last_use >= IDLE_TIMEOUT
        )

    def _scan(
        self, now: float
    ) -> tuple[list[tuple[Renewer, LossReason]], dict[float, list[Renewer]]]:
        """The renewers whose deadline passed (removed), and those to renew now, by ttl: the
        due ones and, with them, those due within half their renew interval (renewed a
        little early, they join the same batch from then on)."""
        lost: list[tuple[Renewer, LossReason]] = []
        due: dict[float, list[Renewer]] = {}
        for renewer in list(self._renewers):
            if now >= renewer.deadline:
                self._renewers.discard(renewer)
                lost.append(
                    (renewer, LossReason.IN_FLIGHT if renewer.in_flight else LossReason.DEADLINE)
                )
            elif not renewer.in_flight and renewer.next_renew <= now:
                due.setdefault(renewer.timing.ttl, [])
        for renewer in self._renewers:
            if (
                renewer.timing.ttl in due
                and not renewer.in_flight
                and renewer.next_renew <= now + renewer.timing.renew_interval / 2
            ):
                due[renewer.timing.ttl].append(renewer)
        lost.sort(key=lambda loss: loss[0].deadline)  # reported in the order they ran out
        return lost, due

    def _send(self, renewers: list[Renewer], ttl: float, now: float) -> None:
        """Send one batch, ahead of every queued call (``_cond`` held)."""
        batch = Batch(renewers, now)
        for renewer in renewers:
            renewer.in_flight = True
        future = self._caller().submit(
            self.backend.renew_many,
            [renewer.lease for renewer in renewers],
            ttl,
            bound=max(0.0, batch.bound - now),
            urgent=True,
        )
        batch.future = future
        self._batches.append(batch)
        future.add_done_callback(lambda _: self._answered(batch))

    def _answered(self, batch: Batch) -> None:
        with self._cond:
            if batch in self._batches:
                self._batches.remove(batch)
            self._done.append(batch)
            self._cond.notify_all()

    def _unstick(self, now: float) -> None:
        """Leave a batch's worker to its call if the batch outlived its bound there, or
        waited past its patience behind another call: the next calls go to a new thread
        and connection (``_cond`` held). A worker already replaced is not replaced again."""
        if self._pool is None:
            return
        for batch in self._batches:
            if batch.hung(now):
                batch.left = True
            elif not batch.waiting(now):
                continue
            assert batch.future is not None
            self._pool.first.leave(batch.future)

    def _next_wake(self, now: float) -> float:
        """When the loop must wake next: a renewal due, a deadline, a hung batch, or the
        end of idleness (``_cond`` held)."""
        times = [
            renewer.deadline if renewer.in_flight else min(renewer.next_renew, renewer.deadline)
            for renewer in self._renewers
        ]
        times.extend(batch.bound for batch in self._batches if batch.bound > now)
        times.extend(
            batch.patience
            for batch in self._batches
            if batch.patience > now and batch.future is not None and not batch.future.running()
        )
        shrink = self._pool.next_shrink() if self._pool is not None else None
        if shrink is not None:
            times.append(shrink)
        if not times:
            return self._last_use + IDLE_TIMEOUT
        return min(times)

    def _apply(self, batch: Batch) -> None:
        """Take a batch's answers: each lease renewed, refused or answered too late."""
        assert batch.future is not None
        with self._cond:
            renewers = [r for r in batch.renewers if r in self._renewers]
            for renewer in batch.renewers:
                renewer.in_flight = False
        took = clock() - batch.sent
        part: RenewedInPart | None = None
        try:
            try:
                results = batch.future.result()
            except RenewedInPart as exc:  # rows locked (a fenced()): the others' answers stand
                results, part = exc.results, exc
            if len(results) != len(batch.renewers):
                raise RuntimeError(
                    f"renew_many returned {len(results)} results for {len(batch.renewers)} leases"
                )
        except BackendUnavailable as exc:
            self._retry(renewers, exc)
            return
        except Exception as exc:  # a backend's bug: these leases cannot be renewed
            logger.error("renewing %d leases failed: %r", len(renewers), exc, exc_info=exc)
            self._drop(renewers, LossReason.RENEWER_FAILED, repr(exc))
            return
        waiting = {id(batch.renewers[i]) for i in part.pending} if part else set()
        if part is not None:
            self._retry([r for r in renewers if id(r) in waiting], part)
        answers = dict(zip(map(id, batch.renewers), results, strict=True))
        refused: list[Renewer] = []
        late: list[Renewer] = []
        for renewer in renewers:
            renewed = answers[id(renewer)]
            if id(renewer) in waiting:
                continue
            if renewed is None:
                hooks.notify("renew_refused", renewer.lease.name)
                refused.append(renewer)
            elif renewer.renewed(renewed, batch.sent, took):
                continue
            else:
                late.append(renewer)
        self._drop(refused, LossReason.REFUSED)
        self._drop(late, LossReason.ANSWERED_LATE)

    def _retry(self, renewers: list[Renewer], exc: BackendUnavailable) -> None:
        """Try ``renewers`` again every retry interval (jittered), more often as the deadline
        nears (``RenewedInPart``: their row was locked, by a ``fenced()``: no failure)."""
        now = clock()
        locked = isinstance(exc, RenewedInPart)
        for renewer in renewers:
            if not locked:
                hooks.notify("renew_failed", renewer.lease.name)
            retry = jitter.shorter(renewer.timing.retry_interval)
            renewer.next_renew = now + min(retry, max(0.05, (renewer.deadline - now) / 2))
        if renewers:
            logger.log(
                logging.INFO if locked else logging.WARNING,
                "renewing %d lease(s) (%s) failed, retrying: %s",
                len(renewers),
                ", ".join(repr(r.lease.name) for r in renewers[:3])
                + (", …" if len(renewers) > 3 else ""),
                exc,
            )

    def _drop(self, renewers: list[Renewer], cause: LossReason, detail: str = "") -> None:
        if not renewers:
            return
        with self._cond:
            for renewer in renewers:
                self._renewers.discard(renewer)
        for renewer in renewers:
            renewer._lost_in_session(cause, detail)

    # -- end ------------------------------------------------------------------------------
    def _stop_callers(self) -> None:
        """Close the caller: its thread ends, closing its connection (``_cond`` held).
        Returns at once, even while a call hangs."""
        if self._pool is not None:
            self._pool.close()
        self._pool = None

    def close(self) -> None:
        """End the session now: stop renewing (its leases run out at their deadlines),
        end its threads and close its connections. Returns at once. A later use starts
        them again."""
        with self._cond:
            self._renewers.clear()
            self._last_use = float("-inf")
            if self._thread is None:
                self._stop_callers()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the loop to end (after :meth:`close`)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True


_registry_lock = threading.Lock()
#: id(backend) -> its session in this process, while the session is in use (a session
#: holds its backend, so the id is not reused meanwhile); an idle session leaves.
_registry: dict[int, Session] = {}


def session(backend: Backend) -> Session:
    """The session of ``backend`` in this process (a new one after a fork, or after the
    last one ended idle)."""
    with _registry_lock:
        return _registered(backend)


def _registered(backend: Backend) -> Session:
    """:func:`session`, with ``_registry_lock`` held."""
    found = _registry.get(id(backend))
    if found is None or found.pid != os.getpid():
        found = _registry[id(backend)] = Session(backend)
    with found._cond:
        found._last_use = clock()  # not idle: it is about to be used
    return found


def _after_fork() -> None:
    """In a forked child: no session of the parent's is usable (their threads are gone),
    and the registry's lock may have been held by a parent thread at the fork."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _registry.clear()


os.register_at_fork(after_in_child=_after_fork)


def close_all(timeout: float | None = None) -> None:
    """Close every session of this process (tests call it between cases, so that no
    thread or connection outlives the backend it was for) and wait up to ``timeout`` for
    their loops to end."""
    with _registry_lock:
        sessions = list(_registry.values())
        _registry.clear()
    for found in sessions:
        found.close()
    for found in sessions:
        found.join(timeout)
