"""What the parts of an :class:`~django_leader.Elector` share: who campaigns, for what
and how (:class:`Campaigner`), and what its API asks of the campaign in progress
(:class:`Control`). Plain records, below the campaign's modules."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .backends.base import Backend
from .conf import Timing
from .election import Mode

#: ``Control.stepping_down_for`` when the lease goes to whoever is next in line.
NEXT_IN_LINE = "*"


@dataclass
class Control:
    """What an elector's API (``stop()``, ``resign()``, ``hand_over()``) asks of its
    campaign and of the term in progress; read by their loops, which ``wake`` wakes."""

    stop: threading.Event = field(default_factory=threading.Event)
    #: Wakes the loop of the term in progress (the renewer, the work, the API).
    wake: threading.Event = field(default_factory=threading.Event)
    #: Wakes a waiting candidate (the store's wake-ups, ``stop()``).
    follow: threading.Event = field(default_factory=threading.Event)
    release_on_stop: bool = True
    #: Set by ``resign()``: campaign again after that many seconds.
    resign_backoff: float | None = None
    #: The candidate this leader steps down for (:data:`NEXT_IN_LINE`: whoever is next),
    #: or "" while it is not handing over.
    stepping_down_for: str = ""


@dataclass(frozen=True)
class Campaigner:
    """Who campaigns, for what, and how: what a term needs to know of its elector."""

    backend: Backend
    name: str
    identity: str
    mode: Mode
    priority: int
    timing: Timing
    watchdog: float | None

    @property
    def label(self) -> str:
        return f"{self.identity} (elector of {self.name!r})"
