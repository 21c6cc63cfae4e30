"""The lease operations of the Redis backend, each one Lua script: acquire (behind the
store marker's check for a Redis that forgot), renew, release (which also publishes the
wake-up), force-release, read, list the names, and the hand-over request."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django_leader.backends.base import NEW_STORE_HINT
from django_leader.backends.redis.store import (
    NotConfirmed,
    RedisStore,
    errors,
    text,
    to_ms,
    to_time,
)
from django_leader.backends.wakeups import channel
from django_leader.conf import lock_delay
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import EventKind, Lease

logger = logging.getLogger("django_leader")


#: What the acquire script's lost flag (its 11th answer) says of the store: "1" its run
#: or replication id changed under its marker, "2" the marker itself is missing.
LOST_STATE = {
    "1": "has lost state (restarted, restored or failed over)",
    "2": (
        "has no store marker: it lost its state (flushed, restarted without persistence, "
        "failed over) or was never used for leases"
    ),
}


class RedisLeases(RedisStore):
    """:meth:`acquire`, :meth:`renew`, :meth:`release`, :meth:`force_release`,
    :meth:`read`, :meth:`names` and :meth:`request_handover` of
    :class:`~django_leader.backends.redis.RedisBackend`."""

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        delay = lock_delay(ttl)
        try:
            reply = self._call(
                self._acquire,
                name,
                holder,
                to_ms(ttl),
                name,
                to_ms(delay),
                extra=(self.store_key(name), self.terms_key(name)),
                durable=True,
            )
        except NotConfirmed as exc:
            taken = self._lease(name, exc.replies[0])
            if taken is not None and int(exc.replies[0][0]):
                # The primary granted it, the replicas did not confirm it: not ours to
                # act on. Give it back at once rather than let it keep others out.
                with contextlib.suppress(BackendUnavailable):
                    self.release(taken)
            raise
        lost = text(reply[10])
        cause = LOST_STATE.get(lost)
        if cause is not None:
            logger.warning(
                "redis cache %r %s. No lease on it may be taken for the lock-delay of %.1fs, so "
                "that every holder that could still believe it leads has stepped down.%s",
                self.alias,
                cause,
                delay,
                f" {NEW_STORE_HINT}" if lost == "2" else "",
            )
        if int(reply[0]) == 0:
            if not text(reply[1]):
                # Nobody holds it, yet it may not be taken: force-released with its term
                # still running, the store's lock-delay after a loss of state, or a
                # hand-over to another candidate.
                return None, None
            current = self._lease(name, [1, *reply[1:]])
            assert current is not None
            if len(reply) > 11:
                current.read_at = to_time(reply[11])
            return None, current
        lease = self._lease(name, reply)
        assert lease is not None
        self._record_grant(lease, bool(lease.previous_holder) and text(reply[8]) == "0")
        return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        reply = self._call(
            self._renew,
            lease.name,
            lease.holder,
            lease.token,
            to_ms(ttl),
            lease.name,
            extra=(self.terms_key(lease.name),),
            durable=True,
        )
        return self._renewed(lease.name, reply)

    def release(self, lease: Lease) -> bool:
        at = int(
            self._call(
                self._release,
                lease.name,
                lease.holder,
                lease.token,
                lease.name,
                channel(self._channel_prefix, lease.name),
                extra=(self.terms_key(lease.name),),
            )
        )
        if at:
            self._record(EventKind.RELEASED, lease, to_time(at))
        return bool(at)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        reply = self._call(self._force_release, name)
        lease = self._lease(name, reply)
        if lease is not None:
            self._record(
                EventKind.FORCED_RELEASE, lease, to_time(reply[9]), detail=detail, actor=actor
            )
        return lease

    def read(self, name: str) -> Lease | None:
        return self._read_lease(name, self._call(self._read, name))

    def read_many(self, names: Sequence[str]) -> list[Lease | None]:
        """One pipeline per 1,000 names (:meth:`read`'s script each)."""
        replies = self._call_each(self._read, names, parts=("lease", "meta"))
        return [self._read_lease(name, reply) for name, reply in zip(names, replies, strict=True)]

    def _read_lease(self, name: str, reply: Any) -> Lease | None:
        """The lease a read script answered, with ``read_at``, or None."""
        lease = self._lease(name, reply)
        if lease is not None:
            lease.read_at = to_time(reply[9])
        return lease

    def names(self) -> list[str]:
        pattern = str(self.cache.make_key("django_leader:{*}:meta"))
        try:
            keys = list(self.client.scan_iter(match=pattern, count=500))
            found: set[str] = set()
            for start in range(0, len(keys), 1000):  # pipelined: not a round trip per name
                pipe = self.client.pipeline(transaction=False)
                for key in keys[start : start + 1000]:
                    pipe.hget(key, "name")
                found.update(text(name) for name in pipe.execute() if name is not None)
        except errors() as exc:
            raise self.unavailable(exc) from exc
        return sorted(found)

    def initialize(self) -> bool:
        """Write the store marker where it is missing, with no lock-delay (see
        :meth:`Backend.initialize <django_leader.backends.base.Backend.initialize>`): on a
        cluster, the marker of every slot, 1,000 per pipeline. True if any was written."""
        calls = [[1, key] for key in self.store_keys()]
        written = 0
        for start in range(0, len(calls), 1000):
            replies = self.pipelined(self._initialize, calls[start : start + 1000], durable=True)
            written += sum(int(reply) for reply in replies)
        return written > 0

    def prune(self, unused_for: timedelta, *, batch: int = 500) -> int:
        """Forget the names unused for ``unused_for`` by the server's clock: their meta
        hash, candidates, beat slot records and entry in the terms, each by a script that
        checks again that nobody holds it (:data:`~.scripts.PRUNE`), ``batch`` names per
        pipeline."""
        cutoff = round((self.now() - unused_for).timestamp() * 1_000_000)
        forgotten, names = 0, self.names()
        parts = ("lease", "meta", "candidates", "cinfo", "cseq", "beat")
        for start in range(0, len(names), batch):
            calls = []
            for name in names[start : start + batch]:
                keys = [
                    *self.keys(name, parts),
                    self.terms_key(name),
                    *self.keys(name, ("corder",)),
                ]
                calls.append([len(keys), *keys, cutoff, name])
            replies = self.pipelined(self._prune, calls, durable=False)
            forgotten += sum(int(reply) for reply in replies)
        return forgotten

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        reply = self._call(self._handover, name, to, to_ms(window))
        lease = self._lease(name, reply)
        at = to_time(reply[9]) if lease is not None else to_time(reply[1])
        self._record(
            EventKind.HANDOVER,
            lease or Lease(name, "", 0, None, None, None, 0),
            at,
            detail=detail or f"to {to}",
            actor=actor,
        )
        return lease
