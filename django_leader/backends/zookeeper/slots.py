"""The ZooKeeper backend's beat slot records: one znode per schedule entry under the lease's.

``<ROOT>/names/<name>/beat/<entry digest>`` holds the entry's last slot (JSON). A claim is a
``multi`` that first **checks the version of the lease znode** this holder last wrote (the
acquisition or its latest renewal): once a successor has deleted that znode to take the
name, or anyone has changed it, the check fails and nothing is written.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime

from ...exceptions import BackendUnavailable, LeadershipLost
from ...lease import Lease
from ..slots import Slot, SlotStore
from .leases import Leases

logger = logging.getLogger("django_leader.celery")


class ZooKeeperSlots(SlotStore):
    """One znode per entry beside the lease znode, written only while the lease znode is
    still this holder's (a ``multi`` with a version check)."""

    def __init__(self, backend: Leases) -> None:
        self.backend = backend

    def _dir(self, name: str) -> str:
        return f"{self.backend._name_path(name)}/beat"

    def _path(self, name: str, entry: str) -> str:
        return f"{self._dir(name)}/{hashlib.sha256(entry.encode()).hexdigest()[:32]}"

    def load(self, lease: Lease) -> dict[str, Slot]:
        from kazoo.exceptions import NoNodeError

        backend, client = self.backend, self.backend.client
        try:
            children = backend._wait(client.get_children_async(self._dir(lease.name)))
        except NoNodeError:
            return {}
        results = [client.get_async(f"{self._dir(lease.name)}/{child}") for child in children]
        slots = {}
        for result in results:
            try:
                raw, _ = backend._wait(result)
            except NoNodeError:
                continue
            try:
                slot = Slot.from_json(raw)
            except (ValueError, TypeError, KeyError):
                logger.warning("ignoring an unreadable beat slot record %r", raw)
                continue
            slots[slot.entry] = slot
        return slots

    def claim(self, lease: Lease, slot: Slot) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError

        lease.check()
        backend, client = self.backend, self.backend.client
        backend._ensure(client, self._dir(lease.name))
        path = self._path(lease.name, slot.entry)
        exists = True
        for _ in range(5):
            found = backend._held(client, lease)
            if found is None:
                raise LeadershipLost(
                    f"lease {lease.name!r} is no longer held by {lease.holder} with token "
                    f"{lease.token}"
                )
            held = found[0]
            transaction = client.transaction()
            # The record's version first: a later grant's lease znode may have ours.
            transaction.check(backend._name_path(lease.name), held.record_version)
            transaction.check(backend._lease_path(lease.name), held.version)
            if exists:
                transaction.set_data(path, slot.as_json().encode())
            else:
                transaction.create(path, slot.as_json().encode())
            record_check, lease_check, write = backend._wait(transaction.commit_async())
            if not any(isinstance(r, Exception) for r in (record_check, lease_check, write)):
                return
            if any(
                isinstance(r, Exception) and not isinstance(r, RolledBackError)
                for r in (record_check, lease_check)
            ):
                # The lease znode changed: our own renewal (look again) or a successor.
                backend._versions.pop((lease.name, lease.holder, lease.token), None)
            elif isinstance(write, NoNodeError | NodeExistsError):
                if isinstance(write, NoNodeError) and not exists:  # the directory went
                    backend._made.discard(self._dir(lease.name))
                    backend._ensure(client, self._dir(lease.name))
                exists = isinstance(write, NodeExistsError)
            else:
                raise BackendUnavailable(f"zookeeper: slot record of {lease.name!r}: {write!r}")
        raise BackendUnavailable(f"zookeeper: slot record of {lease.name!r} kept conflicting")

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        backend, client = self.backend, self.backend.client
        path = self._path(lease.name, slot.entry)
        try:
            raw, stat = backend._wait(client.get_async(path))
        except NoNodeError:
            return False
        if Slot.from_json(raw) != slot:
            return False
        sent = Slot(slot.entry, slot.at, slot.token, slot.holder, slot.task_id, True)
        try:
            backend._wait(client.set_async(path, sent.as_json().encode(), stat.version))
        except (BadVersionError, NoNodeError):
            return False
        return True

    def now(self) -> datetime:
        return self.backend.now()
