"""The store callers of a session: one for the renewal batches, the reports and the calls
of one holder at a time; up to :data:`WORKERS` while holders wait on calls at once.

A :class:`~django_leader.caller.StoreCaller` runs its calls one after the other on one
thread, hence one store connection (the database backend keeps one per thread). Eight
threads taking distinct locks on a database queued on it: about one lock per two round
trips for the whole process. A :class:`CallerPool` gives a holder that calls while another
holder's call is waited for a caller of its own, up to :data:`WORKERS` in all, each with
its own bound on every call exactly as the first (``caller.py``: a hung call is left
behind with its thread and connection). One unused for :data:`IDLE` seconds ends, closing
its connection. A process whose holders call one at a time keeps one caller."""

from __future__ import annotations

from . import hooks
from .backends.base import Backend
from .caller import StoreCaller
from .lease import clock

#: Most callers (threads, each with its store connection) of one session: the first, and
#: those added while several holders wait on store calls at once.
WORKERS = 4
#: Seconds an added caller may stay unused before it ends and closes its connection.
IDLE = 10.0


class CallerPool:
    """The callers of a session, and whom each waits on (the session's lock held for
    every method: it is the pool's)."""

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self.name = name
        self.first = StoreCaller(backend, name)
        self._callers: list[StoreCaller] = [self.first]
        self._waiting: dict[int, int] = {id(self.first): 0}  # waiters per caller
        self._used: dict[int, float] = {id(self.first): clock()}

    def __len__(self) -> int:
        return len(self._callers)

    def take(self) -> StoreCaller:
        """The caller for a holder's call, counted as waited on until :meth:`give`: the
        first unless someone waits on it; else one nobody waits on, a new one while there
        are fewer than :data:`WORKERS`, or the least waited on."""
        chosen = next((c for c in self._callers if self._waiting[id(c)] == 0), None)
        if chosen is None and len(self._callers) < WORKERS:
            chosen = StoreCaller(self.backend, f"{self.name}{len(self._callers) + 1}")
            self._callers.append(chosen)
            self._waiting[id(chosen)] = 0
            self._report()
        if chosen is None:
            chosen = min(self._callers, key=lambda c: self._waiting[id(c)])
        self._waiting[id(chosen)] += 1
        return chosen

    def give(self, caller: StoreCaller) -> None:
        """``caller``'s call, from :meth:`take`, was answered or given up."""
        if id(caller) in self._waiting:  # else closed meanwhile
            self._waiting[id(caller)] -= 1
            self._used[id(caller)] = clock()

    def shrink(self, now: float) -> None:
        """End the added callers nobody waits on and unused for :data:`IDLE` seconds."""
        idle = [
            caller
            for caller in self._callers[1:]
            if self._waiting[id(caller)] == 0 and now - self._used.get(id(caller), now) >= IDLE
        ]
        for caller in idle:
            self._forget(caller)
        if idle:
            self._report()

    def next_shrink(self) -> float | None:
        """When :meth:`shrink` may end an added caller next (None: none is added)."""
        times = [
            self._used.get(id(c), clock()) + IDLE
            for c in self._callers[1:]
            if self._waiting[id(c)] == 0
        ]
        return min(times) if times else None

    def close(self) -> None:
        """Close every caller: each ends once its queue is done, closing its connection.
        Returns at once, even while a call hangs."""
        for caller in self._callers[1:]:
            self._forget(caller)
        self.first.close()
        self._report(0)

    def _forget(self, caller: StoreCaller) -> None:
        caller.close()
        self._callers.remove(caller)
        self._waiting.pop(id(caller), None)
        self._used.pop(id(caller), None)

    def _report(self, count: int | None = None) -> None:
        """Tell the observers (the metrics' ``django_leader_store_callers``) how many."""
        hooks.notify("store_callers", repr(self.backend), len(self) if count is None else count)
