"""Retention in ZooKeeper: the records of names nobody has used for a while, deleted
(:meth:`ZooKeeperBackend.prune`, run by ``manage.py leader prune``).

A name's record keeps its token counter. Deleted, the name is new again: taken again, its
tokens continue from the ensemble's clock in microseconds (leases.py), beyond every token
it had (each was at most the clock at its issue plus the acquisitions within the same
millisecond), so they never go backwards.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .leases import Leases


class Retention(Leases):
    """:meth:`prune` of :class:`~django_leader.backends.zookeeper.ZooKeeperBackend`."""

    def prune(self, unused_for: timedelta, *, batch: int = 500) -> int:
        """Delete the record (with its bells) of every name that has no lease node and no
        candidate, whose record was last written ``unused_for`` ago by the ensemble's clock
        and whose fences and hand-over gate ended by then: the record's deletion is
        conditional on the version read, so a name taken meanwhile is kept."""
        from kazoo.exceptions import NoNodeError

        cutoff = self._now_ms() - round(unused_for.total_seconds() * 1000)
        client = self.client
        try:
            children = self._wait(client.get_children_async(f"{self.root}/names"))
        except NoNodeError:
            return 0
        forgotten = 0
        for start in range(0, len(children), batch):
            chunk = children[start : start + batch]
            paths = [f"{self.root}/names/{child}" for child in chunk]
            records = [client.get_async(path) for path in paths]
            kids = [client.get_children_async(path) for path in paths]
            for path, record, under in zip(paths, records, kids, strict=True):
                found = self._read_result(record)
                if found is None or not self._unused(found, cutoff):
                    continue
                try:
                    if self._forget(path, set(self._wait(under)), found[1].version, cutoff):
                        forgotten += 1
                except NoNodeError:
                    continue
        return forgotten

    @staticmethod
    def _unused(found: tuple[dict[str, Any], Any], cutoff: int) -> bool:
        record, stat = found
        ends = [int(record.get(key) or 0) for key in ("fence", "handover_until")]
        return int(stat.mtime) < cutoff and max(ends) < cutoff

    def _forget(self, path: str, under: set[str], version: int, cutoff: int) -> bool:
        """Delete the name at ``path`` (children ``under``) if it has no candidate and no
        lease node but one that expired before ``cutoff``: its bells first, then its lease
        node, queue and record, in one transaction conditional on the versions read. True
        if deleted."""
        client = self.client
        lease = None
        if "lease" in under:
            lease = self._read_result(client.get_async(f"{path}/lease"))
            if lease is not None and self._expiry(*lease) >= cutoff:
                return False
        if "queue" in under and self._wait(client.get_children_async(f"{path}/queue")):
            return False
        if "bells" in under:
            for bell in self._wait(client.get_children_async(f"{path}/bells")):
                self._wait(client.delete_async(f"{path}/bells/{bell}"))
        transaction = client.transaction()
        transaction.check(path, version)
        if lease is not None:
            transaction.delete(f"{path}/lease", version=lease[1].version)
        for child in ("bells", "queue"):
            if child in under:
                transaction.delete(f"{path}/{child}")
        transaction.delete(path)
        results = self._wait(transaction.commit_async())
        return not any(isinstance(result, Exception) for result in results)
