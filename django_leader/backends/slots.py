"""Beat slot records: the contract types, and the store every backend can give.

One record per (beat lease, schedule entry): the slot (the entry's ``last_run_at`` once the
slot was taken), the fencing token and holder that took it, the task id it was sent with,
and whether the broker got it. The elected beat (``LeaderScheduler``) writes a record
**before** it sends the slot, and the write is fenced by its lease, so a beat that lost its
lease (and does not know it yet) can never write over its successor's records. A newly
elected beat reads the records to continue exactly where the previous leader stopped.

Each backend gives its :class:`SlotStore` with :meth:`Backend.slots()
<django_leader.backends.base.Backend.slots>`:

* the database backend: the ``BeatSlot`` table, written inside the lease's fenced
  transaction (``backends/db/slots.py``);
* the Redis backend: a hash next to the lease's keys, written by a Lua script that first
  checks the lease (``backends/redis/slots.py``);
* any other backend, by default: :class:`LocalSlots`, records kept in this process only
  (not shared): a failover then relies on the wrapped scheduler's own state, and may send
  the last slot again.

Slot times are recorded **in the store's clock** (see :meth:`SlotStore.now`), so the beats'
clocks never meet — one beat's skew can neither delay nor repeat a slot of the next one. A
process sees that clock through a :class:`StoreClock`: read from the store, and carried
forward between two reads on the boot clock (``django_leader.lease.clock()``), which no
step of the wall clock moves.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from django.utils.dateparse import parse_datetime

from ..lease import Lease, clock

#: Seconds a :class:`StoreClock` carries the store's time forward on this process's boot clock
#: before it reads the store again (a step of the store's own clock is seen within that).
RESYNC_AFTER = 30.0

#: Longest entry name stored as it is (the width of ``BeatSlot.entry``).
MAX_ENTRY_LENGTH = 200


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


class StoreClock:
    """The store's clock as this process sees it: read with :meth:`SlotStore.now`, and
    carried forward between two reads on ``django_leader.lease.clock()`` (the boot clock,
    which no wall-clock step moves). A step of this process's wall clock changes nothing
    here; a step of the store's clock is seen at the next read, at most ``resync_after``
    seconds later.

    A reading counts from the moment its answer arrived, so between two reads the estimate
    lags the store by up to one round trip (plus the drift of the two clocks' rates) and
    is never ahead of it, unless the store's clock was stepped back meanwhile.
    """

    def __init__(self, slots: SlotStore, resync_after: float = RESYNC_AFTER) -> None:
        self.slots = slots
        self.resync_after = resync_after
        self._anchor: tuple[datetime, float] | None = None  # (the store's time, clock())

    def sync(self) -> datetime:
        """Read the store's clock now (``BackendUnavailable`` if it cannot be read)."""
        store_now = self.slots.now()
        self._anchor = (store_now, clock())
        return store_now

    def now(self) -> datetime:
        """The store's time now: carried forward from the last read, or read again when
        that is ``resync_after`` seconds old (or there is none)."""
        anchor = self._anchor
        if anchor is None or clock() - anchor[1] >= self.resync_after:
            return self.sync()
        store_then, read_at = anchor
        return store_then + timedelta(seconds=clock() - read_at)

    def offset(self) -> timedelta:
        """The store's clock minus this process's wall clock, now: what converts a time of
        one into the other (a step of the wall clock changes it at once)."""
        return self.now() - datetime.now(timezone.utc)
