"""A toy lease store: a JSON file for the processes of one machine
(docs/howto/write-a-backend.md)."""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from django_leader.backends.base import Backend
from django_leader.lease import Lease


class FileBackend(Backend):
    """Leases in one JSON file; ``flock`` makes each operation atomic."""

    def __init__(self, path: str) -> None:
        self.path = path

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The file's content, locked; what the block leaves in it is written back."""
        with open(self.path, "a+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.seek(0)
            text = file.read()
            state = json.loads(text) if text else {"leases": {}}
            yield state
            file.seek(0)
            file.truncate()
            json.dump(state, file)
            file.flush()

    @staticmethod
    def _now(state: dict[str, Any]) -> datetime:
        with open("/proc/stat") as stat:
            booted = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
        seconds = booted + time.clock_gettime(time.CLOCK_BOOTTIME)
        return datetime.fromtimestamp(seconds, timezone.utc)

    @staticmethod
    def _lease(name: str, record: dict[str, Any], now: datetime | None = None) -> Lease:
        return Lease(
            name=name,
            holder=record["holder"],
            token=record["token"],
            acquired_at=datetime.fromisoformat(record["acquired_at"]),
            renewed_at=datetime.fromisoformat(record["renewed_at"]),
            expires_at=datetime.fromisoformat(record["expires_at"]),
            transitions=record["transitions"],
            read_at=now,
        )

    @staticmethod
    def _held(record: dict[str, Any] | None, now: datetime) -> bool:
        """Someone holds it: a holder, and the term not over by the store's clock."""
        return bool(
            record and record["holder"] and datetime.fromisoformat(record["expires_at"]) > now
        )

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        with self._state() as state:
            now = self._now(state)
            record = state["leases"].get(name)
            if record and datetime.fromisoformat(record["expires_at"]) > now:
                current = self._lease(name, record) if record["holder"] else None
                return None, current
            record = {
                "holder": holder,
                "token": (record["token"] if record else 0) + 1,
                "transitions": (record["transitions"] if record else 0) + 1,
                "acquired_at": now.isoformat(),
                "renewed_at": now.isoformat(),
                "expires_at": (now + timedelta(seconds=ttl)).isoformat(),
            }
            state["leases"][name] = record
            lease = self._lease(name, record)
            return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        with self._state() as state:
            now = self._now(state)
            record = state["leases"].get(lease.name)
            if not self._held(record, now) or (record["holder"], record["token"]) != (
                lease.holder,
                lease.token,
            ):
                return None
            record["renewed_at"] = now.isoformat()
            record["expires_at"] = (now + timedelta(seconds=ttl)).isoformat()
            return self._lease(lease.name, record)

    def release(self, lease: Lease) -> bool:
        with self._state() as state:
            now = self._now(state)
            record = state["leases"].get(lease.name)
            if not self._held(record, now) or (record["holder"], record["token"]) != (
                lease.holder,
                lease.token,
            ):
                return False
            record["holder"] = ""
            record["expires_at"] = now.isoformat()  # free at once
            return True

    def read(self, name: str) -> Lease | None:
        with self._state() as state:
            now = self._now(state)
            record = state["leases"].get(name)
            return self._lease(name, record, now) if self._held(record, now) else None

    def names(self) -> list[str]:
        with self._state() as state:
            return sorted(state["leases"])

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        with self._state() as state:
            now = self._now(state)
            record = state["leases"].get(name)
            if not self._held(record, now):
                return None
            released = self._lease(name, record)
            record["holder"] = ""  # expires_at stays: the holder's term runs out first
            return released

    def now(self) -> datetime:
        with self._state() as state:
            return self._now(state)
