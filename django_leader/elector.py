"""The :class:`Elector`: its lifecycle (start, run, stop, resign, hand_over) and the
campaign loop — wait for a turn, win a term, lead it, campaign again. It knows nothing
about storage: it talks to the store through the Backend contract, and each part of the
campaign is a module of its own that it hands what it needs:

- :mod:`~django_leader.turns` — a waiting candidate's attempts, whether its turn has come,
  how long it sleeps, whom a leader that released wakes;
- :mod:`~django_leader.candidacy` — its heartbeats in the store's registry, and the
  membership signals;
- :mod:`~django_leader.leading` — one term: the work thread, the watchdog, the callbacks,
  pre-emption and hand-overs, over a :class:`~django_leader.term.Term`;
- :mod:`~django_leader.campaigner` — the records they share (who campaigns, what the API
  asks of the campaign, the news of an election)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from . import aio
from .backends.base import Backend
from .caller import Caller
from .campaigner import NEXT_IN_LINE, Campaigner, Control, Elected, validate_watchdog
from .candidacy import Candidacy, Membership
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
    validate_mode,
    validate_priority,
)
from .exceptions import BackendUnavailable, NotSupportedError
from .leading import Callback, CampaignThread, Leadership, Preemption, Work, run_callback
from .lease import Lease, clock
from .session import session as session_of
from .term import call_bound, resolve_backend
from .turns import Follower, handover_window

__all__ = ["Elector", "handover_window", "running_electors"]

logger = logging.getLogger("django_leader")

T = TypeVar("T")


class _Forwarded(Generic[T]):
    """An attribute of one of an elector's parts, read and set through the elector."""

    def __init__(self, part: str, attribute: str) -> None:
        self.part, self.attribute = part, attribute

    def __get__(self, elector: object, owner: type | None = None) -> T:
        return cast(T, getattr(getattr(elector, self.part), self.attribute))

    def __set__(self, elector: object, value: T) -> None:
        setattr(getattr(elector, self.part), self.attribute, value)


_running: weakref.WeakSet[Elector] = weakref.WeakSet()


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
        self.watchdog = validate_watchdog(watchdog)
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
        self._campaigner = Campaigner(
            self.backend,
            self.name,
            self.identity,
            self.mode,
            self.priority,
            self.timing,
            self.watchdog,
        )
        # What stop(), resign() and hand_over() ask of the campaign, and its wake-ups: the
        # term's (_wake) and a waiting candidate's (_follow: the store, stop()).
        self._control = Control()
        self._stop, self._wake, self._follow = (
            self._control.stop,
            self._control.wake,
            self._control.follow,
        )
        self._elected = Elected(lambda: self.is_leader)
        # The event loop that started this elector, if any: coroutine work and callbacks
        # run there.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = threading.Lock()
        self._thread: CampaignThread | None = None
        # The thread in _run() and an Event of that run, set once it has ended for good
        # (the lease released, _running free again), both under _state.
        self._state = threading.Lock()
        self._campaigning: threading.Thread | None = None
        self._ended: threading.Event | None = None
        self._leadership: Leadership | None = None  # the last term, if any
        self._candidacy = Candidacy(
            self.backend,
            self.name,
            Candidate.here(self.identity, self.priority),
            self.mode,
            self.timing,
        )
        self._members = Membership(self, self.name)
        self._preemption = Preemption()
        self._follower = Follower(
            self._campaigner,
            self._candidacy,
            self._members,
            self._follow,
            self._new_leader_seen,
        )
        self._just_handed_over = False  # the last term ended in a hand-over

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
    def _lease(self) -> Lease | None:
        """The lease of the term in progress (until its release), or None."""
        leadership = self._leadership
        return None if leadership is None else leadership.lease

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
        return self._bounded_call(self.backend.read, self.name)

    def _bounded_call(self, call: Callable[..., Any], *args: Any) -> Any:
        session = session_of(self.backend)  # the process's session for this store
        bound = call_bound(self.timing)
        try:
            return session.call(bound, call, *args)
        except TimeoutError:
            raise BackendUnavailable(
                f"reading {self.name!r}: the store did not answer within {bound:.2f}s"
            ) from None

    def candidates(self) -> list[Candidate] | None:
        """The live candidates of ``name`` from the store's registry, in join order (this
        elector among them while it waits; not while it leads), or None if the store
        keeps no registry. Bounded like :meth:`leader`."""
        return self._bounded_call(self.backend.candidates, self.name)

    @property
    def stuck_for(self) -> float | None:
        """Seconds since a term ended (lost, watchdog, stop) while its work has not returned
        yet; None while there is no such work. What the liveness view reads. Meanwhile the
        lease is kept renewed (unless it was lost) and released once the work returns."""
        leadership = self._leadership
        lost_at = None if leadership is None else leadership.lost_at
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
        return self._elected.wait(timeout)

    async def _await_leadership(self, timeout: float | None) -> bool:
        """:meth:`wait_for_leadership` for a coroutine: woken by the campaign thread."""
        return await self._elected.wait_async(timeout)

    # -- running --------------------------------------------------------------------------
    def start(self, work: Work | None = None) -> CampaignThread:
        """Campaign in a background (daemon) thread; returns the thread.

        Started from a coroutine, the elector belongs to that event loop: a coroutine
        function ``work`` runs there as a task (cancelled when leadership ends), and so do
        coroutine callbacks; ``await elector.start()`` is allowed. See
        :class:`~django_leader.AsyncElector` for an API that is awaitable throughout."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{self!r} is already running")
        self._stop.clear()
        loop = aio.running_loop()
        self._thread = CampaignThread(
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
        worker = None if self._leadership is None else self._leadership.worker
        if threading.current_thread() in (campaigning, thread, worker):
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
        self._control.release_on_stop = release
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
        self._control.resign_backoff = self.timing.retry_interval if backoff is None else backoff
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
            first = self._bounded_call(
                functools.partial(self.backend.next_in_line, holder=self.identity),
                self.name,
                self.mode,
            )
            to = first.identity if first is not None else ""
        if to:
            with suppress(NotSupportedError):
                self._bounded_call(
                    functools.partial(self.backend.request_handover, actor=self.identity),
                    self.name,
                    to,
                    handover_window(self.timing),
                )
        self._control.stepping_down_for = to or NEXT_IN_LINE
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
        session: Caller = session_of(self.backend)
        _running.add(self)
        ended = threading.Event()
        with self._state:
            self._campaigning, self._ended = threading.current_thread(), ended
        try:
            logger.info("%s campaigning for %r (%s)", self.identity, self.name, self.mode)
            self._follower.open_watch()
            while not self._stop.is_set():
                # A queue's candidate is woken only when its turn comes (or a hand-over
                # names it): it tries at once, without reading the queue first.
                called = self._follow.is_set()
                self._follow.clear()  # a wake-up from now on is for the next attempt
                lease = self._follower.attempt(session, called)
                if lease is None:
                    self._candidacy.announce(session)
                    self._follow.wait(self._poll_interval())
                    continue
                self._leave_queue(session)
                self._lead(lease, work, session)
                self._leave_queue(session)
                self._candidacy.due = 0.0  # a follower again: join the tail of the queue
                backoff, self._control.resign_backoff = self._control.resign_backoff, None
                if not self._stop.is_set():
                    self._stop.wait(self.timing.retry_interval if backoff is None else backoff)
                if self._just_handed_over:
                    # Try once, whatever the queue says, after the one it handed over to
                    # had its chance: should that one be dead (its heartbeat not run out
                    # yet), the name is without a leader for a retry_interval, not until
                    # its candidacy expires. A live one holds the lease by now (or the
                    # store's hand-over gate still keeps others out).
                    self._just_handed_over = False
                    self._follow.set()
        finally:
            _running.discard(self)
            self._follower.close_watch()
            self._candidacy.withdraw(session)
            self._running.release()
            with self._state:
                if self._ended is ended:
                    self._campaigning = self._ended = None
            ended.set()

    # -- the waiting candidate, as the tests of its poll interval set it --------------
    _watch = _Forwarded[Any]("_follower", "watch")
    _place = _Forwarded[Any]("_follower", "place")
    _seen = _Forwarded[Any]("_follower", "seen")
    _seen_sent = _Forwarded[Any]("_follower", "seen_sent")
    _last_seen = _Forwarded[Any]("_follower", "last_seen")
    _announce_due = _Forwarded[Any]("_candidacy", "due")
    _members_read = _Forwarded[Any]("_members", "read_at")

    def _poll_interval(self) -> float:
        """How long this candidate sleeps while it waits, unless woken."""
        return self._follower.poll_interval()

    def _store_now(self) -> datetime | None:
        return self._follower.store_now(self._lease)

    def _leave_queue(self, session: Caller) -> None:
        """Leave the registry: when elected, and again when the term ends (should the first
        have failed), so that the next announcement joins the tail of the queue."""
        self._follower.place = None
        self._candidacy.leave_queue(session)

    def _new_leader_seen(self, lease: Lease) -> None:
        self._callback(self.on_new_leader, lease)

    def _lead(self, lease: Lease, work: Work | None, session: Caller) -> None:
        """Lead one term with ``lease`` (see :class:`~django_leader.leading.Leadership`)."""
        self._control.resign_backoff = None
        self._control.stepping_down_for = ""
        leadership = Leadership(
            self,
            self._campaigner,
            self._control,
            session,
            self._members,
            self._preemption,
            loop=self._loop,
            elected=self._elected,
            on_elected=self._now_elected,
            on_lost=self.on_lost,
            store_now=self._store_now,
        )
        self._leadership = leadership
        if leadership.run(lease, work):
            self._just_handed_over = True

    def _now_elected(self, lease: Lease) -> None:
        self._elected.set()
        self._callback(self.on_elected, lease)

    def _callback(self, callback: Callback, lease: Lease) -> None:
        run_callback(callback, lease, self._loop, repr(self), self.timing.ttl)
