"""A real backend whose every call is counted: what a wake-up, a hand-over or a poll costs
the store, measured where the Elector meets the Backend contract."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_leader.backends.base import Backend, Watch
from django_leader.election import Candidate, Mode
from django_leader.lease import Lease, clock


@dataclass(frozen=True)
class Call:
    """One call of the backend (or one wake-up delivered to a watch: ``woken``)."""

    #: ``django_leader.lease.clock()`` when it was made.
    at: float
    method: str
    #: The identity it was made for (the acquirer, the announced candidate, the candidate
    #: woken...), "" when the call names none (read, candidates, a wake for everyone).
    who: str = ""


Listener = Callable[[Call], None]


class CallLog:
    """The calls of one or more :class:`CountingBackend` (thread-safe), in order."""

    def __init__(self) -> None:
        self._calls: list[Call] = []
        self._lock = threading.Lock()

    def add(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def between(self, start: float = 0.0, end: float = float("inf")) -> list[Call]:
        """The calls made from ``start`` to ``end`` (``clock()`` times), in order."""
        with self._lock:
            return [call for call in self._calls if start <= call.at <= end]

    @staticmethod
    def tally(calls: Iterable[Call], leave_out: Sequence[str] = ()) -> Counter[str]:
        """How many of each method among ``calls``, those in ``leave_out`` not counted."""
        return Counter(call.method for call in calls if call.method not in leave_out)


class CountingBackend(Backend):
    """Delegates every call to ``real``, after noting it in ``log`` (a :class:`CallLog`,
    which several of them may share) and telling ``listener`` (from the calling thread);
    ``returned`` is told once the call returns (or raises). A wake-up the store delivers to
    a watch is noted as ``woken`` (``who``: the identity watching), before the watcher's
    callback runs."""

    def __init__(
        self,
        real: Backend,
        log: CallLog | None = None,
        *,
        listener: Listener | None = None,
        returned: Listener | None = None,
    ) -> None:
        self.real = real
        self.log = CallLog() if log is None else log
        self.listener = listener
        self.returned = returned
        self.history_database = real.history_database
        self.rows_database = real.rows_database
        #: Every watch the store gave (whether each is :attr:`~Watch.live` yet).
        self.watches: list[Watch] = []

    def __repr__(self) -> str:
        return f"<CountingBackend of {self.real!r}>"

    @contextmanager
    def _note(self, method: str, who: str = "") -> Iterator[None]:
        call = Call(clock(), method, who)
        self.log.add(call)
        if self.listener is not None:
            self.listener(call)
        try:
            yield
        finally:
            if self.returned is not None:
                self.returned(Call(clock(), method, who))

    # -- lease operations -------------------------------------------------------------------
    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        with self._note("acquire", holder):
            return self.real.acquire(name, holder, ttl)

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        with self._note("renew", lease.holder):
            return self.real.renew(lease, ttl)

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        with self._note("renew_many", ",".join(lease.holder for lease in leases)):
            return self.real.renew_many(leases, ttl)

    def release(self, lease: Lease) -> bool:
        with self._note("release", lease.holder):
            return self.real.release(lease)

    def read(self, name: str) -> Lease | None:
        with self._note("read"):
            return self.real.read(name)

    def names(self) -> list[str]:
        with self._note("names"):
            return self.real.names()

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        with self._note("force_release", actor):
            return self.real.force_release(name, actor=actor, detail=detail)

    def now(self) -> datetime:
        with self._note("now"):
            return self.real.now()

    # -- candidates, wake-ups, hand-over ----------------------------------------------------
    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        with self._note("announce", candidate.identity):
            self.real.announce(name, candidate, ttl)

    def withdraw(self, name: str, identity: str) -> None:
        with self._note("withdraw", identity):
            self.real.withdraw(name, identity)

    def candidates(self, name: str) -> list[Candidate] | None:
        with self._note("candidates"):
            return self.real.candidates(name)

    def next_in_line(
        self, name: str, mode: Mode | str, *, holder: str | None = None
    ) -> Candidate | None:
        with self._note("next_in_line"):
            return self.real.next_in_line(name, mode, holder=holder)

    def queued_ahead(self, name: str, identity: str) -> int | None:
        with self._note("queued_ahead", identity):
            return self.real.queued_ahead(name, identity)

    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        def woken() -> None:
            with self._note("woken", identity or ""):
                callback()

        watch = self.real.watch(name, woken, identity=identity)
        if watch is not None:
            self.watches.append(watch)
        return watch

    def wake(self, name: str, identity: str | None = None) -> None:
        with self._note("wake", identity or ""):
            self.real.wake(name, identity)

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        with self._note("request_handover", to):
            return self.real.request_handover(name, to, window, actor=actor, detail=detail)

    # -- history, fencing, the rest ---------------------------------------------------------
    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        self.real.record(kind, lease, detail)

    def flush_history(self, timeout: float | None = None) -> bool:
        return self.real.flush_history(timeout)

    def fenced(self, lease: Lease, using: str | None = None) -> Any:
        return self.real.fenced(lease, using)

    def describe(self) -> str:
        return self.real.describe()

    def close(self) -> None:
        self.real.close()


@contextmanager
def round_trips() -> Iterator[list[str]]:
    """Every round trip to a database or to Redis made in this process meanwhile, in any
    thread, one entry each: a statement's SQL, or ``"redis"`` for a command or a pipeline
    sent."""
    from unittest import mock

    from django.db.backends.utils import CursorWrapper
    from redis.connection import AbstractConnection

    trips: list[str] = []
    execute, send = CursorWrapper.execute, AbstractConnection.send_packed_command

    def executed(self: Any, sql: str, params: Any = None) -> Any:
        trips.append(sql)
        return execute(self, sql, params)

    def sent(self: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append("redis")
        return send(self, *args, **kwargs)

    with (
        mock.patch.object(CursorWrapper, "execute", executed),
        mock.patch.object(AbstractConnection, "send_packed_command", sent),
    ):
        yield trips
