"""The lease operations of the Redis backend, each one Lua script: acquire (behind the
store marker's check for a Redis that forgot), renew, release (which also publishes the
wake-up), force-release, read, list the names, and the hand-over request."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

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
        if text(reply[10]) == "1":
            logger.warning(
                "redis cache %r has lost state (flushed, restarted, restored or failed over): "
                "no lease on it may be taken for the lock-delay of %.1fs, so that every "
                "holder that could still believe it leads has stepped down",
                self.alias,
                delay,
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
        reply = self._call(self._read, name)
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
                keys = [*self.keys(name, parts), self.terms_key(name)]
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
