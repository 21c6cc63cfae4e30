"""What every part of the Redis backend shares: the cache and its bounded client, the
registered Lua scripts, the key names, a script call that turns Redis's errors into
:class:`~django_leader.exceptions.BackendUnavailable`, and the decoding of a script's
reply into a :class:`~django_leader.lease.Lease`."""

from __future__ import annotations

import hashlib
import re
import threading
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.core.cache import caches

from django_leader.backends.base import Backend
from django_leader.backends.history import HistoryWriter, WrittenAfterwards
from django_leader.backends.redis.client import bounded, redis_client
from django_leader.backends.redis.scripts import (
    ACQUIRE,
    ANNOUNCE,
    CANDIDATES,
    FORCE_RELEASE,
    HANDOVER,
    READ,
    RELEASE,
    RENEW,
    RENEW_MANY,
)
from django_leader.backends.wakeups import WakeHub
from django_leader.conf import get_settings
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import Lease

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)


def to_time(value: Any) -> datetime:
    """A time a script answered (server microseconds since the epoch) as a datetime."""
    return _EPOCH + timedelta(microseconds=int(value))


def text(value: Any) -> str:
    """A string a script answered (bytes or not) as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def to_ms(seconds: float) -> int:
    """A ttl or window in whole milliseconds for a script, at least 1."""
    return max(1, round(seconds * 1000))


#: A name that could be the digest :func:`hash_tag` puts in place of a name with braces.
_DIGEST = re.compile(r"[0-9a-f]{64}")


def hash_tag(name: str) -> str:
    """The hash tag of ``name``'s keys, one per name: the name itself, but for a name with
    braces (which would end the tag) its SHA-256 digest, and for a name that looks like
    such a digest, ``{`` and its own digest (no name without braces starts with ``{``)."""
    if "{" in name or "}" in name:
        return hashlib.sha256(name.encode()).hexdigest()
    if _DIGEST.fullmatch(name):
        return "{" + hashlib.sha256(name.encode()).hexdigest()
    return name


class NotConfirmed(BackendUnavailable):
    """A lease write that fewer replicas confirmed than ``REDIS_WAIT_REPLICAS`` asks for: it
    does not count. :attr:`replies` are the scripts' replies (what the primary did)."""

    def __init__(self, message: str, replies: list[Any]) -> None:
        super().__init__(message)
        self.replies = replies


class RedisStore(WrittenAfterwards, Backend):
    """The Redis behind ``DJANGO_LEADER["CACHE"]`` (default ``"default"``), as the parts of
    :class:`~django_leader.backends.redis.RedisBackend` use it."""

    def __init__(self, cache: str | None = None, *, timeout: float | None = None) -> None:
        conf = get_settings()
        self.alias = cache or conf.cache
        self.cache = caches[self.alias]
        call_timeout = timeout or conf.timing.call_timeout
        self.client = bounded(redis_client(self.cache), call_timeout)
        #: Replicas that must confirm a lease write (``REDIS_WAIT_REPLICAS``), and how long
        #: ``WAIT`` may wait for them: half the call's bound, the rest for the round trip.
        self.wait_replicas = conf.redis_wait_replicas
        self.wait_ms = max(1, round(call_timeout * 500))
        self.history_database = conf.database if conf.history else None
        self._history = HistoryWriter(conf.database) if conf.history else None
        self._acquire = self.client.register_script(ACQUIRE)
        self._renew = self.client.register_script(RENEW)
        self._renew_many = self.client.register_script(RENEW_MANY)
        self._release = self.client.register_script(RELEASE)
        self._force_release = self.client.register_script(FORCE_RELEASE)
        self._read = self.client.register_script(READ)
        self._announce = self.client.register_script(ANNOUNCE)
        self._candidates = self.client.register_script(CANDIDATES)
        self._handover = self.client.register_script(HANDOVER)
        self._hub: WakeHub | None = None
        self._hub_lock = threading.Lock()  # one hub, however many threads watch at once

    # -- key names ----------------------------------------------------------------------------
    def keys(self, name: str, parts: tuple[str, ...] = ("lease", "meta")) -> list[str]:
        """The lease and meta keys of ``name`` (same hash tag, so one Cluster slot): see
        :func:`hash_tag`."""
        tag = hash_tag(name)
        return [str(self.cache.make_key(f"django_leader:{{{tag}}}:{part}")) for part in parts]

    def store_key(self) -> str:
        """The store marker: which server process last wrote, and any lock-delay running."""
        return str(self.cache.make_key("django_leader:store"))

    def terms_key(self) -> str:
        """A hash of every lease name to the end of its last term (server microseconds)."""
        return str(self.cache.make_key("django_leader:terms"))

    @property
    def _channel_prefix(self) -> str:
        return str(self.cache.make_key("django_leader"))

    # -- calls ----------------------------------------------------------------------------------
    def unavailable(self, exc: Exception) -> BackendUnavailable:
        """The error a caller sees for Redis's ``exc`` (raise it ``from exc``)."""
        return BackendUnavailable(f"redis cache {self.alias!r}: {exc}")

    def now(self) -> datetime:
        """The Redis server's clock (``TIME``)."""
        import redis

        try:
            seconds, microseconds = self.client.time()
        except redis.RedisError as exc:
            raise self.unavailable(exc) from exc
        return datetime.fromtimestamp(int(seconds), dt_timezone.utc).replace(
            microsecond=int(microseconds)
        )

    def _call(
        self,
        script: Any,
        name: str,
        *args: Any,
        parts: tuple[str, ...] = ("lease", "meta"),
        extra: tuple[str, ...] = (),
        durable: bool = False,
    ) -> Any:
        """``script`` on ``name``'s keys (``parts``) and ``extra``. A ``durable`` call (a
        lease write) counts only once ``REDIS_WAIT_REPLICAS`` replicas have it: else
        :class:`NotConfirmed`, which is a :class:`BackendUnavailable`."""
        import redis

        keys = [*self.keys(name, parts), *extra]
        if durable:
            return self.pipelined(script, [[len(keys), *keys, *args]], durable=True)[0]
        try:
            return script(keys=keys, args=list(args))
        except redis.RedisError as exc:
            raise self.unavailable(exc) from exc

    def pipelined(self, script: Any, calls: list[list[Any]], *, durable: bool) -> list[Any]:
        """``EVALSHA script`` with each of ``calls`` (numkeys, keys, args) in one pipeline,
        one round trip: the replies in order. A ``durable`` pipeline ends with ``WAIT``: if
        fewer than ``REDIS_WAIT_REPLICAS`` replicas confirm its writes within
        :attr:`wait_ms`, :class:`NotConfirmed` carries the replies."""
        import redis

        replies: list[Any] = [None] * len(calls)
        confirmed: int | None = None
        wait = durable and self.wait_replicas > 0
        try:
            pending = list(range(len(calls)))
            for _ in range(2):  # once more after loading the script (NOSCRIPT)
                pipe = self.client.pipeline(transaction=False)
                for index in pending:
                    pipe.evalsha(script.sha, *calls[index])
                if wait:
                    # WAIT covers the writes sent before it on the same connection: the
                    # pipeline's. Each round's confirms its own writes.
                    pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms)
                results = pipe.execute(raise_on_error=False)
                if wait:
                    acked = results.pop()
                    if isinstance(acked, Exception):
                        raise acked
                    confirmed = int(acked) if confirmed is None else min(confirmed, int(acked))
                missing = []
                for index, result in zip(pending, results, strict=True):
                    if isinstance(result, redis.exceptions.NoScriptError):
                        missing.append(index)
                    elif isinstance(result, Exception):
                        raise result
                    else:
                        replies[index] = result
                if not missing:
                    break
                script.sha = self.client.script_load(script.script)
                pending = missing
            else:
                raise redis.exceptions.NoScriptError("the script was not loaded")
        except redis.RedisError as exc:
            raise self.unavailable(exc) from exc
        if confirmed is not None and confirmed < self.wait_replicas:
            raise NotConfirmed(
                f"redis cache {self.alias!r}: a lease write reached {confirmed} of the "
                f"{self.wait_replicas} replicas DJANGO_LEADER['REDIS_WAIT_REPLICAS'] asks for "
                f"within {self.wait_ms} ms; it does not count (a failover could lose it)",
                replies,
            )
        return replies

    # -- replies --------------------------------------------------------------------------------
    def _lease(self, name: str, reply: Any) -> Lease | None:
        if not reply or int(reply[0]) == 0:
            return None
        _, holder, token, acquired, renewed, expires, transitions, previous = reply[:8]
        return Lease(
            name=name,
            holder=text(holder),
            token=int(token),
            transitions=int(transitions),
            acquired_at=to_time(acquired),
            renewed_at=to_time(renewed),
            expires_at=to_time(expires),
            previous_holder=text(previous),
        )

    def _renewed(self, name: str, reply: Any) -> Lease | None:
        """The lease a renewal script answered (with its standing hand-over request), or
        None if it refused."""
        renewed = self._lease(name, reply)
        if renewed is not None and len(reply) > 9:
            renewed.handover_to = text(reply[9])
        return renewed
