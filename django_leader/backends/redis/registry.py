"""The Redis backend's registry of candidates: a sorted set per name of the Electors
campaigning for it, for ``manage.py leader status`` and the queue of fifo and priority
elections."""

from __future__ import annotations

import json

from django_leader.backends.redis.store import RedisStore, text, to_ms, to_time
from django_leader.election import Candidate


class Registry(RedisStore):
    """:meth:`announce`, :meth:`withdraw` and :meth:`candidates` of
    :class:`~django_leader.backends.redis.RedisBackend`."""

    _REGISTRY = ("candidates", "cinfo", "cseq")

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
        reply = self._call(self._candidates, name, parts=self._REGISTRY[:2])
        found = []
        for identity, raw in zip(reply[::2], reply[1::2], strict=True):
            info = json.loads(text(raw))
            found.append(
                Candidate(
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
            )
        return sorted(found, key=lambda candidate: candidate.seq)
