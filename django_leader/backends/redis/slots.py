"""The Redis backend's beat slot records: a hash beside the lease's keys.

``…:django_leader:{<lease>}:beat`` (same hash tag as the lease, so one Cluster slot), written
by a Lua script that first checks that the lease key still names this holder and token (an
expired lease key is gone: Redis's clock decides).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django_leader.backends.redis.store import RedisStore, errors
from django_leader.backends.slots import Slot, SlotStore
from django_leader.exceptions import LeadershipLost
from django_leader.lease import Lease

logger = logging.getLogger("django_leader.celery")

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

    def __init__(self, backend: RedisStore) -> None:
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
        try:
            return fn(*args, **kwargs)
        except errors() as exc:
            raise self.backend.unavailable(exc) from exc

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
        # Durable: a claim a failover lost would let the next leader send the slot again.
        written = self.backend.pipelined(
            self._claim,
            [[2, *self.keys(lease.name), lease.holder, str(lease.token), slot.entry,
              slot.as_json()]],
            durable=True,
        )[0]  # fmt: skip
        if not int(written):
            raise LeadershipLost(
                f"lease {lease.name!r} is no longer held by {lease.holder} with token {lease.token}"
            )

    def now(self) -> datetime:
        return self.backend.now()

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        sent = Slot(slot.entry, slot.at, slot.token, slot.holder, slot.task_id, True)
        done = self._call(
            self._confirm,
            keys=[self.keys(lease.name)[1]],
            args=[slot.entry, slot.as_json(), sent.as_json()],
        )
        return bool(int(done))
