"""Candidates in ZooKeeper (fifo and priority elections): one ephemeral sequential znode
each under ``names/N/queue``, its sequence the join order, its ``mtime`` its last
heartbeat."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from ...election import Candidate, Mode
from .clock import EnsembleClock
from .layout import candidate_prefix, place_in, to_ms, to_time


class Candidacies(EnsembleClock):
    """announce, withdraw and candidates of :class:`~.backend.ZooKeeperBackend`."""

    def _queue(self, client: Any, name: str) -> list[str]:
        """The candidate node names of ``name`` in join order."""
        return self._queue_listed(client.get_children_async(self._queue_path(name)))

    def _queue_listed(self, result: Any) -> list[str]:
        """The candidate node names a queue's listing (sent) answered, in join order; none
        if the queue does not exist."""
        from kazoo.exceptions import NoNodeError

        try:
            children = self._wait(result)
        except NoNodeError:
            return []
        return sorted(children, key=lambda child: child.rsplit("-", 1)[-1])  # by sequence

    def _my_node(self, client: Any, name: str, identity: str) -> str | None:
        """The node name of ``identity``'s candidacy for ``name`` (None if it has none)."""
        queue = self._queue(client, name)
        mine = place_in(queue, identity)
        return None if mine is None else queue[mine]

    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.client
        info = {
            "identity": candidate.identity,
            "priority": candidate.priority,
            "host": candidate.host,
            "pid": candidate.pid,
            "version": candidate.version,
            "ttl": to_ms(ttl),
        }
        raw = json.dumps(info).encode()
        key = (name, candidate.identity)
        node = self._mine.get(key) or self._my_node(client, name, candidate.identity)
        if node is not None:
            try:
                stat = self._wait(client.set_async(f"{self._queue_path(name)}/{node}", raw))
            except NoNodeError:
                node = None  # its session ended or it expired: join again, at the tail
            else:
                self._seen(stat.mtime)
                self._mine[key] = node
                return
        created = self._wait(
            client.create_async(
                f"{self._queue_path(name)}/{candidate_prefix(candidate.identity)}",
                raw,
                ephemeral=True,
                sequence=True,
                makepath=True,
            )
        )
        self._mine[key] = created.rsplit("/", 1)[-1]
        hub = self._hub
        if hub is not None:
            hub.rearm(name, candidate.identity)

    def withdraw(self, name: str, identity: str) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.client
        node = self._mine.pop((name, identity), None) or self._my_node(client, name, identity)
        if node is None:
            return
        with suppress(NoNodeError):
            self._wait(client.delete_async(f"{self._queue_path(name)}/{node}"))

    def candidates(self, name: str) -> list[Candidate] | None:
        return self.candidates_many([name])[0]

    def candidates_many(self, names: Sequence[str]) -> list[list[Candidate] | None]:
        """Every name's queue listed, then every candidate's data read, each round sent
        before any answer is awaited."""
        client = self.client
        listed = [client.get_children_async(self._queue_path(name)) for name in names]
        queues = [self._queue_listed(result) for result in listed]
        sent = [
            [(node, client.get_async(f"{self._queue_path(name)}/{node}")) for node in nodes]
            for name, nodes in zip(names, queues, strict=True)
        ]
        found: list[list[Candidate] | None] = []
        for name, results in zip(names, sent, strict=True):
            live = (self._live(name, node, result) for node, result in results)
            found.append([candidate for candidate in live if candidate is not None])
        return found

    def next_in_line(
        self, name: str, mode: Mode | str, *, holder: str | None = None
    ) -> Candidate | None:
        """In join order (``race``, ``fifo``): the queue's children, then the first live
        one's data, the holder's skipped by its name: two requests whatever the queue's
        length (one more for each dead candidate found first). ``priority`` reads every
        candidate's data."""
        if Mode(mode) is Mode.PRIORITY:
            return super().next_in_line(name, mode, holder=holder)
        client = self.client
        skip = candidate_prefix(holder) if holder else None
        for node in self._queue(client, name):
            if skip is not None and node.startswith(skip):
                continue
            found = self._live(name, node, client.get_async(f"{self._queue_path(name)}/{node}"))
            if found is not None and found.identity != holder:
                return found
        return None

    def queued_ahead(self, name: str, identity: str) -> int | None:
        """The queue's children (one request, no candidate's data read): how many joined
        before ``identity``'s node, or all of them if it has none."""
        queue = self._queue(self.client, name)
        mine = place_in(queue, identity)
        return len(queue) if mine is None else mine

    def _live(self, name: str, node: str, result: Any) -> Candidate | None:
        """The candidate of ``node`` from its data (``result``: a pending get), or None if
        it is gone; one whose heartbeat has run out is deleted on the way."""
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._wait(result)
        except NoNodeError:
            return None
        info = json.loads(raw)
        expires = int(stat.mtime) + int(info.get("ttl", 0))
        if self._passed(expires)[0]:
            self.client.delete_async(f"{self._queue_path(name)}/{node}", stat.version)
            return None
        return Candidate(
            identity=str(info["identity"]),
            priority=int(info.get("priority", 0)),
            host=str(info.get("host", "")),
            pid=int(info.get("pid", 0)),
            version=str(info.get("version", "")),
            seq=int(node.rsplit("-", 1)[-1]),
            joined_at=to_time(stat.ctime),
            seen_at=to_time(stat.mtime),
            expires_at=to_time(expires),
        )
