"""A candidate's presence in the store's registry: its heartbeats (announcements), its
withdrawal, and the membership signals a campaigner sends for the others it sees come and
go. Best effort throughout: the registry orders a fifo/priority queue and feeds
``leader status``, but the lease's compare-and-set alone decides who leads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

from . import signals
from .backends.base import Backend
from .caller import Caller
from .conf import Timing
from .election import Candidate, Mode
from .lease import clock

logger = logging.getLogger("django_leader")

#: Seconds by which a vanished candidate's heartbeat may still have been running (by this
#: process's estimate of the store's clock) and be reported as expired rather than left.
EXPIRY_SLACK = 0.5

#: Seconds a follower waits before announcing itself again after an announcement failed.
ANNOUNCE_BACKOFF = 60.0


class Candidacy:
    """The heartbeats of one campaigner (``candidate``) for ``name`` in the registry."""

    def __init__(
        self, backend: Backend, name: str, candidate: Candidate, mode: Mode, timing: Timing
    ) -> None:
        self.backend = backend
        self.name = name
        self.candidate = candidate
        self.mode = mode
        self.timing = timing
        #: clock() when the next heartbeat is due (0: at once).
        self.due = 0.0
        self._announcing: Future[None] | None = None  # the last announcement, if any
        self._failed = False

    @property
    def ttl(self) -> float:
        """How long a heartbeat keeps this candidate in the registry: a few missed attempts
        long, so a follower never seems to flap. It beats every third of that."""
        return max(self.timing.ttl, 3 * self.timing.retry_interval)

    def announce(self, session: Caller) -> None:
        """Tell the store, now and then, that this candidate campaigns (for ``leader
        status``; best effort, never waited for, never part of the lease decision).

        It shares the store thread with the campaign: at most one announcement is in
        flight, and after a failure (the store down, the candidates table not migrated)
        the next one waits :data:`ANNOUNCE_BACKOFF` in race mode (a fifo/priority candidate
        tries again at its next heartbeat), so that it never delays a takeover.
        """
        now = clock()
        if now < self.due or (self._announcing is not None and not self._announcing.done()):
            return
        ttl = self.ttl
        self.due = now + ttl / 3
        try:
            future = session.submit(
                self.backend.announce,
                self.name,
                self.candidate,
                ttl,
                bound=self.timing.call_timeout,
            )
        except RuntimeError:  # the session is closed by now
            return
        self._announcing = future
        future.add_done_callback(self._announced)

    def _announced(self, future: Future[None]) -> None:
        exc = future.exception()
        if exc is None:
            self._failed = False
            return
        # A race only lists its candidates: a failing registry (not migrated) waits long.
        # A queue needs its place: the next heartbeat tries again (and meanwhile this
        # candidate is not queued, so it waits its turn behind those that are).
        backoff = ANNOUNCE_BACKOFF if self.mode is Mode.RACE else self.ttl / 3
        self.due = clock() + backoff
        log = logger.debug if self._failed else logger.warning
        self._failed = True
        log(
            "could not announce %s as a candidate for %r (leader status will not list it; "
            "retrying in %.0fs): %s",
            self.candidate.identity,
            self.name,
            backoff,
            exc,
        )

    def leave_queue(self, session: Caller) -> None:
        """Leave the registry (in the background, on the store thread: before any later
        announcement), so that the next announcement joins the tail of the queue."""
        with suppress(RuntimeError):
            session.submit(
                self._quietly,
                self.backend.withdraw,
                self.name,
                self.candidate.identity,
                bound=self.timing.call_timeout,
            )

    def withdraw(self, session: Caller) -> None:
        """At the end of the campaign: leave the registry now, if ever announced."""
        if self._announcing is None:
            return
        self._announcing = None
        with suppress(TimeoutError, RuntimeError):
            session.call(
                self.timing.call_timeout,
                self._quietly,
                self.backend.withdraw,
                self.name,
                self.candidate.identity,
            )

    def _quietly(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            logger.debug("%s for %r failed: %s", call.__name__, self.name, exc)


class Membership:
    """The registry of ``name`` as a campaigner last read it, to send ``candidate_joined``
    / ``candidate_left`` / ``candidate_expired`` (from ``sender``) for what changed."""

    def __init__(self, sender: object, name: str) -> None:
        self.sender = sender
        self.name = name
        self._members: dict[str, Candidate] = {}
        self.read_at = 0.0

    def heard(self) -> bool:
        """Whether anybody listens to the membership signals of this sender (else the
        registry need not be read for them)."""
        return any(
            signal.has_listeners(self.sender)
            for signal in (
                signals.candidate_joined,
                signals.candidate_left,
                signals.candidate_expired,
            )
        )

    def update(self, members: list[Candidate], store_now: datetime | None) -> None:
        """Send the signals for what changed since the registry was last read (best
        effort: a candidate that came and went between two reads is not seen);
        ``store_now`` is the store's clock now as estimated, None if unknown."""
        now = clock()
        known, self._members = self._members, {c.identity: c for c in members}
        read_before, self.read_at = self.read_at, now
        if not read_before:
            return  # the first read: nothing to compare with
        for identity, candidate in self._members.items():
            if identity not in known:
                signals.send(
                    signals.candidate_joined, self.sender, name=self.name, candidate=candidate
                )
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
            signals.send(signal, self.sender, name=self.name, candidate=candidate)
