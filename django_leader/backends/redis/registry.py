"""The Redis backend's registry of candidates: a sorted set per name of the Electors
campaigning for it, for ``manage.py leader status`` and the queue of fifo and priority
elections."""

from __future__ import annotations

import json
from collections.abc import Sequence

from django_leader.backends.redis.store import RedisStore, text, to_ms, to_time
from django_leader.election import Candidate, Mode


class Registry(RedisStore):
    """:meth:`announce`, :meth:`withdraw` and :meth:`candidates` of
    :class:`~django_leader.backends.redis.RedisBackend`."""

    _REGISTRY = ("candidates", "cinfo", "cseq", "corder")

    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        info = json.dumps(
            {
                "priority": candidate.priority,
                "host": candidate.host,
                "pid": candidate.pid,
                "version": candidate.version,
            }
        )
        self._call(self._announce, name, candidate.identity, to_ms(ttl), info, parts=self._REGISTRY)

    def withdraw(self, name: str, identity: str) -> None:
        self._call(self._announce, name, identity, "", "{}", parts=self._REGISTRY)

    def candidates(self, name: str) -> list[Candidate] | None:
        return _registry(self._call(self._candidates, name, parts=self._REGISTRY[:2]))

    def candidates_many(self, names: Sequence[str]) -> list[list[Candidate] | None]:
        """One pipeline per 1,000 names (:meth:`candidates`' script each)."""
        replies = self._call_each(self._candidates, names, parts=self._REGISTRY[:2])
        return [_registry(reply) for reply in replies]

    def next_in_line(
        self, name: str, mode: Mode | str, *, holder: str | None = None
    ) -> Candidate | None:
        """In join order (``race``, ``fifo``): the head of the queue's sorted set, a few
        commands whatever its length. ``priority`` reads the whole registry."""
        if Mode(mode) is Mode.PRIORITY:
            return super().next_in_line(name, mode, holder=holder)
        reply = self._call(self._next_in_line, name, holder or "", parts=self._REGISTRY)
        return _candidate(*reply) if reply else None


def _registry(reply: list[bytes | str]) -> list[Candidate]:
    """The candidates a registry read answered (identity, info pairs), in join order."""
    pairs = zip(reply[::2], reply[1::2], strict=True)
    return sorted((_candidate(identity, raw) for identity, raw in pairs), key=lambda c: c.seq)


def _candidate(identity: bytes | str, raw: bytes | str) -> Candidate:
    """A candidate from its identity and the JSON the registry keeps of it."""
    info = json.loads(text(raw))
    return Candidate(
        identity=text(identity),
        priority=int(info.get("priority", 0)),
        host=str(info.get("host", "")),
        pid=int(info.get("pid", 0)),
        version=str(info.get("version", "")),
        seq=int(info.get("seq", 0)),
        joined_at=to_time(info["joined"]) if info.get("joined") else None,
        seen_at=to_time(info["seen"]) if info.get("seen") else None,
        expires_at=to_time(info["expires"]) if info.get("expires") else None,
    )
