"""One term of an :class:`~django_leader.Elector`, from its election until its lease is
released: the work thread, the watchdog, the callbacks, the registry read while leading
(membership signals; in ``priority`` mode a higher-priority candidate to hand over to) and
the hand-over an operator asked for, seen at a renewal. The lease itself is kept by a
:class:`~django_leader.term.Term`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from . import aio
from .backends.base import Backend
from .caller import Caller
from .campaigner import NEXT_IN_LINE, Campaigner, Control, Elected
from .candidacy import Membership
from .election import Candidate, Mode, preempted_by
from .lease import Lease, LossReason, _use_lease, clock
from .term import Term, log_extra
from .turns import wake_next

logger = logging.getLogger("django_leader")

Work = Callable[[Lease], Any]
Callback = Callable[[Lease], Any]

#: How often a leader waiting for its work to return after losing the lease says so.
WORK_WAIT_WARNING = 10.0


class Preemption:
    """``priority`` mode: whom a leader hands over to when a higher priority is queued,
    remembering the last one across terms (handed over to once and not taken, it is not
    handed over to again until it shows a sign of life)."""

    def __init__(self) -> None:
        self._passed_over: tuple[str, datetime | None] | None = None

    def by(self, campaigner: Campaigner, members: list[Candidate]) -> Candidate | None:
        first = preempted_by(campaigner.priority, members, holder=campaigner.identity)
        if first is None or (first.identity, first.seen_at) == self._passed_over:
            # Handed over to it once already, and it did not take the lease: it has not
            # beaten since (dead, most likely). Wait for a sign of life or its expiry.
            return None
        self._passed_over = (first.identity, first.seen_at)
        return first


def _head(backend: Backend, name: str, holder: str) -> list[Candidate]:
    """The head of ``name``'s priority queue, ``holder`` left out, as a list (no one: [])."""
    first = backend.next_in_line(name, Mode.PRIORITY, holder=holder)
    return [] if first is None else [first]


def run_callback(
    callback: Callback, lease: Lease, loop: asyncio.AbstractEventLoop | None, owner: str, ttl: float
) -> None:
    """Run ``callback(lease)``, a coroutine one on ``loop``; log what it raises."""
    try:
        outcome = callback(lease)
        if inspect.isawaitable(outcome):  # a coroutine function's
            # Bounded by the TTL, as AsyncElector's: a hung coroutine callback must not
            # stop the campaign thread (no loop) nor stay pending for ever (a loop).
            aio.call_back(outcome, loop, owner, timeout=ttl)
    except Exception:
        logger.exception("callback %r for %r raised", callback, lease.name)


class Leadership:
    """One term of ``owner`` (the elector: sender of the signals, owner of the work
    tasks), led by :meth:`run` in the campaign thread."""

    def __init__(
        self,
        owner: object,
        campaigner: Campaigner,
        control: Control,
        session: Caller,
        membership: Membership,
        preemption: Preemption,
        *,
        loop: asyncio.AbstractEventLoop | None,
        elected: Elected,
        on_elected: Callable[[Lease], None],
        on_lost: Callback,
        store_now: Callable[[], datetime | None],
    ) -> None:
        self.owner = owner
        self.campaigner = campaigner
        self.control = control
        self.session = session
        self.membership = membership
        self.preemption = preemption
        self.loop = loop
        self.elected = elected
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.store_now = store_now
        #: The lease while this term lasts (until its release), else None.
        self.lease: Lease | None = None
        self.worker: threading.Thread | None = None
        #: clock() when the term ended with its work running; None once it returned.
        self.lost_at: float | None = None
        self._work_error: BaseException | None = None
        self._reading: Future[list[Candidate] | None] | None = None
        self._reading_all = False  # whether the read in flight is the whole registry

    def run(self, lease: Lease, work: Work | None) -> bool:
        """Lead with ``lease`` until the term must end, then end it; once ``work`` (run in
        a thread meanwhile) has returned, release the lease and wake whoever is next.
        Returns whether the term ended in a hand-over."""
        campaigner, control = self.campaigner, self.control
        term = Term(
            campaigner.backend,
            lease,
            campaigner.timing,
            self.session,
            sender=self.owner,
            label=campaigner.label,
            on_lost=self._renewer_lost,
            on_renewed=self._renewed,
        )
        self.lease = lease
        lease._beat = clock()  # the watchdog counts from the election
        term.begin()
        self.on_elected(lease)
        term.signal_elected()

        worker = None
        if work is not None:
            worker = self.worker = threading.Thread(
                target=self._run_work,
                args=(work, lease),
                name=f"leader-work:{campaigner.name}",
                daemon=True,
            )
            worker.start()

        stuck = self._keep_leading(lease)

        self.elected.clear()
        to = ""
        handed_over = False
        if control.stop.is_set():
            cause, detail = LossReason.STOPPED, ""
        elif self._work_error is not None:
            cause, detail = LossReason.WORK_RAISED, repr(self._work_error)
        elif stuck:
            cause, detail = (
                LossReason.WATCHDOG,
                f"no lease.heartbeat() for {campaigner.watchdog:g}s",
            )
        elif control.stepping_down_for:
            handed_over = True
            to = "" if control.stepping_down_for == NEXT_IN_LINE else control.stepping_down_for
            cause, detail = LossReason.HANDED_OVER, f"to {to or 'the next in line'}"
        else:
            cause, detail = LossReason.RESIGNED, ""
        if worker is not None:
            # The term is over; its work is not (yet). Set before anyone hears of the end,
            # so that stuck_for never reads less than the time since on_lost ran.
            self.lost_at = clock()
        stepped_down = term.step_down(cause, detail)
        if not stepped_down:  # lost, not given up: say so now
            term.signal_lost()
        run_callback(self.on_lost, lease, self.loop, repr(self.owner), campaigner.timing.ttl)

        if worker is not None:
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
                        campaigner.name,
                        extra=log_extra(lease),
                    )
        self.lost_at = None
        # The work returned: release, so that a follower takes over at once.
        self.lease = None
        # Without a release (stop(release=False), or a failed one) listeners hear of the
        # end all the same: the term sends leader_lost then.
        if term.end(release=not (control.stop.is_set() and not control.release_on_stop)):
            wake_next(
                self.session,
                campaigner.backend,
                campaigner.name,
                campaigner.mode,
                campaigner.timing,
                releaser=campaigner.identity,
                to=to,
            )
        return handed_over

    def _keep_leading(self, lease: Lease) -> bool:
        """Lead until the term must end; True if the watchdog ended it (the term then
        steps down, keeping the lease renewed until the work returns).

        Every ``renew_interval`` the registry is read: the membership signals, and in
        ``priority`` mode a higher-priority candidate to hand over to."""
        campaigner, control = self.campaigner, self.control
        watchdog = campaigner.watchdog
        next_read = clock()
        while True:
            control.wake.clear()
            if (
                not lease.held  # lost, or its deadline passed (whoever noticed first)
                or control.stop.is_set()
                or self._work_error is not None
                or control.resign_backoff is not None
                or control.stepping_down_for
            ):
                return False
            now = clock()
            wake_at = lease.deadline or now
            if watchdog is not None:
                beat = lease._beat or now
                if now - beat >= watchdog:
                    logger.warning(
                        "work for %r did not call lease.heartbeat() for %.1fs (watchdog "
                        "%gs): stepping down; the lease is kept renewed until the work "
                        "returns, then released",
                        campaigner.name,
                        now - beat,
                        watchdog,
                        extra=log_extra(lease),
                    )
                    return True
                wake_at = min(wake_at, beat + watchdog)
            self._registry_done()
            if control.stepping_down_for:
                continue  # a higher priority joined: end the term (checked above)
            if now >= next_read:
                next_read = now + campaigner.timing.renew_interval
                self._read_registry()
            wake_at = min(wake_at, next_read)
            # Woken by the renewer, stop(), resign(), hand_over(), the registry read or the
            # work; and at the deadline at the latest, should the renewer not say so.
            control.wake.wait(max(0.0, wake_at - clock()))

    def _read_registry(self) -> None:
        """Read the registry in the background (at most one read in flight): all of it
        while somebody listens to the membership signals, else in ``priority`` mode the
        head of the queue alone (whom to hand over to), else nothing."""
        if self._reading is not None and not self._reading.done():
            return
        campaigner = self.campaigner
        read: Callable[[], list[Candidate] | None]
        self._reading_all = self.membership.heard()
        if self._reading_all:
            read = functools.partial(campaigner.backend.candidates, campaigner.name)
        elif campaigner.mode is Mode.PRIORITY:
            read = functools.partial(
                _head, campaigner.backend, campaigner.name, campaigner.identity
            )
        else:
            return
        try:
            future = self.session.submit(read, bound=campaigner.timing.call_timeout)
        except RuntimeError:
            return
        self._reading = future
        future.add_done_callback(self._registry_read)

    def _registry_read(self, future: Future[list[Candidate] | None]) -> None:
        # On the store thread, which renews the lease too: only hand the result over.
        self.control.wake.set()

    def _registry_done(self) -> None:
        """In the campaign thread: the registry read in the background, if it came."""
        future = self._reading
        if future is None or not future.done():
            return
        self._reading = None
        campaigner = self.campaigner
        try:
            members = future.result()
        except Exception as exc:
            logger.debug("reading the candidates of %r failed: %s", campaigner.name, exc)
            return
        if members is None:
            return
        if self._reading_all:  # else the head of the queue alone
            self.membership.update(members, self.store_now())
        lease = self.lease
        if campaigner.mode is Mode.PRIORITY and lease is not None and lease.held:
            if self.control.stepping_down_for:
                return
            first = self.preemption.by(campaigner, members)
            if first is not None:
                logger.info(
                    "%s hands %r over to %s (priority %d > %d)",
                    campaigner.identity,
                    campaigner.name,
                    first.identity,
                    first.priority,
                    campaigner.priority,
                )
                self.control.stepping_down_for = first.identity
                self.control.wake.set()

    def _renewed(self, lease: Lease) -> None:
        """After each renewal: has an operator asked for a hand-over (``leader handover``)?"""
        to = lease.handover_to
        identity = self.campaigner.identity
        if to and to != identity and not self.control.stepping_down_for:
            logger.info("%s hands %r over to %s, as asked", identity, self.campaigner.name, to)
            self.control.stepping_down_for = to
            self.control.wake.set()

    def _renewer_lost(self, term: Term) -> None:
        self.control.wake.set()

    def _run_work(self, work: Work, lease: Lease) -> None:
        try:
            with _use_lease(lease):
                outcome = work(lease)
                if inspect.isawaitable(outcome):  # a coroutine function's
                    aio.run_term(outcome, lease, self.loop, self.owner, repr(self.owner))
        except BaseException as exc:  # reported, then leadership is handed on
            logger.exception("work for %r raised", self.campaigner.name, extra=log_extra(lease))
            self._work_error = exc
            self.control.wake.set()


class CampaignThread(threading.Thread):
    """The thread of :meth:`Elector.start`; ``await elector.start()`` is allowed (it has
    started already)."""

    def __repr__(self) -> str:  # a Thread, as before it could be awaited
        return super().__repr__().replace(type(self).__name__, "Thread", 1)

    def __await__(self) -> Generator[Any, None, CampaignThread]:
        return self
        yield  # a generator: awaiting it returns at once
