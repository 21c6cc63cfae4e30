"""Leases in Redis, through Django's cache framework (django-redis or Django's RedisCache).

:class:`RedisBackend`; ``django_leader.backends.cache.CacheBackend`` is another name for it
(the setting's value before it was renamed), and keeps working.

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

**A Redis that forgets** (see "When the store forgets" in docs/safety.md). Redis may
lose writes it acknowledged: a ``FLUSHDB``/``FLUSHALL`` (``cache.clear()`` is one), a
restart without persistence, a restart from an RDB snapshot or an AOF older than the last
writes, a failover to a replica that missed them. A holder that cannot reach Redis may then
still believe it leads until its local deadline, while the store says the name is free.
Every acquisition therefore first checks the store marker:

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
import json
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings, lock_delay
from ..exceptions import BackendUnavailable
from ..lease import EventKind, Lease
from . import redis_scripts as scripts
from .base import Backend, Watch
from .history import HistoryWriter, WrittenAfterwards
from .wakeups import WakeHub, channel

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ..conf import LeaderSettings
    from ..election import Candidate
    from .redis_slots import RedisSlots

logger = logging.getLogger("django_leader")

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)

#: Leases renewed by one script of :meth:`RedisBackend.renew_many` (the scripts of a batch
#: go in one pipeline: one round trip).
BATCH = 2500


def redis_client(cache: Any) -> Any:
    """The redis-py client behind a Django cache, or ImproperlyConfigured if it is not Redis."""
    try:
        import redis
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImproperlyConfigured(
            "django_leader's Redis backend needs redis-py: pip install 'django-leader[redis]'"
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
            f"django_leader's Redis backend needs a Redis cache (django-redis or "
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
    # A blocking pool: a call beyond max_connections at once waits for a free connection
    # (within the bound) instead of failing with "Too many connections" — one process may
    # run many Electors and locks. The limit is the project's pool's, at least 100.
    limit = max(100, int(getattr(pool, "max_connections", 0) or 0))
    return redis.Redis(
        connection_pool=redis.BlockingConnectionPool(
            connection_class=pool.connection_class,
            max_connections=min(limit, 2**31 - 1),
            timeout=timeout,
            **kwargs,
        )
    )


def _time(value: Any) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBackend(WrittenAfterwards, Backend):
    """Leases in the Redis behind ``DJANGO_LEADER["CACHE"]`` (default ``"default"``)."""

    def __init__(self, cache: str | None = None, *, timeout: float | None = None) -> None:
        conf = get_settings()
        self.alias = cache or conf.cache
        self.cache = caches[self.alias]
        self.client = _bounded(redis_client(self.cache), timeout or conf.timing.call_timeout)
        self.history_database = conf.database if conf.history else None
        self._history = HistoryWriter(conf.database) if conf.history else None
        self._acquire = self.client.register_script(scripts.ACQUIRE)
        self._renew = self.client.register_script(scripts.RENEW)
        self._renew_many = self.client.register_script(scripts.RENEW_MANY)
        self._release = self.client.register_script(scripts.RELEASE)
        self._force_release = self.client.register_script(scripts.FORCE_RELEASE)
        self._read = self.client.register_script(scripts.READ)
        self._announce = self.client.register_script(scripts.ANNOUNCE)
        self._candidates = self.client.register_script(scripts.CANDIDATES)
        self._handover = self.client.register_script(scripts.HANDOVER)
        self._hub: WakeHub | None = None
        self._hub_lock = threading.Lock()  # one hub, however many threads watch at once

    def __repr__(self) -> str:
        return f"<RedisBackend {self.alias!r}>"

    # -- what the admin, beat and checks need ---------------------------------------------
    #: Beat slot records are a hash beside the lease's keys, written by a Lua script that
    #: checks the lease first.
    shared_slots: ClassVar[bool] = True

    def now(self) -> datetime:
        """The Redis server's clock (``TIME``)."""
        import redis

        try:
            seconds, microseconds = self.client.time()
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc
        return datetime.fromtimestamp(int(seconds), dt_timezone.utc).replace(
            microsecond=int(microseconds)
        )

    def slots(self) -> RedisSlots:
        from .redis_slots import RedisSlots

        return RedisSlots(self)

    def describe(self) -> str:
        return (
            f"{type(self).__name__} (CacheBackend) {self.alias!r}: live state read from the "
            f"store; history from database {self.history_database or get_settings().database!r}."
        )

    @classmethod
    def check_configuration(cls, conf: LeaderSettings) -> list[CheckMessage]:
        """E004: ``DJANGO_LEADER["CACHE"]`` must name a Redis cache."""
        from django.core.cache.backends.base import InvalidCacheBackendError
        from django.core.checks import Error

        try:
            redis_client(caches[conf.cache])
        except (ImproperlyConfigured, InvalidCacheBackendError) as exc:
            return [
                Error(
                    f"DJANGO_LEADER['CACHE'] {conf.cache!r}: {exc}",
                    hint="Point CACHE at a cache using django_redis.cache.RedisCache or "
                    "django.core.cache.backends.redis.RedisCache, or use the database backend.",
                    id="django_leader.E004",
                )
            ]
        return []

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
                # still running, the store's lock-delay after a loss of state, or a
                # hand-over to another candidate.
                return None, None
            current = self._lease(name, [1, *reply[1:]])
            assert current is not None
            if len(reply) > 11:
                current.read_at = _time(reply[11])
            return None, current
        lease = self._lease(name, reply)
        assert lease is not None
        taken_over = bool(lease.previous_holder) and _text(reply[8]) == "0"
        if not taken_over:
            lease.previous_holder = ""
        self._record(
            EventKind.TAKEN_OVER if taken_over else EventKind.ACQUIRED,
            lease,
            lease.acquired_at,
            detail=f"lease of {lease.previous_holder} had expired" if taken_over else "",
        )
        return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        reply = self._call(
            self._renew,
            lease.name,
            lease.holder,
            lease.token,
            self._ms(ttl),
            lease.name,
            extra=(self.terms_key(),),
        )
        return self._renewed(lease.name, reply)

    def _renewed(self, name: str, reply: Any) -> Lease | None:
        """The lease a renewal script answered (with its standing hand-over request), or
        None if it refused."""
        renewed = self._lease(name, reply)
        if renewed is not None and len(reply) > 9:
            renewed.handover_to = _text(reply[9])
        return renewed

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases``: one script per ``BATCH`` (2,500) leases (each
        lease renewed or refused on its own, exactly as by ``renew``), all sent in one
        pipeline: one round trip for any count."""
        import redis

        if not leases:
            return []
        keys = list(dict.fromkeys((lease.name, lease.holder, lease.token) for lease in leases))
        chunks = [keys[start : start + BATCH] for start in range(0, len(keys), BATCH)]
        terms, ms = self.terms_key(), self._ms(ttl)
        calls = []
        for chunk in chunks:
            script_keys = [key for name, _, _ in chunk for key in self.keys(name)]
            args = [arg for name, holder, token in chunk for arg in (holder, token, name)]
            calls.append([len(script_keys) + 1, *script_keys, terms, ms, *args])
        replies: list[Any] = [None] * len(calls)
        try:
            pending = list(range(len(calls)))
            for _ in range(2):  # once more after loading the script (NOSCRIPT)
                pipe = self.client.pipeline(transaction=False)
                for index in pending:
                    pipe.evalsha(self._renew_many.sha, *calls[index])
                results = pipe.execute(raise_on_error=False)
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
                self._renew_many.sha = self.client.script_load(self._renew_many.script)
                pending = missing
            else:
                raise redis.exceptions.NoScriptError("renew_many: the script was not loaded")
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc
        found = {
            key: reply
            for chunk, chunk_replies in zip(chunks, replies, strict=True)
            for key, reply in zip(chunk, chunk_replies, strict=True)
        }
        return [
            self._renewed(lease.name, found[(lease.name, lease.holder, lease.token)])
            for lease in leases
        ]

    def release(self, lease: Lease) -> bool:
        at = int(
            self._call(
                self._release,
                lease.name,
                lease.holder,
                lease.token,
                lease.name,
                channel(self._channel_prefix, lease.name),
                extra=(self.terms_key(),),
            )
        )
        if at:
            self._record(EventKind.RELEASED, lease, _time(at))
        return bool(at)

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        reply = self._call(self._force_release, name)
        lease = self._lease(name, reply)
        if lease is not None:
            self._record(
                EventKind.FORCED_RELEASE, lease, _time(reply[9]), detail=detail, actor=actor
            )
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
            keys = list(self.client.scan_iter(match=pattern, count=500))
            found: set[str] = set()
            for start in range(0, len(keys), 1000):  # pipelined: not a round trip per name
                pipe = self.client.pipeline(transaction=False)
                for key in keys[start : start + 1000]:
                    pipe.hget(key, "name")
                found.update(_text(name) for name in pipe.execute() if name is not None)
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc
        return sorted(found)

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
        self._call(
            self._announce, name, candidate.identity, self._ms(ttl), info, parts=self._REGISTRY
        )

    def withdraw(self, name: str, identity: str) -> None:
        self._call(self._announce, name, identity, "", "{}", parts=self._REGISTRY)

    def candidates(self, name: str) -> list[Candidate] | None:
        from ..election import Candidate

        reply = self._call(self._candidates, name, parts=self._REGISTRY[:2])
        found = []
        for identity, raw in zip(reply[::2], reply[1::2], strict=True):
            info = json.loads(_text(raw))
            found.append(
                Candidate(
                    identity=_text(identity),
                    priority=int(info.get("priority", 0)),
                    host=str(info.get("host", "")),
                    pid=int(info.get("pid", 0)),
                    version=str(info.get("version", "")),
                    seq=int(info.get("seq", 0)),
                    joined_at=_time(info["joined"]) if info.get("joined") else None,
                    seen_at=_time(info["seen"]) if info.get("seen") else None,
                    expires_at=_time(info["expires"]) if info.get("expires") else None,
                )
            )
        return sorted(found, key=lambda candidate: candidate.seq)

    # -- wake-ups and hand-over -------------------------------------------------------------
    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """Pub/sub: one subscribed connection per process, shared by every watch. A release
        publishes on the name's channel in its own script (no extra round trip)."""
        with self._hub_lock:
            hub = self._hub
            if hub is None or not hub.usable():
                from .redis_listen import RedisListener

                hub = self._hub = WakeHub(RedisListener(self.client), f"leader-listen:{self.alias}")
        return hub.watch_lease(self._channel_prefix, name, identity, callback)

    def wake(self, name: str, identity: str | None = None) -> None:
        import redis

        try:
            self.client.publish(channel(self._channel_prefix, name, identity), "")
        except redis.RedisError as exc:
            raise BackendUnavailable(f"redis cache {self.alias!r}: {exc}") from exc

    @property
    def _channel_prefix(self) -> str:
        return str(self.cache.make_key("django_leader"))

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        reply = self._call(self._handover, name, to, self._ms(window))
        lease = self._lease(name, reply)
        at = _time(reply[9]) if lease is not None else _time(reply[1])
        self._record(
            EventKind.HANDOVER,
            lease or Lease(name, "", 0, None, None, None, 0),
            at,
            detail=detail or f"to {to}",
            actor=actor,
        )
        return lease

    def close(self) -> None:
        """Connections are pooled by redis-py and shared by threads: nothing per thread."""
