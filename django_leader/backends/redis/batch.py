"""Batch renewal in Redis: many leases renewed in one round trip, each renewed or refused
on its own exactly as by a single renewal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_leader.backends.redis.store import RedisStore, text, to_ms, to_time
from django_leader.lease import Lease

#: Leases renewed by one script of :meth:`RedisBackend.renew_many` (the scripts of a batch
#: go in one pipeline: one round trip).
BATCH = 2500


class BatchRenewal(RedisStore):
    """:meth:`renew_many` of :class:`~django_leader.backends.redis.RedisBackend`."""

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases``: one script per ``BATCH`` (2,500) leases (each
        lease renewed or refused on its own, exactly as by ``renew``), all sent in one
        pipeline: one round trip for any count (with ``WAIT`` at its end, if
        ``REDIS_WAIT_REPLICAS`` asks for it). On a cluster, one script per hash slot, one
        pipeline per master."""
        if not leases:
            return []
        keys = list(dict.fromkeys((lease.name, lease.holder, lease.token) for lease in leases))
        # One script per BATCH leases that share a registry of terms: the store's on a
        # single Redis; on a cluster, their slot's (a script runs on one slot).
        by_terms: dict[str, list[tuple[str, str, int]]] = {}
        for key in keys:
            by_terms.setdefault(self.terms_key(key[0]), []).append(key)
        chunks = [
            (terms, group[start : start + BATCH])
            for terms, group in by_terms.items()
            for start in range(0, len(group), BATCH)
        ]
        ms = to_ms(ttl)
        calls = []
        for terms, chunk in chunks:
            script_keys = [key for name, _, _ in chunk for key in self.keys(name)]
            args = [arg for name, holder, token in chunk for arg in (holder, token, name)]
            calls.append([len(script_keys) + 1, *script_keys, terms, ms, *args])
        replies = self.pipelined(self._renew_many, calls, durable=True)
        found: dict[tuple[str, str, int], Lease | None] = {}
        for (_, chunk), reply in zip(chunks, replies, strict=True):
            found.update(zip(chunk, self._renewals(chunk, reply), strict=True))
        return [found[(lease.name, lease.holder, lease.token)] for lease in leases]

    def _renewals(self, chunk: list[tuple[str, str, int]], reply: Any) -> list[Lease | None]:
        """The leases one ``RENEW_MANY`` script answered for ``chunk`` (None where it
        refused): one string of records to split, times read once (see the script)."""
        now, expires, records, handovers = reply
        lines = text(records).split("\n")
        if len(lines) != len(chunk):
            raise self.unavailable(
                ValueError(f"the renewal script answered {len(lines)} leases of {len(chunk)}")
            )
        renewed_at, expires_at = to_time(now), to_time(expires)
        standing = iter(handovers)
        renewed: list[Lease | None] = []
        for (name, holder, token), line in zip(chunk, lines, strict=True):
            if not line:
                renewed.append(None)
                continue
            acquired, transitions, handover = line.split("\t")
            renewed.append(
                Lease(
                    name=name,
                    holder=holder,
                    token=token,
                    transitions=int(transitions),
                    acquired_at=to_time(acquired),
                    renewed_at=renewed_at,
                    expires_at=expires_at,
                    handover_to=text(next(standing)) if handover == "1" else "",
                )
            )
        return renewed
