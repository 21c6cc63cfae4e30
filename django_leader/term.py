"""The life of one term — acquire, renew, step down, release — shared by ``lock()`` and
:class:`~django_leader.Elector`, as etcd's ``concurrency.Session`` is by its election and
mutex.

A term begins with a grant (:func:`attempt`: one bounded acquisition; a grant that comes
too late to be acted on is handed back here). A :class:`Term` then keeps it: its
:class:`Renewer` has the lease renewed, by the process's
:class:`~django_leader.session.Session` for that store, until the holder steps down
(:meth:`Term.step_down`) or loses it, and :meth:`Term.end` stops the renewals, releases the
lease within the bound of a store call, logs and sends the signals. Store calls run on a
:class:`~django_leader.caller.StoreCaller` (a ``lock()``'s on its session's): none of them
can hang the holder. The grant and the end of a term are written once, as steps
(:mod:`django_leader.core`) that a thread or a coroutine drives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from . import backends, hooks, signals
from .backends.base import Backend
from .caller import Caller, StoreCaller
from .conf import Timing
from .core import NOW, Call, Steps, arun, awaiting, blocking, run, stamped
from .exceptions import BackendUnavailable
from .lease import EventKind, Lease, LossReason, clock
from .session import Session
from .session import session as session_of

logger = logging.getLogger("django_leader")

__all__ = [
    "Renewer",
    "StoreCaller",
    "Term",
    "aattempt",
    "acquire_once",
    "attempt",
    "attempting",
    "call_bound",
    "hand_back",
    "log_extra",
    "resolve_backend",
]


def resolve_backend(backend: Backend | str | None, timing: Timing | None = None) -> Backend:
    """The backend to use: an instance as given, else the one named (default: settings),
    with store-call timeouts short enough for ``timing`` (no call outlives a deadline)."""
    return backends.resolve(backend, timeout=None if timing is None else timing.call_timeout)


def log_extra(lease: Lease) -> dict[str, Any]:
    return {"lease": lease.name, "holder": lease.holder, "token": lease.token}


def call_bound(timing: Timing) -> float:
    """The hard bound of one store call of a lock or an Elector (acquire, release, read):
    three times the store's own call timeout (its socket and statement timeouts fire
    first, normally), never past the local deadline an acquisition sent now would have."""
    return max(timing.call_timeout, min(3 * timing.call_timeout, timing.ttl - timing.safety_margin))


# -- the grant ----------------------------------------------------------------------------
def _granted(backend: Backend, acquired: Lease, sent: float, timing: Timing) -> Lease:
    """A granted lease made held: its local deadline counts from ``sent``, when the request
    was sent (the store may have counted its ttl from any time after), and it carries what
    its ``fenced()`` needs."""
    acquired.deadline = sent + timing.ttl - timing.safety_margin
    acquired._fence = backend.fenced
    return acquired


def acquire_once(
    backend: Backend, name: str, holder: str, timing: Timing
) -> tuple[Lease | None, Lease | None]:
    """One acquisition attempt; the lease it grants is held: it carries its local deadline
    and what its ``fenced()`` needs."""
    sent, (acquired, current) = stamped(backend.acquire, name, holder, timing.ttl)
    return None if acquired is None else _granted(backend, acquired, sent, timing), current


def attempting(
    backend: Backend,
    caller: Caller,
    name: str,
    identity: str,
    timing: Timing,
    bound: float,
    label: str,
) -> Steps[tuple[Lease | None, Lease | None]]:
    """One acquisition of ``name`` for ``identity`` on ``caller``: ``(granted, current)``
    as :meth:`Backend.acquire <django_leader.backends.base.Backend.acquire>` says. Steps
    (:mod:`django_leader.core`): :func:`attempt` runs them in a thread, :func:`aattempt`
    in a coroutine (the event loop runs on while the store answers).

    Waited for at most ``bound`` seconds: ``TimeoutError`` after it (store errors
    propagate). The local deadline of a grant counts from the sending of the request. A
    grant that comes too late to be acted on is handed back — released, not held
    unrenewed until it expires: one answered after its own local deadline here (and
    reported as ``(None, None)``), one answered after the caller stopped waiting (or its
    awaiting task was cancelled) by the thread left behind with the call, when it comes.
    """
    sent, (acquired, current) = yield Call(
        caller,
        bound,
        stamped,
        (backend.acquire, name, identity, timing.ttl),
        on_late=_late_grant(backend, label),
    )
    if acquired is None:
        return None, current
    _granted(backend, acquired, sent, timing)
    now = yield NOW
    if now < _deadline(acquired):
        return acquired, current
    try:
        yield Call(
            caller,
            call_bound(timing),
            hand_back,
            (backend, acquired, label, "granted after its deadline"),
        )
    except Exception as exc:  # then it expires after its ttl
        _not_handed_back(label, acquired, exc)
    return None, None


#: :func:`attempting` in the calling thread, blocking.
attempt = blocking(attempting)
#: :func:`attempting` in a coroutine, awaited.
aattempt = awaiting(attempting)


def _deadline(lease: Lease) -> float:
    deadline = lease.deadline
    assert deadline is not None
    return deadline


def _late_grant(
    backend: Backend, label: str
) -> Callable[[tuple[float, tuple[Lease | None, Lease | None]]], None]:
    """What to do with an acquisition answered after its caller stopped waiting."""

    def late(result: tuple[float, tuple[Lease | None, Lease | None]]) -> None:
        acquired = result[1][0]
        if acquired is not None:
            hand_back(backend, acquired, label, "granted after the attempt was given up")

    return late


def _not_handed_back(label: str, lease: Lease, exc: Exception) -> None:
    logger.warning(
        "%s could not hand back the lease (token %s): %s",
        label,
        lease.token,
        exc,
        extra=log_extra(lease),
    )


def hand_back(backend: Backend, lease: Lease, label: str, why: str) -> None:
    """Release a grant its holder will not act on (on the store thread that got it)."""
    released = backend.release(lease)
    logger.info(
        "%s handed back the lease (token %s), %s%s",
        label,
        lease.token,
        why,
        "" if released else ": it was no longer held",
        extra=log_extra(lease),
    )


# -- the term -----------------------------------------------------------------------------
class Renewer:
    """Keeps one held lease renewed, every ``renew_interval``, by the process's
    :class:`~django_leader.session.Session` for its backend: one loop renews every lease
    the process holds on that store, batched (``renew_many``), each on its own terms.

    The lease is marked lost (``lease.lost`` set, ``on_lost(lease)`` called once) as soon
    as: a renewal is refused, or the local deadline (send time of the last successful
    acquire/renew + TTL - safety margin) passes, even if a renewal is still in flight.
    Transient store errors are retried until that deadline. ``on_lost`` and ``on_renewed``
    run on the session's caller thread, never on its loop; none runs after :meth:`stop`
    has returned, and a loss not reported by then is reported by :meth:`stop` itself.
    ``caller`` runs the history record of a loss.
    """

    def __init__(
        self,
        backend: Backend,
        lease: Lease,
        timing: Timing,
        caller: Caller,
        on_lost: Callable[[Lease], None] | None = None,
        on_renewed: Callable[[Lease], None] | None = None,
    ) -> None:
        if lease.deadline is None:
            raise ValueError("Renewer needs a held lease (with a deadline)")
        self.backend = backend
        self.lease = lease
        self.timing = timing
        self.caller = caller
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        #: clock() at which the session renews the lease next (it may do so a little early,
        #: to batch it with others), and whether a renewal of it is in flight: the
        #: session's, changed under its lock.
        self.next_renew = lease.deadline - timing.ttl + timing.safety_margin + timing.renew_interval
        self.in_flight = False
        self._session: Session | None = None
        self._stopped = False
        self._report_lock = threading.RLock()  # held while a report runs
        self._reported = False
        #: Set by the session when it marks the lease lost (the report may still be queued).
        self._lost_cause: LossReason | None = None

    def __repr__(self) -> str:
        return f"<Renewer {self.lease.name!r} token {self.lease.token}>"

    @property
    def deadline(self) -> float:
        deadline = self.lease.deadline
        assert deadline is not None
        return deadline

    def start(self) -> None:
        self._session = session_of(self.backend).add(self)

    def stop(self) -> None:
        """Stop renewing (does not release). Returns at once, even while a renewal hangs
        (after any report of this lease already running).

        A lease whose deadline passed before the session could notice is reported lost here.
        """
        self._stopped = True
        if self._session is not None:
            self._session.remove(self)
        with self._report_lock:  # after a report running now
            if clock() >= self.deadline:
                self._lose(LossReason.DEADLINE)
            elif self._lost_cause is not None:
                self._report()  # the session marked it lost; its report is still queued

    # -- called by the session ------------------------------------------------------------
    def renewed(self, renewed: Lease, sent: float, took: float) -> bool:
        """Take a renewal sent at ``sent``: False if it came too late (the lease must stay
        lost: callers may already have seen it lost)."""
        timing = self.timing
        if not self.lease._update(renewed, sent + timing.ttl - timing.safety_margin):
            return False
        self.next_renew = sent + timing.renew_interval
        hooks.notify("renew", self.lease.name, took)
        if self.on_renewed is not None:
            self._joined().submit(self._report_renewed, bound=timing.call_timeout)
        return True

    def _lost_in_session(self, cause: LossReason, detail: str = "") -> None:
        """Mark the lease lost now (the session's loop) and report it on the session's
        caller (user code never runs on the loop)."""
        if cause is LossReason.IN_FLIGHT:
            hooks.notify("renew_failed", self.lease.name)
        if self._stopped:  # the holder ended the term: its release decides what is said
            return
        self.lease._mark_lost(cause, detail)
        self._lost_cause = cause
        self._joined().submit(self._report_queued, bound=self.timing.call_timeout)

    def _joined(self) -> Session:
        """The session this renewer joined (in :meth:`start`): the one calling it."""
        assert self._session is not None
        return self._session

    def _report_renewed(self) -> None:
        with self._report_lock:
            if self._stopped or self._lost_cause is not None or self.on_renewed is None:
                return
            try:
                self.on_renewed(self.lease)
            except Exception:
                logger.exception("on_renewed handler for %r raised", self.lease.name)

    # -- the loss ---------------------------------------------------------------------------
    def _lose(self, cause: LossReason, detail: str = "") -> None:
        """Mark the lease lost and report it, exactly once, whoever marked it first (a
        reader of ``lease.held`` may have seen the deadline pass before the session did)."""
        self.lease._mark_lost(cause, detail)
        self._report()

    def _report_queued(self) -> None:
        """The session's report of the loss it marked: not once :meth:`stop` was called —
        then :meth:`stop` reported a loss marked before it looked, and one marked after
        is the end of the term (its release, ``lease_released``), not a loss."""
        with self._report_lock:
            if not self._stopped:
                self._report()

    def _report(self) -> None:
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
            lease = self.lease
            logger.warning(
                "lost lease %r (token %s): %s",
                lease.name,
                lease.token,
                lease.lost_reason,
                extra=log_extra(lease),
            )
            with suppress(RuntimeError):  # the owner may already have closed the caller
                self.caller.submit(
                    self.backend.record,
                    EventKind.LOST,
                    lease,
                    lease.lost_reason,
                    bound=self.timing.call_timeout,
                )
            if self.on_lost is not None:
                try:
                    self.on_lost(lease)
                except Exception:
                    logger.exception("on_lost handler for %r raised", lease.name)


class Term:
    """One holder's term on one lease, from its grant to its release.

    ``sender`` is the ``sender`` of the signals (the Elector, the lock); ``label`` names the
    holder in the log. ``on_lost(term)`` runs on the session's caller when the lease is lost
    (not when the holder steps down). ``leader_lost`` is sent at most once per term: by
    :meth:`signal_lost`, and by :meth:`end` for a term that ends without a release.
    """

    def __init__(
        self,
        backend: Backend,
        lease: Lease,
        timing: Timing,
        caller: Caller,
        *,
        sender: Any,
        label: str,
        on_lost: Callable[[Term], None] | None = None,
        on_renewed: Callable[[Lease], None] | None = None,
        log_level: int = logging.INFO,
    ) -> None:
        self.backend = backend
        self.lease = lease
        self.timing = timing
        self.caller = caller
        self.sender = sender
        self.label = label
        #: Of the "acquired" and "released" lines (a loss is a warning whatever it is).
        self.log_level = log_level
        self._on_lost = on_lost
        self._signalled = False
        self._stepped_down = False
        self._lock = threading.Lock()
        self.renewer = Renewer(
            backend, lease, timing, caller, on_lost=self._renewer_lost, on_renewed=on_renewed
        )

    def __repr__(self) -> str:
        return f"<Term {self.lease.name!r} token {self.lease.token}>"

    def begin(self) -> None:
        """Start renewing."""
        self.renewer.start()
        self._log_routine("acquired")

    def _log_routine(self, verb: str) -> None:
        """Log the routine line of the term, ``<label> <verb> the lease (token N)``, at
        :attr:`log_level`."""
        if logger.isEnabledFor(self.log_level):
            lease = self.lease
            logger.log(
                self.log_level,
                "%s %s the lease (token %s)",
                self.label,
                verb,
                lease.token,
                extra=log_extra(lease),
            )

    def signal_elected(self) -> None:
        signals.send(signals.leader_elected, self.sender, lease=self.lease)

    def signal_lost(self) -> None:
        """Send ``leader_lost`` for this term, unless it was sent already."""
        with self._lock:
            if self._signalled:
                return
            self._signalled = True
        signals.send(signals.leader_lost, self.sender, lease=self.lease)

    def step_down(self, cause: LossReason, detail: str = "") -> bool:
        """End the term by choice: ``lease.lost`` is set, saying why. The renewer keeps the
        lease alive in the store until :meth:`end`, so nobody takes over while the holder's
        work winds down. False if the lease was lost already (then it was no choice)."""
        stepped_down = self.lease._mark_lost(cause, detail)
        if stepped_down:
            self._stepped_down = True
        return stepped_down

    def end(self, release: bool = True) -> bool:
        """Stop renewing, release the lease (unless ``release`` is False) within the bound
        of a store call, log, and send ``lease_released`` — or ``leader_lost`` if it was
        not released (unless the loss was signalled already). True if released. Returns
        even while a renewal hangs; the caller is left open."""
        return run(self.ending(release))

    async def aend(self, release: bool = True) -> bool:
        """:meth:`end` for a coroutine: the release is awaited, the event loop runs on."""
        return await arun(self.ending(release))

    def ending(self, release: bool = True) -> Steps[bool]:
        """The steps of :meth:`end`."""
        self._stop_renewing()
        released = False
        if release:
            try:
                released = yield Call(
                    self.caller, call_bound(self.timing), self.backend.release, (self.lease,)
                )
            except (BackendUnavailable, TimeoutError) as exc:
                self._not_released(exc)
        return self._ended(release, released)

    def _stop_renewing(self) -> None:
        self.renewer.stop()
        self.step_down(LossReason.RELEASED)  # unless the holder said why already

    def _not_released(self, exc: Exception) -> None:
        logger.warning(
            "%s could not release the lease, it will expire: %s",
            self.label,
            exc,
            extra=log_extra(self.lease),
        )

    def _ended(self, release: bool, released: bool) -> bool:
        """Log and signal the end of the term; ``released``: whether the store freed it."""
        lease = self.lease
        if release and not released and self._stepped_down:
            logger.warning(
                "%s no longer held the lease at release (token %s)",
                self.label,
                lease.token,
                extra=log_extra(lease),
            )
        if released:
            self._log_routine("released")
            signals.send(signals.lease_released, self.sender, lease=lease)
        else:
            self.signal_lost()
        return released

    def _renewer_lost(self, lease: Lease) -> None:
        if self._on_lost is not None:
            self._on_lost(self)
