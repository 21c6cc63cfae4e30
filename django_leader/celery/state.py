"""The shared record of the last slot ``LeaderScheduler`` sent for each schedule entry.

One record per (beat lease, schedule entry): the slot (the entry's ``last_run_at`` once the
slot was taken), the fencing token and holder that took it, the task id it was sent with,
and whether the broker got it. The elected beat writes a record **before** it sends the
slot, and the write is fenced by its lease, so a beat that lost its lease (and does not know
it yet) can never write over its successor's records. A newly elected beat reads the records
to continue exactly where the previous leader stopped.

* Database backend: the ``BeatSlot`` table, written inside ``lease.fenced()`` (one
  transaction that first locks the lease row and checks holder, token and expiry by the
  database's clock).
* Redis (cache backend): a hash next to the lease's keys (same hash tag), written by a Lua
  script that first checks that the lease key still names this holder and token (an expired
  lease key is gone: Redis's clock decides).
* Any other backend: records kept in this process only (not shared): a failover then
  relies on the wrapped scheduler's own state, and may send the last slot again.

Slot times are recorded **in the store's clock** (see :meth:`SlotStore.now`): a beat
measures how far its own clock is from the store's when its term begins and converts each
way, so the beats' clocks never meet — one beat's skew can neither delay nor repeat a slot
of the next one.

The database slot store works on the beat thread's own Django connection (``fenced()``
needs it). That connection is never recycled by a request cycle, so a connection the server
closed (a restart, a failover, a proxy, ``wait_timeout``) would fail every call after it:
before each call, a connection that had an error and no longer works is closed (as Django's
``close_if_unusable_or_obsolete`` does, a healthy one is kept), and a call that failed on
such a connection is made once more on a new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from django.db import DatabaseError, connections
from django.db.utils import Error as DjangoDBError
from django.utils.dateparse import parse_datetime

from ..backends.base import Backend
from ..exceptions import BackendUnavailable, LeadershipLost
from ..lease import Lease

logger = logging.getLogger("django_leader.celery")

#: Longest entry name stored as it is (the width of ``BeatSlot.entry``).
MAX_ENTRY_LENGTH = 200

T = TypeVar("T")


def close_if_unusable(alias: str) -> bool:
    """Close this thread's Django connection to ``alias`` if an error left it unusable;
    True if it did. A connection without errors since its last check is not even tested,
    and a working one is kept (unlike ``close_if_unusable_or_obsolete``, which also closes
    connections past ``CONN_MAX_AGE`` — 0 by default, so every time). Never inside a
    transaction: ``atomic`` deals with its own connection."""
    connection = connections[alias]
    if connection.connection is None or connection.in_atomic_block:
        return False
    if connection.get_autocommit() == connection.settings_dict["AUTOCOMMIT"]:
        if not connection.errors_occurred:
            return False
        if connection.is_usable():
            connection.errors_occurred = False
            return False
    with suppress(DjangoDBError):
        connection.close()
    connection.connection = None  # (close() keeps it if closing raised)
    return True


def close_unusable_connections() -> None:
    """:func:`close_if_unusable` for each connection this thread has opened."""
    for connection in connections.all(initialized_only=True):
        close_if_unusable(connection.alias)


def entry_key(name: str) -> str:
    """How an entry name is stored: as it is, or shortened with a hash if too long."""
    if len(name) <= MAX_ENTRY_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: MAX_ENTRY_LENGTH - 17]}#{digest}"


@dataclass(frozen=True)
class Slot:
    """One slot of one schedule entry, taken by the holder of lease ``token``."""

    entry: str
    at: datetime  # aware
    token: int
    holder: str
    task_id: str
    sent: bool = False

    def as_json(self) -> str:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Slot:
        data = json.loads(text)
        at = parse_datetime(data["at"])
        if at is None:
            raise ValueError(f"bad slot time {data['at']!r}")
        data["at"] = at
        return cls(**data)


class SlotStore(ABC):
    """Where the slots live. Every method raises ``BackendUnavailable`` if the store
    cannot be reached."""

    #: Whether other beats see the records (False: this process only).
    shared = True

    @abstractmethod
    def load(self, lease: Lease) -> dict[str, Slot]:
        """Every entry's last slot under the beat lease ``lease.name``, by entry key."""

    @abstractmethod
    def claim(self, lease: Lease, slot: Slot) -> None:
        """Record ``slot`` as the entry's last, if ``lease`` is still held with its token
        (by the store's clock); else raise ``LeadershipLost`` and record nothing."""

    @abstractmethod
    def confirm(self, lease: Lease, slot: Slot) -> bool:
        """Mark ``slot`` sent, if it is still the entry's record (not fenced: the slot was
        taken under the lease, and this only says it left)."""

    @abstractmethod
    def now(self) -> datetime:
        """The store's clock (aware, UTC): slot times are recorded in it."""


class DatabaseSlots(SlotStore):
    """``BeatSlot`` rows in the lease database, written inside ``lease.fenced()``, on this
    thread's Django connection (replaced when the server closed it, see the module)."""

    def __init__(self, alias: str, now_sql: str) -> None:
        self.alias = alias
        self.now_sql = now_sql  # the database server's clock, e.g. statement_timestamp()

    def _rows(self) -> Any:
        from ..models import BeatSlot

        return BeatSlot.objects.using(self.alias)

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``; once more on a new connection if it failed on one the server closed.
        Database errors become ``BackendUnavailable``."""
        retried = False
        while True:
            close_if_unusable(self.alias)
            connection = connections[self.alias]
            used = connection.connection
            try:
                return fn()
            except DatabaseError as exc:
                # An open connection that this failure showed dead — closed, or already
                # replaced, by the failed transaction's rollback, or found unusable now:
                # once more, on a new one.
                died = used is not None and (
                    connection.connection is not used or close_if_unusable(self.alias)
                )
                if not retried and died:
                    retried = True
                    logger.info(
                        "database %r closed the beat's connection: reconnecting",
                        self.alias,
                    )
                    continue
                raise BackendUnavailable(f"database {self.alias!r}: {exc}") from exc

    def load(self, lease: Lease) -> dict[str, Slot]:
        def load() -> dict[str, Slot]:
            return {
                row.entry: Slot(row.entry, row.at, row.token, row.holder, row.task_id, row.sent)
                for row in self._rows().filter(lease=lease.name)
            }

        return self._call(load)

    def claim(self, lease: Lease, slot: Slot) -> None:
        def claim() -> None:
            with lease.fenced():
                self._rows().update_or_create(
                    lease=lease.name,
                    entry=slot.entry,
                    defaults={
                        "at": slot.at,
                        "token": slot.token,
                        "holder": slot.holder,
                        "task_id": slot.task_id,
                        "sent": False,
                    },
                )

        self._call(claim)

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        def confirm() -> int:
            return int(
                self._rows()
                .filter(lease=lease.name, entry=slot.entry, token=slot.token, task_id=slot.task_id)
                .update(sent=True)
            )

        return self._call(confirm) == 1

    def now(self) -> datetime:
        def now() -> Any:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(f"SELECT {self.now_sql}", [])  # (params: "%%" is "%")
                return cursor.fetchone()[0]

        value = self._call(now)
        if isinstance(value, str):
            value = parse_datetime(value)
        if not isinstance(value, datetime):
            raise BackendUnavailable(f"database {self.alias!r}: no time from {self.now_sql}")
        if value.tzinfo is None:  # MySQL and SQLite give naive UTC
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


# KEYS: lease, slots. ARGV: holder, token, entry, record. 1 if written, 0 if the lease is
# not (or no longer) held by this holder with this token.
_CLAIM = """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return 1
"""

# KEYS: slots. ARGV: entry, expected record, new record. Compare and set.
_CONFIRM = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


class RedisSlots(SlotStore):
    """A hash ``…:django_leader:{<lease>}:beat`` beside the lease's keys (one Cluster slot),
    written by a Lua script that checks the lease first."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.client = backend.client
        self._claim = self.client.register_script(_CLAIM)
        self._confirm = self.client.register_script(_CONFIRM)

    def keys(self, name: str) -> list[str]:
        lease_key = self.backend.keys(name)[0]
        base, _, part = lease_key.rpartition(":")
        assert part == "lease", lease_key
        return [lease_key, f"{base}:beat"]

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.backend.alias!r}: {exc}") from exc

    def load(self, lease: Lease) -> dict[str, Slot]:
        raw = self._call(self.client.hgetall, self.keys(lease.name)[1])
        slots = {}
        for field, value in raw.items():
            try:
                slot = Slot.from_json(value)
            except (ValueError, TypeError, KeyError):
                logger.warning("ignoring an unreadable beat slot record %r: %r", field, value)
                continue
            slots[slot.entry] = slot
        return slots

    def claim(self, lease: Lease, slot: Slot) -> None:
        lease.check()
        written = self._call(
            self._claim,
            keys=self.keys(lease.name),
            args=[lease.holder, str(lease.token), slot.entry, slot.as_json()],
        )
        if not int(written):
            raise LeadershipLost(
                f"lease {lease.name!r} is no longer held by {lease.holder} with token {lease.token}"
            )

    def now(self) -> datetime:
        seconds, microseconds = self._call(self.client.time)
        return datetime.fromtimestamp(int(seconds), timezone.utc).replace(
            microsecond=int(microseconds)
        )

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        sent = Slot(slot.entry, slot.at, slot.token, slot.holder, slot.task_id, True)
        done = self._call(
            self._confirm,
            keys=[self.keys(lease.name)[1]],
            args=[slot.entry, slot.as_json(), sent.as_json()],
        )
        return bool(int(done))


class LocalSlots(SlotStore):
    """Records in this process only: for a backend that can fence nothing else."""

    shared = False

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str], Slot] = {}

    def load(self, lease: Lease) -> dict[str, Slot]:
        return {entry: slot for (name, entry), slot in self._slots.items() if name == lease.name}

    def claim(self, lease: Lease, slot: Slot) -> None:
        lease.check()
        self._slots[(lease.name, slot.entry)] = slot

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        if self._slots.get((lease.name, slot.entry)) != slot:
            return False
        self._slots[(lease.name, slot.entry)] = Slot(
            slot.entry, slot.at, slot.token, slot.holder, slot.task_id, True
        )
        return True

    def now(self) -> datetime:
        return datetime.now(timezone.utc)  # nothing is shared: this process's clock it is


def slot_store(backend: Backend) -> SlotStore:
    """The slot store that goes with a lease backend (see the module docstring)."""
    from ..backends.cache import CacheBackend
    from ..backends.db import DatabaseBackend

    if isinstance(backend, DatabaseBackend):
        return DatabaseSlots(backend.alias, backend.dialect.now())
    if isinstance(backend, CacheBackend):
        return RedisSlots(backend)
    logger.warning(
        "%r cannot fence the beat's shared slot records: they are kept in this process only, "
        "and a failover may send an entry's last slot again",
        backend,
    )
    return LocalSlots()
