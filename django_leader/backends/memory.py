"""An in-process lease store: the lease contract kept in this process's memory.

:class:`MemoryBackend` is what ``django_leader.testing``'s ``override_leader`` and
``leader_backend`` install, and the store the core's tests and the contract suite run
against without a server. Other processes cannot see it: it is not for production.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from ..election import Candidate
from ..lease import Lease, clock
from .base import Backend

#: The holder of a name pinned with ``leader=False``.
OTHER_HOLDER = "another-instance"


@dataclass
class _Record:
    holder: str
    token: int
    transitions: int
    acquired_at: datetime
    renewed_at: datetime
    expires: float  # on lease.clock(); inf for a pinned name
    #: What the store reports: ``renewed_at`` plus the ttl exactly (``_at(expires)``
    #: rounds each time to the microsecond apart, and could be 1 µs off); None if pinned.
    expires_at: datetime | None


class MemoryBackend(Backend):
    """An in-process lease store for tests: the lease contract, with this process's clock.

    Its clock (:meth:`now`, every time it reports) is the wall clock when the store was
    made, advanced by the monotonic clock: like a real store's, it never goes back, and a
    test that moves the wall clock (time-machine, freezegun) does not move it.

    Not for production: other processes cannot see it.
    """

    history_database = None

    def __init__(self) -> None:
        self._started = (datetime.now(dt_timezone.utc), clock())
        self._lock = threading.Lock()
        self._leases: dict[str, _Record] = {}
        self._tokens: dict[str, int] = {}
        # name -> identity -> (candidate, expiry on clock()); the join counter
        self._candidates: dict[str, dict[str, tuple[Candidate, float]]] = {}
        self._joins = 0
        self._watches: dict[tuple[str, str | None], list[Callable[[], None]]] = {}
        self._handovers: dict[str, tuple[str, float]] = {}  # name -> (to, until)
        self.events: list[tuple[str, str, str, int]] = []  # (kind, name, holder, token)

    def now(self) -> datetime:
        return self._at(clock())

    def _at(self, moment: float) -> datetime:
        """The store's time at ``moment`` on ``lease.clock()``."""
        wall, mono = self._started
        return wall + timedelta(seconds=moment - mono)

    def pin(self, name: str, holder: str = OTHER_HOLDER) -> None:
        """Make ``holder`` hold ``name`` for ever (until :meth:`unpin` or a force release)."""
        with self._lock:
            self._grant(name, holder, float("inf"))

    def unpin(self, name: str) -> None:
        """Forget ``name`` (pinned or held): it is free at once."""
        with self._lock:
            self._leases.pop(name, None)

    def _grant(self, name: str, holder: str, ttl: float) -> Lease:
        moment = clock()
        now, expires = self._at(moment), moment + ttl
        token = self._tokens.get(name, 0) + 1
        self._tokens[name] = token
        previous = self._leases.get(name)
        record = _Record(
            holder,
            token,
            (previous.transitions if previous else 0) + 1,
            now,
            now,
            expires,
            None if ttl == float("inf") else now + timedelta(seconds=ttl),
        )
        self._leases[name] = record
        self.events.append(("acquired", name, holder, token))
        return self._lease(name, record)

    def _lease(self, name: str, record: _Record) -> Lease:
        return Lease(
            name=name,
            holder=record.holder,
            token=record.token,
            acquired_at=record.acquired_at,
            renewed_at=record.renewed_at,
            expires_at=record.expires_at,
            transitions=record.transitions,
            read_at=self.now(),
        )

    def _current(self, name: str) -> _Record | None:
        record = self._leases.get(name)
        if record is None or not record.holder or record.expires <= clock():
            return None
        return record

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        with self._lock:
            record = self._leases.get(name)
            if record is not None and record.expires > clock():
                # Held, or force-released with its term still running.
                current = self._current(name)
                return None, None if current is None else self._lease(name, current)
            handover = self._handovers.get(name)
            if handover is not None and handover[1] > clock() and handover[0] != holder:
                return None, None
            self._handovers.pop(name, None)
            lease = self._grant(name, holder, ttl)
            return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        with self._lock:
            current = self._current(lease.name)
            if current is None or (current.holder, current.token) != (lease.holder, lease.token):
                return None
            moment = clock()
            current.expires = moment + ttl
            current.renewed_at = self._at(moment)
            current.expires_at = current.renewed_at + timedelta(seconds=ttl)
            renewed = self._lease(lease.name, current)
            handover = self._handovers.get(lease.name)
            if handover is not None and handover[1] > moment:
                renewed.handover_to = handover[0]
            return renewed

    def release(self, lease: Lease) -> bool:
        with self._lock:
            current = self._current(lease.name)
            if current is None or (current.holder, current.token) != (lease.holder, lease.token):
                return False
            # Kept, held by nobody and free at once: its name and transitions stay known.
            current.holder = ""
            current.expires = clock()
            self.events.append(("released", lease.name, lease.holder, lease.token))
            callbacks = list(self._watches.get((lease.name, None), []))
        for callback in callbacks:  # the name's watchers, as the real stores wake them
            callback()
        return True

    def read(self, name: str) -> Lease | None:
        with self._lock:
            current = self._current(name)
            if current is None:
                return None
            snapshot = self._lease(name, current)
            return snapshot

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._leases)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        with self._lock:
            current = self._current(name)
            if current is None:
                return None
            released = self._lease(name, current)
            current.holder = ""  # the term runs out as with the real stores
            self.events.append(("forced_release", name, released.holder, released.token))
            return released

    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        with self._lock:
            now = clock()
            known = self._candidates.setdefault(name, {})
            before = known.get(candidate.identity)
            if before is not None and before[1] > now:
                first = before[0]
                seq, joined = first.seq, first.joined_at
            else:
                self._joins += 1
                seq, joined = self._joins, self._at(now)
            known[candidate.identity] = (
                replace(
                    candidate,
                    seq=seq,
                    joined_at=joined,
                    seen_at=self._at(now),
                    expires_at=self._at(now + ttl),
                ),
                now + ttl,
            )

    def withdraw(self, name: str, identity: str) -> None:
        with self._lock:
            self._candidates.get(name, {}).pop(identity, None)

    def candidates(self, name: str) -> list[Candidate] | None:
        with self._lock:
            now = clock()
            live = [c for c, expiry in self._candidates.get(name, {}).values() if expiry > now]
            return sorted(live, key=lambda candidate: candidate.seq)

    def watch(self, name: str, callback: Callable[[], None], *, identity: str | None = None) -> Any:
        """In-process wake-ups: :meth:`wake` calls the callbacks (in the caller's thread)."""
        keys = [(name, identity)]
        with self._lock:
            for key in keys:
                self._watches.setdefault(key, []).append(callback)
        store = self

        class _Watch:
            live = True

            def close(self) -> None:
                with store._lock:
                    for key in keys:
                        callbacks = store._watches.get(key, [])
                        if callback in callbacks:
                            callbacks.remove(callback)
                self.live = False

        return _Watch()

    def wake(self, name: str, identity: str | None = None) -> None:
        with self._lock:
            callbacks = list(self._watches.get((name, identity), []))
        for callback in callbacks:
            callback()

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        with self._lock:
            self._handovers[name] = (to, clock() + window)
            current = self._current(name)
            self.events.append(("handover", name, current.holder if current else "", 0))
            return None if current is None else self._lease(name, current)

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        with self._lock:
            self.events.append((kind, lease.name, lease.holder, lease.token))

    @contextmanager
    def fenced(self, lease: Lease, using: str | None = None) -> Iterator[None]:
        """Checks the lease like the database backend does; the writes are one transaction
        of database ``using`` when one is named, else not transactional."""
        from django.db import transaction

        from ..exceptions import LeadershipLost

        lease.check()
        with self._lock:
            current = self._current(lease.name)
            if current is None or (current.holder, current.token) != (lease.holder, lease.token):
                raise LeadershipLost(f"lease {lease.name!r} is no longer held")
        if using is None:
            yield
            return
        with transaction.atomic(using=using):
            yield
