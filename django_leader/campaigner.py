"""What the parts of an :class:`~django_leader.Elector` share: who campaigns, for what
and how (:class:`Campaigner`), what its API asks of the campaign in progress
(:class:`Control`), and the news of each election to those who wait for it
(:class:`Elected`). Plain records, below the campaign's modules."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from . import aio
from .backends.base import Backend
from .conf import Timing
from .election import Mode
from .lease import clock

#: ``Control.stepping_down_for`` when the lease goes to whoever is next in line.
NEXT_IN_LINE = "*"


def validate_watchdog(watchdog: object) -> float | None:
    """``watchdog=`` as seconds (None: no watchdog); ValueError unless a number > 0."""
    if watchdog is None:
        return None
    if (
        isinstance(watchdog, bool)
        or not isinstance(watchdog, (int, float))
        or not 0 < watchdog < float("inf")
    ):
        raise ValueError(f"watchdog must be a number of seconds > 0, got {watchdog!r}")
    return float(watchdog)


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


class Elected:
    """Set at each election of a campaigner (waking the threads and coroutines that wait
    for it), cleared when the term ends; ``leads()`` says whether it leads at this moment."""

    def __init__(self, leads: Callable[[], bool]) -> None:
        self.leads = leads
        self._event = threading.Event()
        self._lock = threading.Lock()
        # Coroutines waiting: woken (from the campaign thread) at each election.
        self._waiters: list[Callable[[], None]] = []

    def set(self) -> None:
        self._event.set()
        with self._lock:
            waiters = list(self._waiters)
        for wake in waiters:
            wake()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float | None) -> bool:
        """Block until elected and leading (True) or ``timeout`` passes (False)."""
        give_up = None if timeout is None else clock() + timeout
        while True:
            remaining = None if give_up is None else give_up - clock()
            if remaining is not None and remaining <= 0:
                return self.leads()
            if self._event.wait(remaining) and self.leads():
                return True
            if self._event.is_set():  # elected flag stale for a moment: poll briefly
                time.sleep(0.01)

    async def wait_async(self, timeout: float | None) -> bool:
        """:meth:`wait` for a coroutine: woken by the campaign thread."""
        woken, wake = aio.wakeable()
        with self._lock:
            self._waiters.append(wake)
        give_up = None if timeout is None else clock() + timeout
        try:
            while True:
                woken.clear()  # an election from now on wakes the wait below
                if self.leads():
                    return True
                remaining = None if give_up is None else give_up - clock()
                if remaining is not None and remaining <= 0:
                    return False
                await aio.wait_event(woken, remaining)
        finally:
            with self._lock, suppress(ValueError):
                self._waiters.remove(wake)
