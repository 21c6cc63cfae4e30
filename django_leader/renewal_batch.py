"""What a session (``session.py``) renews: a :class:`Renewer`, one lease; a
:class:`Batch`, one ``renew_many`` call in flight, its renewers, and when it counts as
hung or as waiting too long behind another call."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from .conf import Timing
from .lease import Lease, LossReason


class Renewer(Protocol):
    """What the session needs of a lease it renews (``django_leader.term.Renewer``)."""

    lease: Lease
    timing: Timing
    next_renew: float  # these two: the session's, changed under its lock
    in_flight: bool

    @property
    def deadline(self) -> float: ...
    def renewed(self, renewed: Lease, sent: float, took: float) -> bool: ...
    def _lost_in_session(self, cause: LossReason, detail: str = "") -> None: ...


class Batch:
    """One ``renew_many`` call in flight: its renewers, in the order sent."""

    __slots__ = ("bound", "future", "left", "patience", "renewers", "sent")

    def __init__(self, renewers: list[Renewer], sent: float) -> None:
        self.renewers = renewers
        self.sent = sent
        #: clock() after which the call is deemed hung: the first deadline among its leases.
        self.bound = min(renewer.deadline for renewer in renewers)
        #: clock() by which the call must have started (not queued behind a slow one).
        self.patience = sent + min(renewer.timing.call_timeout for renewer in renewers) / 2
        self.future: Future[list[Lease | None]] | None = None
        self.left = False  # left behind, hung, with its thread

    def hung(self, now: float) -> bool:
        """Running past its bound (and not left behind yet)."""
        future = self.future
        running = future is not None and future.running() and not future.done()
        return running and not self.left and now >= self.bound

    def waiting(self, now: float) -> bool:
        """Queued past its patience, behind another call."""
        future = self.future
        queued = future is not None and not future.running() and not future.done()
        return queued and now >= self.patience
