"""The :class:`Lease` value object exchanged between the stores and the election loop."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, TypeVar

from .exceptions import LeadershipLost
from .waits import wait_event, wakeable


class EventKind(str, Enum):
    """What a history event (``LeaseEvent.kind``) records: one change of a lease's holder."""

    ACQUIRED = "acquired"
    #: Acquired after the previous holder's term expired.
    TAKEN_OVER = "taken_over"
    RELEASED = "released"
    #: The holder noticed it no longer holds the lease (a failed renewal, its deadline).
    LOST = "lost"
    #: An operator freed the lease (``leader release``, the admin's action).
    FORCED_RELEASE = "forced_release"
    #: An operator asked the holder to hand the lease over (``leader handover``, the
    #: admin's action); ``detail`` names the candidate it goes to.
    HANDOVER = "handover"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class HistoryEvent:
    """One history row to write: what happened (an :class:`EventKind`) to ``lease``, when
    (``at``; None: the history database's now), with ``detail`` and the operator
    (``actor``) if any."""

    kind: str
    lease: Lease
    at: datetime | None = None
    detail: str = ""
    actor: str = ""


class LossReason(str, Enum):
    """Why a held lease was lost (``Lease.lost_cause``); its value is the start of the
    human-readable ``Lease.lost_reason``."""

    #: A renewal was refused: the lease was taken over or force-released.
    REFUSED = "renewal refused: the lease was taken over or released"
    #: The local deadline passed with no renewal answered in time.
    DEADLINE = "deadline passed without a successful renewal"
    IN_FLIGHT = "deadline passed while a renewal was still in flight"
    ANSWERED_LATE = "deadline passed before the renewal was answered"
    #: A reader of ``Lease.held`` saw the local deadline pass first.
    LOCAL_DEADLINE = "local deadline passed"
    #: The renewer itself failed (a bug, or a foreign backend's error).
    RENEWER_FAILED = "renewer failed"
    #: Ended on purpose: ``Elector.stop()``, ``Elector.resign()``, ``work`` raising, the end
    #: of a ``lock()`` block.
    STOPPED = "elector stopped"
    RESIGNED = "resigned"
    #: Handed over on request (``leader handover``) or to a higher-priority candidate.
    HANDED_OVER = "handed over"
    #: The work did not call ``lease.heartbeat()`` within the Elector's ``watchdog``.
    WATCHDOG = "watchdog: the work stopped heart-beating"
    WORK_RAISED = "work raised"
    RELEASED = "released"

    def __str__(self) -> str:
        return self.value


class Fence(Protocol):
    """What ``Lease.fenced()`` of a held lease calls: the store's ``fenced(lease)``, or
    ``fenced(lease, using=alias)`` when a database is named (attached by the term when the
    lease is granted; a snapshot has none)."""

    def __call__(
        self, lease: Lease, /, using: str | None = None
    ) -> AbstractContextManager[None]: ...


T = TypeVar("T")


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


#: Seconds on the clock every local deadline is measured with: ``CLOCK_BOOTTIME`` where
#: there is one (Linux), which unlike ``CLOCK_MONOTONIC`` keeps counting while the machine
#: or VM is suspended — as the store's clock, and so the lease's expiry, does. Elsewhere
#: ``time.monotonic()``.
clock = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


class LostEvent(threading.Event):
    """The ``threading.Event`` of :attr:`Lease.lost`, whose condition is made only when
    first set or waited on: a lease is made for every grant and every renewal (10,000 in
    a batch renewal), most are never waited on, and an event's condition costs most of a
    lease's making (and gives the garbage collector several objects to track)."""

    def __init__(self) -> None:  # threading.Event's, but for the condition
        self._flag = False

    def __getattr__(self, attribute: str) -> Any:
        if attribute != "_cond":
            raise AttributeError(attribute)
        # One condition whichever threads ask first: dict.setdefault is atomic.
        return self.__dict__.setdefault("_cond", threading.Condition(threading.Lock()))


@dataclass(eq=False)
class Lease:
    """Who holds ``name``, with which fencing ``token``, until when (times from the store's clock).

    A lease read from the store (``Elector.leader()``) is a snapshot. A lease you hold
    (given to ``Elector.run`` work, yielded by ``lock()``) is kept current by its renewer:
    ``renewed_at``/``expires_at`` move on each renewal, ``lost`` is set the moment this
    process stops believing it holds the lease.
    """

    name: str
    holder: str
    token: int
    acquired_at: datetime | None
    renewed_at: datetime | None
    expires_at: datetime | None
    transitions: int
    #: Set once this process no longer holds the lease. Never set on a snapshot.
    lost: threading.Event = field(default_factory=LostEvent, repr=False)
    #: Why the lease was lost, for a human ("renewal refused: …", "released", ...).
    lost_reason: str = field(default="", repr=False)
    #: Why the lease was lost, to compare with (None while not lost).
    lost_cause: LossReason | None = field(default=None, repr=False, compare=False)
    #: ``django_leader.lease.clock()`` time after which this process must consider the lease
    #: lost; ``None`` for a snapshot of someone else's lease.
    deadline: float | None = field(default=None, repr=False)
    previous_holder: str = field(default="", repr=False)
    #: The store's clock when this snapshot was read (``Backend.read``, and the current
    #: holder an ``acquire`` reports), else None.
    read_at: datetime | None = field(default=None, repr=False)
    #: The candidate an operator asked the holder to hand the lease over to (``leader
    #: handover``), while that request stands; "" otherwise.
    handover_to: str = field(default="", repr=False)
    #: How ``fenced()`` fences writes: set on a lease this process was granted (copies
    #: and renewals keep it), None on a snapshot.
    _fence: Fence | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: ``clock()`` of the last :meth:`heartbeat` (the watchdog of an Elector reads it).
    _beat: float | None = field(default=None, repr=False, compare=False)
    #: Callbacks that wake the coroutines in :meth:`wait_lost` (from any thread).
    _waiters: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    @property
    def held(self) -> bool:
        """True while this process holds the lease: not lost, local deadline not passed.

        Once False, never True again for this object: a deadline seen to pass marks the
        lease lost, and a renewal cannot revive it.
        """
        if self.deadline is None or self.lost.is_set():
            return False
        if clock() >= self.deadline:
            self._mark_lost(LossReason.LOCAL_DEADLINE)
            return False
        return True

    @property
    def expires_in(self) -> float | None:
        """Seconds until expiry by the store's clock, for a snapshot from ``read()``."""
        if self.read_at is None or self.expires_at is None:
            return None
        return (self.expires_at - self.read_at).total_seconds()

    def time_left(self) -> float:
        """Seconds until the local deadline (0 when lost or not held)."""
        if not self.held or self.deadline is None:
            return 0.0
        return max(0.0, self.deadline - clock())

    def check(self) -> None:
        """Raise :class:`LeadershipLost` unless this process still holds the lease."""
        if not self.held:
            reason = self.lost_reason or (
                "not a held lease" if self.deadline is None else LossReason.LOCAL_DEADLINE.value
            )
            raise LeadershipLost(f"lease {self.name!r} (token {self.token}) is lost: {reason}")

    def fenced(self, using: str | None = None) -> AbstractContextManager[None]:
        """A transaction on Django database ``using`` whose writes commit only under this
        token: with the database backend, only while this holder still holds the lease
        (its row is locked); with any other store, only if no greater token of this name
        wrote through ``fenced()`` in that database first (its fence row). Both refuse
        once the local deadline passed. Default database: ``DJANGO_LEADER["DATABASE"]``.

        See :meth:`django_leader.backends.base.Backend.fenced`. A snapshot (``read()``,
        ``Elector.leader()``) raises :class:`LeadershipLost`.
        """
        if self._fence is None:
            raise LeadershipLost(f"lease {self.name!r} is a snapshot, not a held lease")
        # Without a database named, the store is called as before ``using`` existed (a
        # third-party store's own ``fenced(lease)`` keeps working).
        return self._fence(self) if using is None else self._fence(self, using=using)

    async def afenced(
        self, fn: Callable[..., T], /, *args: Any, using: str | None = None, **kwargs: Any
    ) -> T:
        """``fn(*args, **kwargs)`` inside :meth:`fenced` (``using``: the database), for a
        coroutine: run in Django's thread for synchronous code (asgiref's
        ``sync_to_async``, ``thread_sensitive=True``), where the ORM may be used, while the
        event loop runs on. Returns what ``fn`` returns; raises :class:`LeadershipLost` as
        :meth:`fenced` does (nothing ``fn`` wrote is committed then)."""
        from asgiref.sync import sync_to_async

        def fenced_call() -> T:
            with self.fenced(using):
                return fn(*args, **kwargs)

        return await sync_to_async(fenced_call, thread_sensitive=True)()

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Wait, without blocking the event loop, until this process no longer holds the
        lease (True) or ``timeout`` seconds pass (False): ``lease.lost.wait()`` for a
        coroutine. The loss is decided by the session thread (a refused renewal, the local
        deadline) whatever the loop is doing; this only hears of it."""
        if self.lost.is_set():
            return True
        woken, wake = wakeable()
        with self._lock:
            if self.lost.is_set():
                return True
            self._waiters.append(wake)
        give_up = None if timeout is None else clock() + timeout
        try:
            while True:
                if self.deadline is not None and not self.held:  # held marks it lost
                    return True
                if self.lost.is_set():
                    return True
                now = clock()
                wait = None if give_up is None else give_up - now
                if wait is not None and wait <= 0:
                    return False
                if self.deadline is not None:  # look again as the deadline passes
                    until_deadline = max(0.0, self.deadline - now) + 0.001
                    wait = until_deadline if wait is None else min(wait, until_deadline)
                await wait_event(woken, wait)
        finally:
            with self._lock, suppress(ValueError):
                self._waiters.remove(wake)

    def heartbeat(self) -> None:
        """Tell the Elector's watchdog that the work is alive (``Elector(watchdog=S)``: a
        work that goes S seconds without calling this is deemed stuck, and the elector
        steps down). Cheap and local: no store call. Harmless without a watchdog."""
        self._beat = clock()

    # -- internal -------------------------------------------------------------------------
    def _mark_lost(self, cause: LossReason, detail: str = "") -> bool:
        """Set ``lost`` once, saying why; return True if this call did it."""
        with self._lock:
            if self.lost.is_set():
                return False
            self.lost_cause = cause
            self.lost_reason = f"{cause.value}: {detail}" if detail else cause.value
            self.lost.set()
            waiters = list(self._waiters)
        for wake in waiters:
            wake()
        return True

    def _update(self, other: Lease, deadline: float) -> bool:
        """Take a renewal's times and new deadline, unless the deadline has already passed
        (then False: the lease must stay lost).

        A lease marked lost on purpose (the holder is stopping: its work winds down) is
        still renewed until it is released; ``held`` stays False all the same.
        """
        with self._lock:
            if self.deadline is None or clock() >= self.deadline:
                return False
            self.renewed_at = other.renewed_at
            self.expires_at = other.expires_at
            self.handover_to = other.handover_to
            self.deadline = deadline
            return True


_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "django_leader_current_lease", default=None
)


def current_lease() -> Lease | None:
    """The lease held by the running ``singleton_task`` or ``Elector.run`` work, else None."""
    return _current.get()


class _use_lease(AbstractContextManager[None]):
    """Make ``lease`` the :func:`current_lease` for the duration of a block."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._token: contextvars.Token[Lease | None] | None = None

    def __enter__(self) -> None:
        self._token = _current.set(self.lease)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
