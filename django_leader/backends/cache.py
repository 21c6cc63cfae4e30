"""Leases in Redis, through Django's cache framework (django-redis or Django's RedisCache).

Every operation is one Lua script, so each check-and-write is atomic on the server, and
every time in it comes from the server (``TIME``, ``PEXPIRE``), never from a client clock.

Keys (one lease's keys share a hash tag, so they sit in one Redis Cluster slot):

* ``<prefix>:<version>:django_leader:{<name>}:lease`` — a hash (holder, token,
  acquired_at, renewed_at, expires_at; times in microseconds since the epoch on the
  server's clock) that expires with the lease (``PEXPIRE``). Missing = free; an empty
  holder = force-released, free for the taking once the key expires.
* ``<prefix>:<version>:django_leader:{<name>}:meta`` — a hash without expiry: the last
  fencing token, transitions, the last holder and whether it released.
* ``<prefix>:<version>:django_leader:{<name>}:candidates`` — a sorted set of the Electors
  campaigning for the name (identity, scored by when its candidacy expires); only for
  ``manage.py leader status``, never part of a lease decision.

**Fencing tokens across a Redis restart.** The last token lives in the ``meta`` key, which a
Redis without persistence loses on restart (or a ``FLUSHDB`` removes). When an acquisition
finds no token, it starts counting from the server's clock in microseconds
(``TIME``) instead of from zero: every token ever issued is at most the clock reading at
its issue plus the number of acquisitions since the counter was last seeded, which is far
below the microseconds elapsed since, so the new token is greater than every earlier one.
The assumption: Redis's clock does not go backwards across the restart (by more than the
time the restart took). Tokens therefore look like ``1763784000123457`` rather than ``1``;
only their order matters.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings
from ..exceptions import BackendUnavailable
from ..history import HistoryWriter
from ..lease import Lease
from .base import Backend

logger = logging.getLogger("django_leader")

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)

# Shared Lua: server time in microseconds, as a number (exact: < 2^53) and as a string.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function str(n) return string.format('%.0f', n) end
"""

# KEYS: lease, meta. ARGV: holder, ttl_ms, name. Returns {acquired(0/1), holder, token,
# acquired_at, renewed_at, expires_at, transitions, previous_holder, previous_released}.
_ACQUIRE = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if current[1] then
  local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
  return {0, current[1], current[2], current[3], current[4], current[5], transitions, '', '0'}
end
if redis.call('HEXISTS', KEYS[2], 'token') == 0 then
  -- The token counter was lost (first use, FLUSHDB, restart without persistence):
  -- continue from the server clock, which is beyond every token issued before.
  redis.call('HSET', KEYS[2], 'token', t[1] .. string.rep('0', 6 - #t[2]) .. t[2])
end
local token = redis.call('HINCRBY', KEYS[2], 'token', 1)
local transitions = redis.call('HINCRBY', KEYS[2], 'transitions', 1)
local previous = redis.call('HGET', KEYS[2], 'holder') or ''
local released = redis.call('HGET', KEYS[2], 'released') or '1'
redis.call('HSET', KEYS[2], 'holder', ARGV[1], 'released', '0', 'name', ARGV[3])
local expires = now + tonumber(ARGV[2]) * 1000
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', str(token), 'acquired_at', str(now),
           'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, ARGV[1], str(token), str(now), str(now), str(expires), transitions, previous,
        released}
"""
)

# KEYS: lease, meta. ARGV: holder, token, ttl_ms. Same reply as acquire (acquired = renewed).
_RENEW = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return {0} end
local expires = now + tonumber(ARGV[3]) * 1000
redis.call('HSET', KEYS[1], 'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
return {1, ARGV[1], current[2], current[3], str(now), str(expires), transitions, '', '0'}
"""
)

# KEYS: lease, meta. ARGV: holder, token. Returns the server time if released, else 0.
_RELEASE = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'released', '1')
return str(now)
"""
)

# KEYS: lease, meta. Returns the released lease like acquire's reply, or {0}. The term is
# not cut short (the key keeps its expiry, with no holder): the holder hears of it at its
# next renewal, and nobody may take the lease before the term ends.
_FORCE_RELEASE = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if not current[1] or current[1] == '' then return {0} end
redis.call('HSET', KEYS[1], 'holder', '')
redis.call('HSET', KEYS[2], 'released', '1')
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
return {1, current[1], current[2], current[3], current[4], current[5], transitions, '', '0',
        str(now)}
"""
)

# KEYS: lease, meta. Returns the current lease like acquire's reply plus the server time
# ({0} if free).
_READ = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if not current[1] or current[1] == '' then return {0} end
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
return {1, current[1], current[2], current[3], current[4], current[5], transitions, '', '0',
        str(now)}
"""
)


# KEYS: candidates (a sorted set: identity -> expiry in microseconds, server clock).
# ARGV: identity, ttl_ms ('' to withdraw). Expired candidates are dropped on the way.
_ANNOUNCE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', str(now))
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], str(now + tonumber(ARGV[2]) * 1000), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""
)

# KEYS: candidates. Returns the identities whose candidacy has not expired.
_CANDIDATES = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. str(now), '+inf')
"""
)


def redis_client(cache: Any) -> Any:
    """The redis-py client behind a Django cache, or ImproperlyConfigured if it is not Redis."""
    try:
        import redis
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImproperlyConfigured(
            "django_leader's CacheBackend needs redis-py: pip install 'django-leader[redis]'"
        ) from None
    client: Any = None
    from django.core.cache.backends.redis import RedisCache

    try:
        if isinstance(cache, RedisCache):
            client = cache._cache.get_client(None, write=True)
        elif hasattr(cache, "client") and hasattr(cache.client, "get_client"):  # django-redis
            client = cache.client.get_client(write=True)
    except NotImplementedError:  # e.g. django-redis's ShardClient: no single server
        client = None
    if not isinstance(client, redis.Redis):
        raise ImproperlyConfigured(
            f"django_leader's CacheBackend needs a Redis cache (django-redis or "
            f"django.core.cache.backends.redis.RedisCache), got {type(cache).__module__}."
            f"{type(cache).__qualname__}: only Redis gives an atomic compare-and-set "
            "across processes"
        )
    return client


def _bounded(client: Any, timeout: float) -> Any:
    """A client on the same server whose every call is bounded by ``timeout`` seconds.

    Only for a plain connection pool; Sentinel and other pools are used as configured
    (set their ``socket_timeout`` yourself).
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = client.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return client
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = timeout
    kwargs["socket_connect_timeout"] = timeout
    kwargs["retry"] = Retry(NoBackoff(), 0)  # the election loop retries, on its own schedule
    kwargs.pop("retry_on_timeout", None)
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )


def _time(value: Any) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class CacheBackend(Backend):
    """Leases in the Redis behind ``DJANGO_LEADER["CACHE"]`` (default ``"default"``)."""

    def __init__(self, cache: str | None = None, *, timeout: float | None = None) -> None:
        conf = get_settings()
        self.alias = cache or conf.cache
        self.cache = caches[self.alias]
        self.client = _bounded(redis_client(self.cache), timeout or conf.timing.call_timeout)
        self.history_database = conf.database if conf.history else None
        self._history = HistoryWriter(conf.database) if conf.history else None
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)
        self._force_release = self.client.register_script(_FORCE_RELEASE)
        self._read = self.client.register_script(_READ)
        self._announce = self.client.register_script(_ANNOUNCE)
        self._candidates = self.client.register_script(_CANDIDATES)

    def __repr__(self) -> str:
        return f"<CacheBackend {self.alias!r}>"

    def keys(self, name: str, parts: tuple[str, ...] = ("lease", "meta")) -> list[str]:
        """The lease and meta keys of ``name`` (same hash tag, so one Cluster slot)."""
        tag = (
            name
            if "{" not in name and "}" not in name
            else hashlib.sha256(name.encode()).hexdigest()
        )
        return [str(self.cache.make_key(f"django_leader:{{{tag}}}:{part}")) for part in parts]

    def _call(
        self, script: Any, name: str, *args: Any, parts: tuple[str, ...] = ("lease", "meta")
    ) -> Any:
        import redis

        try:
            return script(keys=self.keys(name, parts), args=list(args))
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc

    def _lease(self, name: str, reply: Any) -> Lease | None:
        if not reply or int(reply[0]) == 0:
            return None
        _, holder, token, acquired, renewed, expires, transitions, previous = reply[:8]
        return Lease(
            name=name,
            holder=_text(holder),
            token=int(token),
            transitions=int(transitions),
            acquired_at=_time(acquired),
            renewed_at=_time(renewed),
            expires_at=_time(expires),
            previous_holder=_text(previous),
            backend=self,
        )

    @staticmethod
    def _ms(ttl: float) -> int:
        return max(1, round(ttl * 1000))

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        reply = self._call(self._acquire, name, holder, self._ms(ttl), name)
        if int(reply[0]) == 0:
            if not _text(reply[1]):  # force-released, its term still running: nobody holds it
                return None, None
            current = self._lease(name, [1, *reply[1:]])
            assert current is not None
            current.backend = None
            return None, current
        lease = self._lease(name, reply)
        assert lease is not None
        taken_over = bool(lease.previous_holder) and _text(reply[8]) == "0"
        if not taken_over:
            lease.previous_holder = ""
        self._record(
            "taken_over" if taken_over else "acquired",
            lease,
            lease.acquired_at,
            detail=f"lease of {lease.previous_holder} had expired" if taken_over else "",
        )
        return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        return self._lease(
            lease.name,
            self._call(self._renew, lease.name, lease.holder, lease.token, self._ms(ttl)),
        )

    def release(self, lease: Lease) -> bool:
        at = int(self._call(self._release, lease.name, lease.holder, lease.token))
        if at:
            self._record("released", lease, _time(at))
        return bool(at)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        reply = self._call(self._force_release, name)
        lease = self._lease(name, reply)
        if lease is not None:
            lease.backend = None
            self._record("forced_release", lease, _time(reply[9]), detail=detail, actor=actor)
        return lease

    def read(self, name: str) -> Lease | None:
        reply = self._call(self._read, name)
        lease = self._lease(name, reply)
        if lease is not None:
            lease.backend = None
            lease.read_at = _time(reply[9])
        return lease

    def names(self) -> list[str]:
        import redis

        pattern = str(self.cache.make_key("django_leader:{*}:meta"))
        try:
            found = {
                _text(name)
                for key in self.client.scan_iter(match=pattern, count=500)
                if (name := self.client.hget(key, "name")) is not None
            }
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc
        return sorted(found)

    def announce(self, name: str, identity: str, ttl: float) -> None:
        self._call(self._announce, name, identity, self._ms(ttl), parts=("candidates",))

    def withdraw(self, name: str, identity: str) -> None:
        self._call(self._announce, name, identity, "", parts=("candidates",))

    def candidates(self, name: str) -> list[str] | None:
        reply = self._call(self._candidates, name, parts=("candidates",))
        return sorted(_text(identity) for identity in reply)

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        self._record(kind, lease, None, detail=detail)

    def _record(
        self, kind: str, lease: Lease, at: datetime | None, detail: str = "", actor: str = ""
    ) -> None:
        if self._history is not None:
            self._history.record(kind, lease, at, detail=detail, actor=actor)

    def flush_history(self, timeout: float | None = None) -> bool:
        return self._history.flush(timeout) if self._history is not None else True

    def close(self) -> None:
        """Connections are pooled by redis-py and shared by threads: nothing per thread."""
