"""The campaign loop. It knows nothing about storage: each term it wins is a
:class:`~django_leader.term.Term`, and it talks to the store through the Backend contract."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import Future
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any, cast

from . import aio, hooks, jitter, signals
from .backends.base import Backend, Watch
from .caller import Caller
from .conf import (
    default_identity,
    get_settings,
    resolve_timing,
    validate_identity,
    validate_name,
)
from .election import (
    Candidate,
    Mode,
    may_try,
    next_in_line,
    place,
    preempted_by,
    validate_mode,
    validate_priority,
)
from .exceptions import BackendUnavailable, NotSupportedError
from .lease import Lease, LossReason, _use_lease, clock
from .session import session as session_of
from .term import Term, attempt, call_bound, log_extra, resolve_backend

logger = logging.getLogger("django_leader")

Work = Callable[[Lease], Any]
Callback = Callable[[Lease], Any]

#: How often a leader waiting for its work to return after losing the lease says so.
WORK_WAIT_WARNING = 10.0

#: Seconds by which a vanished candidate's heartbeat may still have been running (by this
#: process's estimate of the store's clock) and be reported as expired rather than left.
EXPIRY_SLACK = 0.5

#: Seconds a follower waits before announcing itself again after an announcement failed.
ANNOUNCE_BACKOFF = 60.0

_running: weakref.WeakSet[Elector] = weakref.WeakSet()


def handover_window(timing: Any) -> float:
    """Seconds a hand-over lets only its target acquire: long enough for the holder's next
    renewal to see the request and release, and for the target to take it; a dead target
    then costs the name no more than that."""
    return timing.ttl + timing.renew_interval


def running_electors(name: str | None = None) -> list[Elector]:
    """The Electors campaigning in this process (for ``name`` only, if given)."""
    return [e for e in list(_running) if name is None or e.name == name]


class Elector:
    """Campaigns for lease ``name``: while elected, ``work(lease)`` runs in a thread.

    ``run(work)`` blocks until :meth:`stop`; ``start(work)`` does the same in a background
    thread. Each election gives a new :class:`~django_leader.Lease` with a greater fencing
    token. When leadership ends (lost, or ``stop()``), ``lease.lost`` is set and the
    elector waits for ``work`` to return before it releases the lease and campaigns again.
    If ``work`` returns while still elected, the elector stays leader; if it raises, the
    elector releases the lease and campaigns again after ``retry_interval``.

    ``watchdog=S``: a work that goes ``S`` seconds without ``lease.heartbeat()`` is deemed
    stuck; the elector steps down at once (``lease.lost`` set, ``on_lost``, ``is_leader``
    False, :attr:`stuck_for` counting) but keeps the lease renewed until the work returns,
    then releases it: a stuck work cannot be interrupted, and the next leader must not run
    beside it (a payload never outlives its lease). Should the renewals fail meanwhile, the
    lease is lost at its deadline as ever, and a late act of the work is ``fenced()``'s to
    refuse.

    From asyncio code, see :class:`~django_leader.AsyncElector`; an Elector started from a
    coroutine also runs a coroutine function ``work`` and coroutine callbacks on that
    loop, and ``await elector.wait_for_leadership()`` / ``await elector.stop()`` there.

    Callbacks ``on_elected(lease)``, ``on_lost(lease)`` (leadership ended, for any reason)
    and ``on_new_leader(lease)`` (a different holder was observed, this one included) can
    be passed as keyword arguments or defined by a subclass; they run in the campaign
    thread and must not block for long.
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        renew_interval: float | None = None,
        retry_interval: float | None = None,
        identity: str | None = None,
        backend: Backend | str | None = None,
        mode: Mode | str | None = None,
        priority: int = 0,
        watchdog: float | None = None,
        on_elected: Callback | None = None,
        on_lost: Callback | None = None,
        on_new_leader: Callback | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.timing = resolve_timing(ttl, renew_interval, retry_interval)
        self.identity = validate_identity(identity) if identity is not None else default_identity()
        self.mode = validate_mode(get_settings().election_mode if mode is None else mode)
        self.priority = validate_priority(priority)
        if watchdog is not None and (
            isinstance(watchdog, bool)
            or not isinstance(watchdog, (int, float))
            or not 0 < watchdog < float("inf")
        ):
            raise ValueError(f"watchdog must be a number of seconds > 0, got {watchdog!r}")
        self.watchdog = None if watchdog is None else float(watchdog)
        self.backend = resolve_backend(backend, self.timing)
        for attr, callback in (
            ("on_elected", on_elected),
            ("on_lost", on_lost),
            ("on_new_leader", on_new_leader),
        ):
            if callback is not None:
                if not callable(callback):
                    raise TypeError(f"{attr} must be callable")
                setattr(self, attr, callback)
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._elected = threading.Event()
        # Coroutines in wait_for_leadership(): woken (from the campaign thread) at each
        # election.
        self._elected_waiters: list[Callable[[], None]] = []
        # The event loop that started this elector, if any: coroutine work and callbacks
        # run there.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release_on_stop = True
        self._running = threading.Lock()
        self._thread: _CampaignThread | None = None
        # The thread in _run() and an Event of that run, set once it has ended for good
        # (the lease released, _running free again), both under _state.
        self._state = threading.Lock()
        self._campaigning: threading.Thread | None = None
        self._ended: threading.Event | None = None
        self._announcing: Future[None] | None = None  # the last announcement, if any
        self._announce_failed = False
        self._worker: threading.Thread | None = None
        self._observed: tuple[str, int] | None = None
        self._work_error: BaseException | None = None
        self._resign_backoff: float | None = None
        self._last_seen: Lease | None = None
        self._announce_due = 0.0
        self._candidate = Candidate.here(self.identity, self.priority)
        self._follow = threading.Event()  # a waiting candidate's wake-up (store, stop())
        self._watch: Watch | None = None
        self._seen: Lease | None = None  # the holder the last attempt saw, if any
        self._seen_sent = 0.0  # clock() when that attempt was sent
        self._place: int | None = None  # this candidate's place in the queue, 0 = next
        self._members: dict[str, Candidate] = {}  # the registry as last read
        self._members_read = 0.0
        self._reading: Future[list[Candidate] | None] | None = None
        self._handover_to = ""  # the candidate this leader is to hand over to
        self._handed_over = False  # the last term ended in a hand-over
        # The candidate (identity, last heartbeat) a priority leader last handed over to.
        self._passed_over: tuple[str, datetime | None] | None = None
        self._lost_at: float | None = None  # clock() when a term ended with its work running

    def __repr__(self) -> str:
        return f"<Elector {self.name!r} as {self.identity!r} ({self.mode})>"

    # -- callbacks (override or pass as keyword arguments) --------------------------------
    def on_elected(self, lease: Lease) -> Any:
        """Called when this elector becomes leader."""

    def on_lost(self, lease: Lease) -> Any:
        """Called when this elector's leadership ends (lost, or stopped)."""

    def on_new_leader(self, lease: Lease) -> Any:
        """Called when a new holder of the lease is observed (this elector included)."""

    # -- state ----------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """True while this elector holds the lease and its local deadline has not passed."""
        lease = self._lease
        return lease is not None and lease.held

    @property
    def lease(self) -> Lease | None:
        """The lease this elector holds now, or None."""
        lease = self._lease
        return lease if lease is not None and lease.held else None

    def leader(self) -> Lease | None:
        """Who holds the lease now, read from the store (a snapshot), or None.

        Bounded like every store call (docs/api.md, "Bounded store calls"):
        ``BackendUnavailable`` if the store does not answer in time."""
        return self._read(self.backend.read, self.name)

    def _read(self, call: Callable[..., Any], *args: Any) -> Any:
        reader = session_of(self.backend)  # the process's caller for this store
        bound = call_bound(self.timing)
        try:
            return reader.call(bound, call, *args)
        except TimeoutError:
            raise BackendUnavailable(
                f"reading {self.name!r}: the store did not answer within {bound:.2f}s"
            ) from None

    def candidates(self) -> list[Candidate] | None:
        """The live candidates of ``name`` from the store's registry, in join order (this
        elector among them while it waits; not while it leads), or None if the store
        keeps no registry. Bounded like :meth:`leader`."""
        return self._read(self.backend.candidates, self.name)

    @property
    def stuck_for(self) -> float | None:
        """Seconds since a term ended (lost, watchdog, stop) while its work has not returned
        yet; None while there is no such work. What the liveness view reads. Meanwhile the
        lease is kept renewed (unless it was lost) and released once the work returns."""
        lost_at = self._lost_at
        return None if lost_at is None else max(0.0, clock() - lost_at)

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this elector leads (True) or ``timeout`` passes (False).

        Called from a coroutine, it returns an awaitable instead, so as not to block the
        event loop: ``await elector.wait_for_leadership(5)``."""
        if aio.running_loop() is not None:
            return cast(
                bool,
                aio.Awaited(
                    lambda: self._await_leadership(timeout), "Elector.wait_for_leadership()"
                ),
            )
        give_up = None if timeout is None else clock() + timeout
        while True:
            remaining = None if give_up is None else give_up - clock()
            if remaining is not None and remaining <= 0:
                return self.is_leader
            if self._elected.wait(remaining) and self.is_leader:
                return True
            if self._elected.is_set():  # elected flag stale for a moment: poll briefly
                time.sleep(0.01)

    async def _await_leadership(self, timeout: float | None) -> bool:
        """:meth:`wait_for_leadership` for a coroutine: woken by the campaign thread."""
        woken, wake = aio.wakeable()
        with self._state:
            self._elected_waiters.append(wake)
        give_up = None if timeout is None else clock() + timeout
        try:
            while True:
                woken.clear()  # an election from now on wakes the wait below
                if self.is_leader:
                    return True
                remaining = None if give_up is None else give_up - clock()
                if remaining is not None and remaining <= 0:
                    return False
                await aio.wait_event(woken, remaining)
        finally:
            with self._state, suppress(ValueError):
                self._elected_waiters.remove(wake)

    # -- running --------------------------------------------------------------------------
    def start(self, work: Work | None = None) -> _CampaignThread:
        """Campaign in a background (daemon) thread; returns the thread.

        Started from a coroutine, the elector belongs to that event loop: a coroutine
        function ``work`` runs there as a task (cancelled when leadership ends), and so do
        coroutine callbacks; ``await elector.start()`` is allowed. See
        :class:`~django_leader.AsyncElector` for an API that is awaitable throughout."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{self!r} is already running")
        self._stop.clear()
        loop = aio.running_loop()
        self._thread = _CampaignThread(
            target=self._run, args=(work, loop), name=f"leader-elector:{self.name}", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning. If leading: set ``lease.lost``, wait for the work to return, then
        release the lease (``release=True``) so a follower takes over at once. Waits up to
        ``timeout`` seconds for the campaign to end (the thread of :meth:`start`, or the
        one in :meth:`run`) — unless called from that thread, the work or a callback, which
        must return first (then it only asks, and returns). After the watchdog fired, the
        same: the lease stays renewed until the stuck work returns, then it is released
        (or, with ``release=False``, left to expire); a ``stop()`` that times out first
        leaves it so.

        From a coroutine it does not wait (that would block the event loop, which may be
        running the work): it asks, and returns an awaitable — ``await elector.stop()``
        waits without blocking the loop.

        From a signal handler, prefer setting a flag that your main thread turns into
        ``stop()``: a handler that interrupts code holding the same lock can deadlock."""
        self._ask_stop(release)
        with self._state:
            campaigning, ended = self._campaigning, self._ended
        thread = self._thread
        if threading.current_thread() in (campaigning, thread, self._worker):
            return  # the campaign ends once this call's caller returns
        if aio.running_loop() is not None:
            # A coroutine: waiting here would block the loop, which may be running the
            # work the campaign waits for. ``await elector.stop()`` waits without blocking.
            return cast(
                None, aio.Awaited(lambda: self._await_stop(release, timeout), "Elector.stop()")
            )
        give_up = None if timeout is None else clock() + timeout
        if ended is not None:
            ended.wait(timeout)
        if thread is not None:  # start()'s thread: until it is gone, so start() may follow
            thread.join(None if give_up is None else max(0.0, give_up - clock()))

    def _ask_stop(self, release: bool) -> None:
        """Tell the campaign to end (and whether to release), without waiting for it."""
        self._release_on_stop = release
        self._stop.set()
        self._wake.set()
        self._follow.set()

    async def _await_stop(self, release: bool, timeout: float | None) -> None:
        """The wait of :meth:`stop` for a coroutine (asked already), in a thread of the
        loop's executor; none from the work itself, which must return first."""
        if asyncio.current_task() in aio.terms_of(self):
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self.stop, release, timeout))

    def resign(self, backoff: float | None = None) -> None:
        """Step down now: set ``lease.lost``, wait for the work to return, release the lease,
        then campaign again after ``backoff`` seconds (default ``retry_interval``). Callable
        from the work itself (e.g. when what it supervises ended)."""
        self._resign_backoff = self.timing.retry_interval if backoff is None else backoff
        self._wake.set()

    def hand_over(self, to: str | None = None) -> None:
        """Step down in favour of candidate ``to`` (default: the next in line): like
        :meth:`resign`, and the store lets only ``to`` take the lease for a while (as with
        ``manage.py leader handover``; a store that cannot gate acquisitions only wakes
        it). A no-op while not leading."""
        lease = self.lease
        if lease is None:
            return
        if to is None:
            first = next_in_line(self.candidates() or [], self.mode, holder=self.identity)
            to = first.identity if first is not None else ""
        if to:
            with suppress(NotSupportedError):
                self._read(
                    functools.partial(self.backend.request_handover, actor=self.identity),
                    self.name,
                    to,
                    handover_window(self.timing),
                )
        self._handover_to = to or "*"
        self._wake.set()

    def run(self, work: Work | None = None) -> None:
        """Campaign until :meth:`stop`; each time elected, run ``work(lease)`` in a thread
        (a coroutine function ``work``: on an event loop of that thread's own)."""
        self._stop.clear()
        self._run(work)

    def _run(self, work: Work | None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not self._running.acquire(blocking=False):
            raise RuntimeError(f"{self!r} is already running")
        self._loop = loop
        # Its store calls run on the process's session for the store, with every other
        # Elector's and lock's: threads and connections do not grow with the electors.
        caller: Caller = session_of(self.backend)
        _running.add(self)
        ended = threading.Event()
        with self._state:
            self._campaigning, self._ended = threading.current_thread(), ended
        try:
            logger.info("%s campaigning for %r (%s)", self.identity, self.name, self.mode)
            self._open_watch()
            while not self._stop.is_set():
                # A queue's candidate is woken only when its turn comes (or a hand-over
                # names it): it tries at once, without reading the queue first.
                called = self._follow.is_set()
                self._follow.clear()  # a wake-up from now on is for the next attempt
                lease = self._campaign(caller, called)
                if lease is None:
                    self._announce(caller)
                    self._follow.wait(self._poll_interval())
                    continue
                self._leave_queue(caller)
                self._lead(lease, work, caller)
                self._leave_queue(caller)
                self._announce_due = 0.0  # a follower again: join the tail of the queue
                backoff, self._resign_backoff = self._resign_backoff, None
                if not self._stop.is_set():
                    self._stop.wait(self.timing.retry_interval if backoff is None else backoff)
                if self._handed_over:
                    # Try once, whatever the queue says, after the one it handed over to
                    # had its chance: should that one be dead (its heartbeat not run out
                    # yet), the name is without a leader for a retry_interval, not until
                    # its candidacy expires. A live one holds the lease by now (or the
                    # store's hand-over gate still keeps others out).
                    self._handed_over = False
                    self._follow.set()
        finally:
            _running.discard(self)
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()
            if self._announcing is not None:
                self._announcing = None
                with suppress(TimeoutError, RuntimeError):
                    caller.call(
                        self.timing.call_timeout,
                        self._quietly,
                        self.backend.withdraw,
                        self.name,
                        self.identity,
                    )
            self._running.release()
            with self._state:
                if self._ended is ended:
                    self._campaigning = self._ended = None
            ended.set()

    def _campaign(self, caller: Caller, called: bool = False) -> Lease | None:
        timing = self.timing
        bound = timing.ttl - timing.safety_margin  # an answer after it could not be used
        self._seen = None  # unless this attempt sees a holder (an error: poll as usual)
        if self.mode is not Mode.RACE and not called and not self._my_turn(caller):
            return None
        self._seen_sent = clock()
        try:
            acquired, current = attempt(
                self.backend, caller, self.name, self.identity, timing, bound, self._label
            )
        except TimeoutError:
            # Left behind with its connection: the next attempt runs on a new one, and
            # should this one succeed after all, it hands the lease back at once rather
            # than hold it, unrenewed, until it expires.
            logger.warning(
                "campaign for %r timed out: the store did not answer within %.2fs",
                self.name,
                bound,
            )
            return None
        except BackendUnavailable as exc:
            logger.warning("campaign for %r failed: %s", self.name, exc)
            return None
        except Exception:  # a bug or a foreign backend's error: log it, campaign on
            logger.exception("campaign for %r failed", self.name)
            return None
        if acquired is not None:
            self._measure_leaderless(acquired)
        self._seen = current
        if current is not None:
            self._observe(current)
        return acquired

    # -- the queue (fifo, priority) and wake-ups ------------------------------------------
    def _my_turn(self, caller: Caller) -> bool:
        """fifo/priority: whether this candidate is first in the queue (or the registry is
        unknown: then every candidate races). When it is not, read who leads instead (for
        ``on_new_leader`` and to know when that lease would run out)."""
        members = self._read_members(caller)
        if members is None:
            return True
        self._place = place(self.identity, members, self.mode)
        if may_try(self.identity, members, self.mode):
            return True
        if self._place is None:
            self._announce_due = 0.0  # not queued (expired, or new): join at once
        self._seen_sent = clock()
        try:
            current = caller.call(call_bound(self.timing), self.backend.read, self.name)
        except Exception as exc:
            logger.debug("reading %r failed: %s", self.name, exc)
            return False
        self._seen = current
        if current is None:
            return False
        self._observe(current)
        # The holder may still be listed (its withdrawal failed): it is not waiting.
        holder = current.holder
        self._place = place(self.identity, [m for m in members if m.identity != holder], self.mode)
        return may_try(self.identity, members, self.mode, holder=holder)

    def _read_members(self, caller: Caller) -> list[Candidate] | None:
        """The registry, read now (None if unknown), with the membership signals."""
        try:
            members = caller.call(call_bound(self.timing), self.backend.candidates, self.name)
        except Exception as exc:
            logger.debug("reading the candidates of %r failed: %s", self.name, exc)
            return None
        if members is not None:
            self._membership(members)
        return members

    def _membership(self, members: list[Candidate]) -> None:
        """Send ``candidate_joined`` / ``candidate_left`` / ``candidate_expired`` for what
        changed since the registry was last read (best effort: a candidate that came and
        went between two reads is not seen)."""
        now = clock()
        known, self._members = self._members, {c.identity: c for c in members}
        read_before, self._members_read = self._members_read, now
        if not read_before:
            return  # the first read: nothing to compare with
        for identity, candidate in self._members.items():
            if identity not in known:
                signals.send(signals.candidate_joined, self, name=self.name, candidate=candidate)
        store_now = self._store_now()
        for identity, candidate in known.items():
            if identity in self._members:
                continue
            # Gone with its heartbeat run out (by the store's clock, as estimated here):
            # expired; gone before that: it withdrew.
            expired = (
                store_now is not None
                and candidate.expires_at is not None
                and candidate.expires_at <= store_now + timedelta(seconds=EXPIRY_SLACK)
            )
            signal = signals.candidate_expired if expired else signals.candidate_left
            signals.send(signal, self, name=self.name, candidate=candidate)

    def _store_now(self) -> datetime | None:
        """The store's clock now, estimated from the last store time this elector heard
        with the local time it was asked at: its own lease's renewal while leading, else
        the holder's lease its last attempt read. None if it has heard none."""
        lease = self._lease
        if lease is not None and lease.renewed_at is not None and lease.deadline is not None:
            asked = lease.deadline - self.timing.ttl + self.timing.safety_margin
            return lease.renewed_at + timedelta(seconds=clock() - asked)
        seen = self._seen
        if seen is not None and seen.read_at is not None:
            return seen.read_at + timedelta(seconds=clock() - self._seen_sent)
        return None

    def _open_watch(self) -> None:
        try:
            # A race is woken by every release; a queue only when its turn comes.
            identity = None if self.mode is Mode.RACE else self.identity
            self._watch = self.backend.watch(self.name, self._follow.set, identity=identity)
        except Exception as exc:  # no wake-ups: poll
            logger.warning("cannot watch %r for wake-ups, polling: %s", self.name, exc)
            self._watch = None

    def _poll_interval(self) -> float:
        """How long a waiting candidate sleeps unless woken (in a queue, never past its
        next heartbeat): ``retry_interval`` without live wake-ups (and for the first two of
        a fifo/priority queue, so that a dead head is skipped promptly); with them, until
        the lease it last saw would run out (a crashed holder's), at most
        ``max(ttl, retry_interval)``."""
        interval = self._until_wake()
        if self.mode is Mode.RACE:
            return interval
        # A queued candidate wakes for its heartbeat: sleeping past it would drop it from
        # the queue (it would join again at the tail).
        return max(0.0, min(interval, self._announce_due - clock()))

    def _until_wake(self) -> float:
        # Jittered (never longer): candidates that started or were woken together do not
        # poll in lockstep, nor all try at a lease's exact expiry.
        retry = jitter.shorter(self.timing.retry_interval)
        watch = self._watch
        if watch is None or not watch.live:
            return retry
        if self.mode is not Mode.RACE and (self._place is None or self._place <= 1):
            return retry
        cap = max(retry, self.timing.ttl)
        seen = self._seen
        if seen is None or seen.expires_in is None:
            return retry if self.mode is Mode.RACE else cap
        until = self._seen_sent + seen.expires_in + 0.005 - clock()
        # Never sooner than a few milliseconds, nor twice in a row for the same lease: a
        # lease that should have expired by now is tried again after retry_interval.
        if until <= -0.5:
            return retry
        return min(cap, max(0.005, until + jitter.after_expiry(self.timing.retry_interval)))

    def _leave_queue(self, caller: Caller) -> None:
        """Leave the registry (in the background, on the store thread: before any later
        announcement): when elected, and again when the term ends (should the first have
        failed), so that the next announcement joins the tail of the queue."""
        self._place = None
        with suppress(RuntimeError):
            caller.submit(
                self._quietly,
                self.backend.withdraw,
                self.name,
                self.identity,
                bound=self.timing.call_timeout,
            )

    def _wake_next(self, caller: Caller, to: str) -> None:
        """After a release: wake whoever may take the lease now. The release itself woke
        the candidates of a race; in a fifo or priority queue only the next in line is
        woken (``to``, or the first of the queue)."""
        if self.mode is Mode.RACE and not to:
            return
        bound = call_bound(self.timing)
        try:
            if not to:
                members = caller.call(bound, self.backend.candidates, self.name)
                first = next_in_line(members or [], self.mode, holder=self.identity)
                if first is None:
                    return
                to = first.identity
            caller.call(bound, self.backend.wake, self.name, to)
        except Exception as exc:  # they poll
            logger.debug("waking the next candidate of %r failed: %s", self.name, exc)

    @property
    def _label(self) -> str:
        return f"{self.identity} (elector of {self.name!r})"

    def _announce(self, caller: Caller) -> None:
        """Tell the store, now and then, that this elector campaigns (for ``leader status``;
        best effort, never waited for, never part of the lease decision).

        It shares the store thread with the campaign: at most one announcement is in
        flight, and after a failure (the store down, the candidates table not migrated)
        the next one waits :data:`ANNOUNCE_BACKOFF` in race mode (a fifo/priority candidate
        tries again at its next heartbeat), so that it never delays a takeover.
        """
        now = clock()
        if now < self._announce_due or (
            self._announcing is not None and not self._announcing.done()
        ):
            return
        ttl = self._candidacy_ttl()
        self._announce_due = now + ttl / 3
        try:
            future = caller.submit(
                self.backend.announce,
                self.name,
                self._candidate,
                ttl,
                bound=self.timing.call_timeout,
            )
        except RuntimeError:  # the caller is closed by now
            return
        self._announcing = future
        future.add_done_callback(self._announce_done)

    def _candidacy_ttl(self) -> float:
        """How long a heartbeat keeps this candidate in the registry: a few missed attempts
        long, so a follower never seems to flap. It beats every third of that."""
        return max(self.timing.ttl, 3 * self.timing.retry_interval)

    def _announce_done(self, future: Future[None]) -> None:
        exc = future.exception()
        if exc is None:
            self._announce_failed = False
            return
        # A race only lists its candidates: a failing registry (not migrated) waits long.
        # A queue needs its place: the next heartbeat tries again (and meanwhile this
        # candidate is not queued, so it waits its turn behind those that are).
        backoff = ANNOUNCE_BACKOFF if self.mode is Mode.RACE else self._candidacy_ttl() / 3
        self._announce_due = clock() + backoff
        log = logger.debug if self._announce_failed else logger.warning
        self._announce_failed = True
        log(
            "could not announce %s as a candidate for %r (leader status will not list it; "
            "retrying in %.0fs): %s",
            self.identity,
            self.name,
            backoff,
            exc,
        )

    def _quietly(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            logger.debug("%s for %r failed: %s", call.__name__, self.name, exc)

    def _measure_leaderless(self, acquired: Lease) -> None:
        """How long the name had no leader before this takeover, by the store's clock: from
        the expiry of the previous holder's lease as last seen, to this acquisition."""
        seen = self._last_seen
        if (
            seen is not None
            and acquired.previous_holder
            and seen.holder == acquired.previous_holder
            and seen.expires_at is not None
            and acquired.acquired_at is not None
        ):
            gap = (acquired.acquired_at - seen.expires_at).total_seconds()
            hooks.notify("leaderless", self.name, max(0.0, gap))

    def _observe(self, lease: Lease) -> None:
        self._last_seen = lease
        key = (lease.holder, lease.token)
        if key != self._observed:
            self._observed = key
            if lease.holder != self.identity:
                logger.info(
                    "%r is led by %s (token %s)",
                    self.name,
                    lease.holder,
                    lease.token,
                    extra=log_extra(lease),
                )
            self._callback(self.on_new_leader, lease)

    def _lead(self, lease: Lease, work: Work | None, caller: Caller) -> None:
        self._work_error = None
        self._resign_backoff = None
        self._handover_to = ""
        self._reading = None
        term = Term(
            self.backend,
            lease,
            self.timing,
            caller,
            sender=self,
            label=self._label,
            on_lost=self._renewer_lost,
            on_renewed=self._renewed,
        )
        self._lease = lease
        lease._beat = clock()  # the watchdog counts from the election
        term.begin()
        self._elected.set()
        with self._state:
            waiters = list(self._elected_waiters)
        for wake in waiters:
            wake()
        self._callback(self.on_elected, lease)
        term.signal_elected()

        worker = None
        if work is not None:
            worker = self._worker = threading.Thread(
                target=self._run_work,
                args=(work, lease),
                name=f"leader-work:{self.name}",
                daemon=True,
            )
            worker.start()

        stuck = self._hold(lease, caller)

        self._elected.clear()
        to = ""
        if self._stop.is_set():
            stepped_down = term.step_down(LossReason.STOPPED)
        elif self._work_error is not None:
            stepped_down = term.step_down(LossReason.WORK_RAISED, repr(self._work_error))
        elif stuck:
            stepped_down = term.step_down(
                LossReason.WATCHDOG, f"no lease.heartbeat() for {self.watchdog:g}s"
            )
        elif self._handover_to:
            self._handed_over = True
            to = "" if self._handover_to == "*" else self._handover_to
            stepped_down = term.step_down(LossReason.HANDED_OVER, f"to {to or 'the next in line'}")
        else:
            stepped_down = term.step_down(LossReason.RESIGNED)
        if not stepped_down:  # lost, not given up: say so now
            term.signal_lost()
        self._callback(self.on_lost, lease)

        def end_term() -> None:
            self._lease = None
            # Without a release (stop(release=False), or a failed one) listeners hear of
            # the end all the same: the term sends leader_lost then.
            if term.end(release=not (self._stop.is_set() and not self._release_on_stop)):
                self._wake_next(caller, to)

        if worker is not None:
            self._lost_at = clock()  # the term is over; its work is not (yet)
            # Stepped down (stop(), resign(), the watchdog…): the renewer keeps the lease
            # alive in the store, so that no other candidate leads while this work may
            # still act — a stuck work cannot be interrupted, only waited for (rule 8).
            # Meanwhile is_leader is False and the liveness view reports a work that does
            # not return (stuck_for), so that a probe can restart the process. After a
            # real loss nobody can keep the lease: waiting is all there is to do, and a
            # late act is fenced()'s to refuse.
            while worker.is_alive():
                worker.join(WORK_WAIT_WARNING)
                if worker.is_alive():
                    logger.warning(
                        "work for %r ignores lease.lost and is still running",
                        self.name,
                        extra=log_extra(lease),
                    )
        self._lost_at = None
        end_term()  # the work returned: release, so that a follower takes over at once

    def _hold(self, lease: Lease, caller: Caller) -> bool:
        """Lead until the term must end; True if the watchdog ended it (the caller then
        steps down, keeping the lease renewed until the work returns).

        Every ``renew_interval`` the registry is read: the membership signals, and in
        ``priority`` mode a higher-priority candidate to hand over to."""
        next_read = clock()
        while True:
            self._wake.clear()
            if (
                not lease.held  # lost, or its deadline passed (whoever noticed first)
                or self._stop.is_set()
                or self._work_error is not None
                or self._resign_backoff is not None
                or self._handover_to
            ):
                return False
            now = clock()
            wake_at = lease.deadline or now
            if self.watchdog is not None:
                beat = lease._beat or now
                if now - beat >= self.watchdog:
                    logger.warning(
                        "work for %r did not call lease.heartbeat() for %.1fs (watchdog "
                        "%gs): stepping down; the lease is kept renewed until the work "
                        "returns, then released",
                        self.name,
                        now - beat,
                        self.watchdog,
                        extra=log_extra(lease),
                    )
                    return True
                wake_at = min(wake_at, beat + self.watchdog)
            self._registry_done()
            if self._handover_to:
                continue  # a higher priority joined: end the term (checked above)
            if now >= next_read:
                next_read = now + self.timing.renew_interval
                self._read_registry(caller)
            wake_at = min(wake_at, next_read)
            # Woken by the renewer, stop(), resign(), hand_over(), the registry read or the
            # work; and at the deadline at the latest, should the renewer not say so.
            self._wake.wait(max(0.0, wake_at - clock()))

    def _read_registry(self, caller: Caller) -> None:
        """Read the registry in the background (at most one read in flight)."""
        if self._reading is not None and not self._reading.done():
            return
        try:
            future = caller.submit(
                self.backend.candidates, self.name, bound=self.timing.call_timeout
            )
        except RuntimeError:
            return
        self._reading = future
        future.add_done_callback(self._registry_read)

    def _registry_read(self, future: Future[list[Candidate] | None]) -> None:
        # On the store thread, which renews the lease too: only hand the result over.
        self._wake.set()

    def _registry_done(self) -> None:
        """In the campaign thread: the registry read in the background, if it came."""
        future = self._reading
        if future is None or not future.done():
            return
        self._reading = None
        try:
            members = future.result()
        except Exception as exc:
            logger.debug("reading the candidates of %r failed: %s", self.name, exc)
            return
        if members is None:
            return
        self._membership(members)
        if self.mode is Mode.PRIORITY and self.is_leader:
            first = preempted_by(self.priority, members, holder=self.identity)
            if first is not None and (first.identity, first.seen_at) == self._passed_over:
                # Handed over to it once already, and it did not take the lease: it has not
                # beaten since (dead, most likely). Wait for a sign of life or its expiry.
                first = None
            if first is not None and not self._handover_to:
                self._passed_over = (first.identity, first.seen_at)
                logger.info(
                    "%s hands %r over to %s (priority %d > %d)",
                    self.identity,
                    self.name,
                    first.identity,
                    first.priority,
                    self.priority,
                )
                self._handover_to = first.identity
                self._wake.set()

    def _renewed(self, lease: Lease) -> None:
        """After each renewal: has an operator asked for a hand-over (``leader handover``)?"""
        to = lease.handover_to
        if to and to != self.identity and not self._handover_to:
            logger.info("%s hands %r over to %s, as asked", self.identity, self.name, to)
            self._handover_to = to
            self._wake.set()

    def _renewer_lost(self, term: Term) -> None:
        self._wake.set()

    def _run_work(self, work: Work, lease: Lease) -> None:
        try:
            with _use_lease(lease):
                outcome = work(lease)
                if inspect.isawaitable(outcome):  # a coroutine function's
                    aio.run_term(outcome, lease, self._loop, self, repr(self))
        except BaseException as exc:  # reported, then leadership is handed on
            logger.exception("work for %r raised", self.name, extra=log_extra(lease))
            self._work_error = exc
            self._wake.set()

    def _callback(self, callback: Callback, lease: Lease) -> None:
        try:
            outcome = callback(lease)
            if inspect.isawaitable(outcome):  # a coroutine function's
                # Bounded by the TTL, as AsyncElector's: a hung coroutine callback must not
                # stop the campaign thread (no loop) nor stay pending for ever (a loop).
                aio.call_back(outcome, self._loop, repr(self), timeout=self.timing.ttl)
        except Exception:
            logger.exception("callback %r for %r raised", callback, self.name)


class _CampaignThread(threading.Thread):
    """The thread of :meth:`Elector.start`; ``await elector.start()`` is allowed (it has
    started already)."""

    def __repr__(self) -> str:  # a Thread, as before it could be awaited
        return super().__repr__().replace(type(self).__name__, "Thread", 1)

    def __await__(self) -> Generator[Any, None, _CampaignThread]:
        return self
        yield  # a generator: awaiting it returns at once
