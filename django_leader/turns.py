"""Whose turn it is: a waiting candidate's attempts (in a fifo/priority queue, only when
its turn comes), how long it sleeps between them, and whom a leader that released wakes.
The queue's order itself is :mod:`django_leader.election`'s (pure logic); this module adds
the store calls and the timing of taking turns."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from . import hooks, jitter
from .backends.base import Backend, Watch
from .caller import Caller
from .campaigner import Campaigner
from .candidacy import Candidacy, Membership
from .conf import Timing
from .election import Candidate, Mode, may_try, place
from .exceptions import BackendUnavailable
from .lease import Lease, clock
from .term import attempt, call_bound, log_extra

T = TypeVar("T")

logger = logging.getLogger("django_leader")


def handover_window(timing: Any) -> float:
    """Seconds a hand-over lets only its target acquire: long enough for the holder's next
    renewal to see the request and release, and for the target to take it; a dead target
    then costs the name no more than that."""
    return timing.ttl + timing.renew_interval


def poll_interval(
    mode: Mode,
    timing: Timing,
    watch: Watch | None,
    place: int | None,
    seen: Lease | None,
    seen_sent: float,
    heartbeat_due: float,
) -> float:
    """How long a waiting candidate sleeps unless woken (in a queue, never past its
    next heartbeat, due at ``heartbeat_due``): ``retry_interval`` without live wake-ups
    (and for the first two of a fifo/priority queue, so that a dead head is skipped
    promptly); with them, until the lease it last saw (``seen``, asked for at
    ``seen_sent``) would run out (a crashed holder's), at most ``max(ttl,
    retry_interval)``."""
    interval = _until_wake(mode, timing, watch, place, seen, seen_sent)
    if mode is Mode.RACE:
        return interval
    # A queued candidate wakes for its heartbeat: sleeping past it would drop it from
    # the queue (it would join again at the tail).
    return max(0.0, min(interval, heartbeat_due - clock()))


def _until_wake(
    mode: Mode,
    timing: Timing,
    watch: Watch | None,
    place: int | None,
    seen: Lease | None,
    seen_sent: float,
) -> float:
    # Jittered (never longer): candidates that started or were woken together do not
    # poll in lockstep, nor all try at a lease's exact expiry.
    retry = jitter.shorter(timing.retry_interval)
    if watch is None or not watch.live:
        return retry
    if mode is not Mode.RACE and (place is None or place <= 1):
        return retry
    cap = max(retry, timing.ttl)
    if seen is None or seen.expires_in is None:
        return retry if mode is Mode.RACE else cap
    until = seen_sent + seen.expires_in + 0.005 - clock()
    # Never sooner than a few milliseconds, nor twice in a row for the same lease: a
    # lease that should have expired by now is tried again after retry_interval.
    if until <= -0.5:
        return retry
    return min(cap, max(0.005, until + jitter.after_expiry(timing.retry_interval)))


def wake_next(
    session: Caller,
    backend: Backend,
    name: str,
    mode: Mode,
    timing: Timing,
    *,
    releaser: str,
    to: str,
) -> None:
    """After ``releaser`` released ``name``: wake whoever may take the lease now. The
    release itself woke the candidates of a race; in a fifo or priority queue only the
    next in line is woken (``to``, or the first of the queue)."""
    if mode is Mode.RACE and not to:
        return
    bound = call_bound(timing)
    try:
        if not to:
            # The head of the queue only: a hand-over costs the same whatever its length.
            first = session.call(
                bound, functools.partial(backend.next_in_line, holder=releaser), name, mode
            )
            if first is None:
                return
            to = first.identity
        session.call(bound, backend.wake, name, to)
    except Exception as exc:  # they poll
        logger.debug("waking the next candidate of %r failed: %s", name, exc)


class Follower:
    """A candidate while it waits: whether its turn has come, its attempts, the holder it
    last saw (``on_new_leader`` for each new one) and its place in the queue, its wake-ups
    (``follow``, set by the store's watch) and how long it sleeps without one."""

    def __init__(
        self,
        campaigner: Campaigner,
        candidacy: Candidacy,
        membership: Membership,
        follow: threading.Event,
        on_new_leader: Callable[[Lease], None],
    ) -> None:
        self.campaigner = campaigner
        self.candidacy = candidacy
        self.membership = membership
        self.follow = follow
        self.on_new_leader = on_new_leader
        self.watch: Watch | None = None
        self.seen: Lease | None = None  # the holder the last attempt saw, if any
        self.seen_sent = 0.0  # clock() when that attempt was sent
        self.place: int | None = None  # this candidate's place in the queue, 0 = next
        self._observed: tuple[str, int] | None = None
        self.last_seen: Lease | None = None

    def open_watch(self) -> None:
        """Ask the store for wake-ups (to set ``follow``); without them, poll."""
        campaigner = self.campaigner
        try:
            # A race is woken by every release; a queue only when its turn comes.
            identity = None if campaigner.mode is Mode.RACE else campaigner.identity
            self.watch = campaigner.backend.watch(
                campaigner.name, self.follow.set, identity=identity
            )
        except Exception as exc:  # no wake-ups: poll
            logger.warning("cannot watch %r for wake-ups, polling: %s", campaigner.name, exc)
            self.watch = None

    def close_watch(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()

    def poll_interval(self) -> float:
        """How long this candidate sleeps unless woken (see :func:`poll_interval`)."""
        campaigner = self.campaigner
        return poll_interval(
            campaigner.mode,
            campaigner.timing,
            self.watch,
            self.place,
            self.seen,
            self.seen_sent,
            self.candidacy.due,
        )

    def attempt(self, session: Caller, called: bool = False) -> Lease | None:
        """Try to acquire, if it is this candidate's turn (or ``called``: woken for it);
        the lease won, or None."""
        campaigner = self.campaigner
        timing = campaigner.timing
        bound = timing.ttl - timing.safety_margin  # an answer after it could not be used
        self.seen = None  # unless this attempt sees a holder (an error: poll as usual)
        if campaigner.mode is not Mode.RACE and not called and not self._my_turn(session):
            return None
        self.seen_sent = clock()
        try:
            acquired, current = attempt(
                campaigner.backend,
                session,
                campaigner.name,
                campaigner.identity,
                timing,
                bound,
                campaigner.label,
            )
        except TimeoutError:
            # Left behind with its connection: the next attempt runs on a new one, and
            # should this one succeed after all, it hands the lease back at once rather
            # than hold it, unrenewed, until it expires.
            logger.warning(
                "campaign for %r timed out: the store did not answer within %.2fs",
                campaigner.name,
                bound,
            )
            return None
        except BackendUnavailable as exc:
            logger.warning("campaign for %r failed: %s", campaigner.name, exc)
            return None
        except Exception:  # a bug or a foreign backend's error: log it, campaign on
            logger.exception("campaign for %r failed", campaigner.name)
            return None
        if acquired is not None:
            self._measure_leaderless(acquired)
        self.seen = current
        if current is not None:
            self._observe(current)
        return acquired

    def _my_turn(self, session: Caller) -> bool:
        """fifo/priority: whether this candidate is first in the queue (or the registry is
        unknown: then every candidate races). When it is not, read who leads instead (for
        ``on_new_leader`` and to know when that lease would run out)."""
        campaigner = self.campaigner
        identity, mode = campaigner.identity, campaigner.mode
        listed = self._listed_turn(session) if mode is Mode.FIFO else None
        if listed is not None:
            return listed
        members = self._read_members(session)
        if members is None:
            return True
        self.place = place(identity, members, mode)
        if may_try(identity, members, mode):
            return True
        if self.place is None:
            self.candidacy.due = 0.0  # not queued (expired, or new): join at once
        answered, current = self._read_lease(session)
        if not answered or current is None:
            return False
        # The holder may still be listed (its withdrawal failed): it is not waiting.
        holder = current.holder
        self.place = place(identity, [m for m in members if m.identity != holder], mode)
        return may_try(identity, members, mode, holder=holder)

    def _listed_turn(self, session: Caller) -> bool | None:
        """fifo, where the store lists its registry for less than it reads it
        (:meth:`~django_leader.backends.base.Backend.queued_ahead`: ZooKeeper, where a
        registry read is a request per candidate): whether it is this candidate's turn, in
        a few requests whatever the queue's length, its place by the listing. With two or
        more entries ahead (a newcomer: behind all of them), the lease held: not its turn
        (the listing and the lease read). Else the head of the queue decides
        (``next_in_line``, which drops the dead entries it meets first, so that they never
        block the queue), and the holder, if still listed at the head, is passed over.
        None: read the whole registry instead (a receiver of the membership signals needs
        it, the store has no cheaper listing, or a read failed)."""
        if self.membership.heard():
            return None
        campaigner = self.campaigner
        backend, identity = campaigner.backend, campaigner.identity
        answered, ahead = self._ask(
            session, functools.partial(backend.queued_ahead, identity=identity), "its place"
        )
        if not answered or ahead is None:
            return None
        self.place = ahead  # at most: some ahead may be dead, or gone since
        current: Lease | None = None
        if ahead >= 2:
            answered, current = self._read_lease(session)
            if not answered:
                return None
            if current is not None:
                return False
        head = functools.partial(backend.next_in_line, mode=Mode.FIFO)
        answered, first = self._ask(session, head, "the head of the queue")
        if not answered:
            return None
        if first is None or first.identity == identity:
            return True
        if current is None:
            answered, current = self._read_lease(session)
            if not answered:
                return None
        if current is None or current.holder != first.identity:
            return False
        # The holder is still listed (its withdrawal failed): it is not waiting.
        answered, after = self._ask(
            session, functools.partial(head, holder=current.holder), "the head of the queue"
        )
        return answered and (after is None or after.identity == identity)

    def _read_lease(self, session: Caller) -> tuple[bool, Lease | None]:
        """Who holds the lease (``seen``, and ``on_new_leader`` if it is new)."""
        sent = clock()
        answered, current = self._ask(session, self.campaigner.backend.read, "the lease")
        if answered:
            self.seen, self.seen_sent = current, sent
            if current is not None:
                self._observe(current)
        return answered, current

    def _ask(
        self, session: Caller, operation: Callable[[str], T], what: str
    ) -> tuple[bool, T | None]:
        """``operation(name)`` through ``session``, bounded: (True, its answer), or (False,
        None) if it failed or went unanswered (logged: the next attempt asks again)."""
        campaigner = self.campaigner
        try:
            return True, session.call(call_bound(campaigner.timing), operation, campaigner.name)
        except Exception as exc:
            logger.debug("reading %s of %r failed: %s", what, campaigner.name, exc)
            return False, None

    def _read_members(self, session: Caller) -> list[Candidate] | None:
        """The registry, read now (None if unknown), with the membership signals."""
        answered, members = self._ask(session, self.campaigner.backend.candidates, "candidates")
        if not answered:
            return None
        if members is not None:
            self.membership.update(members, self.store_now(None))
        return members

    def store_now(self, own: Lease | None) -> datetime | None:
        """The store's clock now, estimated from the last store time heard with the local
        time it was asked at: the renewal of ``own`` (the lease held, if any), else the
        holder's lease the last attempt read. None if none was heard."""
        timing = self.campaigner.timing
        if own is not None and own.renewed_at is not None and own.deadline is not None:
            asked = own.deadline - timing.ttl + timing.safety_margin
            return own.renewed_at + timedelta(seconds=clock() - asked)
        seen = self.seen
        if seen is not None and seen.read_at is not None:
            return seen.read_at + timedelta(seconds=clock() - self.seen_sent)
        return None

    def _measure_leaderless(self, acquired: Lease) -> None:
        """How long the name had no leader before this takeover, by the store's clock: from
        the expiry of the previous holder's lease as last seen, to this acquisition."""
        seen = self.last_seen
        if (
            seen is not None
            and acquired.previous_holder
            and seen.holder == acquired.previous_holder
            and seen.expires_at is not None
            and acquired.acquired_at is not None
        ):
            gap = (acquired.acquired_at - seen.expires_at).total_seconds()
            hooks.notify("leaderless", self.campaigner.name, max(0.0, gap))

    def _observe(self, lease: Lease) -> None:
        self.last_seen = lease
        key = (lease.holder, lease.token)
        if key != self._observed:
            self._observed = key
            if lease.holder != self.campaigner.identity:
                logger.info(
                    "%r is led by %s (token %s)",
                    self.campaigner.name,
                    lease.holder,
                    lease.token,
                    extra=log_extra(lease),
                )
            self.on_new_leader(lease)
