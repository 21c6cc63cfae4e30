"""The gate of a scheduler run on the leader only (APScheduler, huey, RQ): what lets one
scheduled run go.

A run goes only if this process holds the lease now, and only for scheduled times that no
leader ran before: before it goes, its time is recorded as the entry's last slot in the lease
store, written under the lease's fencing token (the records of ``LeaderScheduler``, see
``django_leader.backends.slots``). A deposed leader cannot write over its successor's
records, and a new leader reads them to skip what its predecessor ran. A store that keeps no
records (a custom backend) keeps them in the process only.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from .backends.slots import Slot, SlotStore, entry_key
from .exceptions import BackendUnavailable, LeadershipLost
from .lease import Lease

logger = logging.getLogger("django_leader")


class SlotGate:
    """What lets a scheduled run go: the lease held now, and its time not run before.

    ``what`` names the runs in the log ("job", "periodic task")."""

    def __init__(self, slots: SlotStore, what: str, log: logging.Logger = logger) -> None:
        self.slots = slots
        self.what = what
        self.log = log
        self.lease: Lease | None = None
        self._records: dict[str, Slot] | None = None  # the term's, loaded on first use
        self._lock = threading.Lock()

    def open(self, lease: Lease) -> None:
        """Let runs go under ``lease`` (this process was elected)."""
        with self._lock:
            self.lease, self._records = lease, None

    def close(self) -> None:
        """Let nothing go (the term ended)."""
        with self._lock:
            self.lease, self._records = None, None

    @property
    def leads(self) -> bool:
        """Whether this process holds the lease now."""
        lease = self.lease
        return lease is not None and lease.held

    def last(self, key: str) -> datetime | None:
        """The time last recorded for ``key`` by any leader; None if none is, if this
        process does not lead, or if the store did not answer (:meth:`take` still refuses
        a time recorded before)."""
        with self._lock:
            lease = self.lease
            if lease is None or not lease.held:
                return None
            try:
                slot = self._records_of(lease).get(entry_key(key))
            except (BackendUnavailable, LeadershipLost) as exc:
                self.log.warning("the slots of %r could not be read: %s", lease.name, exc)
                return None
            return None if slot is None else slot.at

    def take(self, key: str, times: list[datetime]) -> tuple[Lease, list[datetime]] | None:
        """The lease and the times of ``times`` (aware, in order) that no leader ran yet,
        the last of them recorded as ``key``'s slot under the lease; None if nothing is to
        run (not the leader, all run before, or the record could not be written: a run
        that may be recorded is not run, so that it runs at most once)."""
        with self._lock:
            lease = self.lease
            if lease is None or not lease.held:
                self.log.info("%s %r not run: this process does not lead", self.what, key)
                return None
            entry = entry_key(key)
            try:
                records = self._records_of(lease)
                last = records.get(entry)
                fresh = [at for at in times if last is None or utc(at) > last.at]
                if not fresh:
                    self.log.info(
                        "%s %r at %s not run: run by a leader before", self.what, key, times
                    )
                    return None
                slot = Slot(entry, utc(fresh[-1]), lease.token, lease.holder, key)
                self.slots.claim(lease, slot)
            except LeadershipLost as exc:
                self.log.warning("%s %r not run: %s", self.what, key, exc)
                return None
            except BackendUnavailable as exc:  # perhaps recorded: run at most once
                self._records = None
                self.log.warning(
                    "%s %r not run: its slot could not be recorded: %s", self.what, key, exc
                )
                return None
            records[entry] = slot
            return lease, fresh

    def _records_of(self, lease: Lease) -> dict[str, Slot]:
        """The term's slot records, read from the store on first use (under ``_lock``)."""
        if self._records is None:
            self._records = self.slots.load(lease)
        return self._records


def utc(at: datetime) -> datetime:
    """``at`` (aware) in UTC."""
    return at.astimezone(timezone.utc)
