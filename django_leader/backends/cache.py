"""Leases in Redis, through Django's cache framework (django-redis or Django's RedisCache).

Every operation is one Lua script, so each check-and-write is atomic on the server, and
every time in it comes from the server (``TIME``, ``PEXPIRE``), never from a client clock.

Keys (one lease's keys share a hash tag, so they sit in one Redis Cluster slot):

* ``<prefix>:<version>:django_leader:{<name>}:lease`` — a hash (holder, token,
  acquired_at, renewed_at, expires_at; times in microseconds since the epoch on the
  server's clock) that expires with the lease (``PEXPIRE``). Missing = free; an empty
  holder = force-released, free for the taking once the key expires.
* ``<prefix>:<version>:django_leader:{<name>}:meta`` — a hash without expiry: the last
  fencing token, transitions, the last holder, whether it released, the end of its term
  (``expires``: a lease key deleted by hand or evicted still keeps others out until then)
  and the store epoch the token was issued in.
* ``<prefix>:<version>:django_leader:{<name>}:candidates`` — a sorted set of the Electors
  campaigning for the name (identity, scored by when its candidacy expires); only for
  ``manage.py leader status``, never part of a lease decision.
* ``<prefix>:<version>:django_leader:store`` — the store marker: the ``run_id`` of the
  Redis process that wrote it, the current epoch and the end of a running lock-delay.
* ``<prefix>:<version>:django_leader:terms`` — a hash of every lease name to the end of
  its last term, so that a name whose keys were deleted by hand is not given away early.

An acquisition touches the store-wide keys too, so the lease keys of one name share a slot
but an acquisition does not: Redis Cluster is not supported (Django's cache clients talk to
one primary anyway).

**A Redis that forgets (SPEC rules 3 and 7).** Redis may lose writes it acknowledged: a
``FLUSHDB``/``FLUSHALL`` (``cache.clear()`` is one), a restart without persistence, a
restart from an RDB snapshot or an AOF older than the last writes, a failover to a replica
that missed them. A holder that cannot reach Redis may then still believe it leads until
its local deadline, while the store says the name is free. Every acquisition therefore
first checks the store marker:

* missing (flushed, restarted without persistence, deleted, or a store never used): the
  state was lost when the server started if nothing was flushed since (``INFO
  commandstats``), else at an unknown time before now;
* written by another server process (``run_id`` differs: a restart from disk, a failover):
  lost now.

Either way the marker is written anew with a new epoch, and no lease of this store may be
taken until the loss time plus the **lock-delay** (:func:`django_leader.conf.lock_delay`:
``LOCK_DELAY``, default ``LEASE_TTL``, or the acquirer's own ttl if longer; a longer ttl
asked for while the delay runs lengthens it). Every holder that could still believe it
leads made its last successful renewal before the loss, so its local deadline has passed by
then. A Redis that has been up for longer than the lock-delay and was never flushed is
used at once.

Tokens never repeat: a name whose counter is missing, or was issued in an earlier epoch
(the state may be an older snapshot), continues from the server's clock in microseconds
(``TIME``) when that is greater. Every token ever issued is at most the clock reading at
its issue plus the number of acquisitions issued within the same microseconds, so the new
token is greater than every earlier one. The assumption: Redis's clock does not go
backwards across the restart or failover (by more than the time the restart took). Tokens
therefore look like ``1763784000123457`` rather than ``1``; only their order matters.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings, lock_delay
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

# Has the store lost state since it was last used (SPEC rule 7)? Sets ``lost`` (true when
# this call noticed a loss), ``epoch`` (changes with every loss noticed) and ``fence`` (no
# lease may be taken before it, server microseconds). KEYS[3]: the store marker, a hash
# without expiry: run_id (the server process it was written by), epoch, fence.
# ARGV[4]: the lock-delay in milliseconds.
_STORE = r"""
local info = redis.call('INFO', 'server')
local run_id = string.match(info, 'run_id:(%w+)')
local delay = tonumber(ARGV[4]) * 1000
local store = redis.call('HMGET', KEYS[3], 'run_id', 'epoch', 'fence')
local epoch = store[2]
local fence = tonumber(store[3]) or 0
local lost = false
if not store[1] then
  -- The marker is gone: FLUSHDB/FLUSHALL, a restart without persistence, a deletion by
  -- hand, or a store never used before. Without a flush since the server started, what
  -- was lost was lost when it started; else at an unknown time, so count from now.
  local stats = redis.call('INFO', 'commandstats')
  local flushes = tonumber(string.match(stats, 'cmdstat_flushdb:calls=(%d+)') or '0')
                  + tonumber(string.match(stats, 'cmdstat_flushall:calls=(%d+)') or '0')
  local since = now
  if flushes == 0 then
    since = now - tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) * 1000000
  end
  epoch = str(now)
  fence = math.max(fence, since + delay)
  lost = true
elseif store[1] ~= run_id then
  -- Another server process: restarted (from a snapshot or an AOF that may be older than
  -- the last writes) or failed over to a replica that may have missed them.
  epoch = str(now)
  fence = math.max(fence, now + delay)
  lost = true
elseif fence > now then
  -- A lock-delay is running: a caller with a longer ttl (hence longer-lived peers) makes
  -- it longer, counted from when it began.
  local began = tonumber(epoch) or now
  if began + delay > fence then
    fence = began + delay
    redis.call('HSET', KEYS[3], 'fence', str(fence))
  end
end
if lost then
  redis.call('HSET', KEYS[3], 'run_id', run_id, 'epoch', epoch, 'fence', str(fence))
end
"""

# KEYS: lease, meta, store, terms. ARGV: holder, ttl_ms, name, lock_delay_ms. Returns {acquired
# (0/1), holder, token, acquired_at, renewed_at, expires_at, transitions, previous_holder,
# previous_released, lock-delay left in microseconds (0 if none), 1 if this call noticed a
# loss that starts a lock-delay}.
_ACQUIRE = (
    _NOW
    + _STORE
    + """
local lost_flag = '0'
if lost and fence > now then lost_flag = '1' end
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if current[1] then
  local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
  return {0, current[1], current[2], current[3], current[4], current[5], transitions, '', '0',
          '0', lost_flag}
end
local meta = redis.call('HMGET', KEYS[2], 'holder', 'token', 'released', 'expires', 'epoch',
                        'acquired_at', 'renewed_at', 'transitions')
if meta[3] == '0' and tonumber(meta[4] or '0') > now then
  -- The lease key is gone (deleted by hand, evicted) but its term is not over.
  return {0, meta[1], meta[2], meta[6] or '0', meta[7] or '0', meta[4], meta[8] or '0', '',
          '0', '0', lost_flag}
end
if not meta[2] then
  -- No counter for this name: new, or its keys were deleted by hand. The store-wide
  -- registry of terms tells: nobody may take it before the last term it knows ends.
  local term = tonumber(redis.call('HGET', KEYS[4], ARGV[3]) or '0')
  if term > fence then fence = term end
end
if now < fence then
  return {0, '', '0', '0', '0', '0', meta[8] or '0', '', '0', str(fence - now), lost_flag}
end
local token = tonumber(meta[2])
if not token or meta[5] ~= epoch then
  -- First use, or the counter may be older than tokens already issued (lost, restored
  -- from an older snapshot): continue from the server clock in microseconds, which is
  -- beyond every token issued before (see the module docstring).
  token = math.max(token or 0, now)
end
token = token + 1
local transitions = redis.call('HINCRBY', KEYS[2], 'transitions', 1)
local previous = meta[1] or ''
local released = meta[3] or '1'
local expires = now + tonumber(ARGV[2]) * 1000
redis.call('HSET', KEYS[2], 'token', str(token), 'holder', ARGV[1], 'released', '0',
           'name', ARGV[3], 'epoch', epoch, 'acquired_at', str(now), 'renewed_at', str(now),
           'expires', str(expires))
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', str(token), 'acquired_at', str(now),
           'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[3], str(expires))
return {1, ARGV[1], str(token), str(now), str(now), str(expires), transitions, previous,
        released, '0', lost_flag}
"""
)

# KEYS: lease, meta, terms. ARGV: holder, token, ttl_ms, name. Same reply as acquire
# (acquired = renewed).
# The meta hash keeps the expiry too, so that a lease key deleted by hand or evicted still
# keeps others out until the term ends.
_RENEW = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return {0} end
local expires = now + tonumber(ARGV[3]) * 1000
redis.call('HSET', KEYS[1], 'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'renewed_at', str(now), 'expires', str(expires))
redis.call('HSET', KEYS[3], ARGV[4], str(expires))
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
return {1, ARGV[1], current[2], current[3], str(now), str(expires), transitions, '', '0'}
"""
)

# KEYS: lease, meta, terms. ARGV: holder, token, name. Returns the server time if released,
# else 0.
_RELEASE = (
    _NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'released', '1', 'expires', str(now))
redis.call('HSET', KEYS[3], ARGV[3], str(now))
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

    def store_key(self) -> str:
        """The store marker: which server process last wrote, and any lock-delay running."""
        return str(self.cache.make_key("django_leader:store"))

    def terms_key(self) -> str:
        """A hash of every lease name to the end of its last term (server microseconds)."""
        return str(self.cache.make_key("django_leader:terms"))

    def _call(
        self,
        script: Any,
        name: str,
        *args: Any,
        parts: tuple[str, ...] = ("lease", "meta"),
        extra: tuple[str, ...] = (),
    ) -> Any:
        import redis

        try:
            return script(keys=[*self.keys(name, parts), *extra], args=list(args))
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
        )

    @staticmethod
    def _ms(ttl: float) -> int:
        return max(1, round(ttl * 1000))

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        delay = lock_delay(ttl)
        reply = self._call(
            self._acquire,
            name,
            holder,
            self._ms(ttl),
            name,
            self._ms(delay),
            extra=(self.store_key(), self.terms_key()),
        )
        if _text(reply[10]) == "1":
            logger.warning(
                "redis cache %r has lost state (flushed, restarted, restored or failed over): "
                "no lease on it may be taken for the lock-delay of %.1fs, so that every "
                "holder that could still believe it leads has stepped down",
                self.alias,
                delay,
            )
        if int(reply[0]) == 0:
            if not _text(reply[1]):
                # Nobody holds it, yet it may not be taken: force-released with its term
                # still running, or the store's lock-delay after a loss of state.
                return None, None
            current = self._lease(name, [1, *reply[1:]])
            assert current is not None
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
            self._call(
                self._renew,
                lease.name,
                lease.holder,
                lease.token,
                self._ms(ttl),
                lease.name,
                extra=(self.terms_key(),),
            ),
        )

    def release(self, lease: Lease) -> bool:
        at = int(
            self._call(
                self._release,
                lease.name,
                lease.holder,
                lease.token,
                lease.name,
                extra=(self.terms_key(),),
            )
        )
        if at:
            self._record("released", lease, _time(at))
        return bool(at)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        reply = self._call(self._force_release, name)
        lease = self._lease(name, reply)
        if lease is not None:
            self._record("forced_release", lease, _time(reply[9]), detail=detail, actor=actor)
        return lease

    def read(self, name: str) -> Lease | None:
        reply = self._call(self._read, name)
        lease = self._lease(name, reply)
        if lease is not None:
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
