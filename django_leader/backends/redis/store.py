"""What every part of the Redis backend shares: the cache and its bounded client, the
registered Lua scripts, the key names, a script call that turns Redis's errors into
:class:`~django_leader.exceptions.BackendUnavailable`, and the decoding of a script's
reply into a :class:`~django_leader.lease.Lease`."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.core.cache import caches

from django_leader.backends.base import Backend
from django_leader.backends.history import HistoryWriter, WrittenAfterwards
from django_leader.backends.redis.call import call_all, call_script
from django_leader.backends.redis.client import bounded, redis_client
from django_leader.backends.redis.cluster import LazyCluster, slot_tag, slot_tags
from django_leader.backends.redis.scripts import (
    ACQUIRE,
    ANNOUNCE,
    CANDIDATES,
    FORCE_RELEASE,
    HANDOVER,
    INITIALIZE,
    NEXT_IN_LINE,
    PRUNE,
    READ,
    RELEASE,
    RENEW,
    RENEW_MANY,
)
from django_leader.backends.wakeups import WakeHub
from django_leader.conf import get_settings
from django_leader.exceptions import BackendUnavailable
from django_leader.forksafe import ForkSafeLock
from django_leader.lease import Lease

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
#: A reply not yet received.
_PENDING = object()
#: Calls to send to one server: its client, the calls' indexes, whether ``ASKING`` first.
Route = tuple[Any, list[int], bool]


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


def errors() -> tuple[type[Exception], ...]:
    """What redis-py raises for a store that cannot answer (a cluster's errors are not all
    ``RedisError``)."""
    import redis
    from redis.exceptions import RedisClusterException

    return (redis.RedisError, RedisClusterException)


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
        #: A Redis Cluster: the store marker and the terms are kept per hash slot.
        self.cluster = isinstance(self.client, LazyCluster)
        if not self.cluster and _driver_bounded(self.client, call_timeout):
            # A free connection from the pool, connecting, the answer: each within it.
            self.driver_bound = 3 * call_timeout
        #: On a single Redis, the store-wide keys (:meth:`store_key`, :meth:`terms_key`).
        self._store_wide = {
            part: str(self.cache.make_key(f"django_leader:{part}")) for part in ("store", "terms")
        }
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
        self._next_in_line = self.client.register_script(NEXT_IN_LINE)
        self._handover = self.client.register_script(HANDOVER)
        self._prune = self.client.register_script(PRUNE)
        self._initialize = self.client.register_script(INITIALIZE)
        self._hub: WakeHub | None = None
        self._hub_lock = ForkSafeLock()  # one hub, however many threads watch at once

    # -- key names ----------------------------------------------------------------------------
    def keys(self, name: str, parts: tuple[str, ...] = ("lease", "meta")) -> list[str]:
        """The lease and meta keys of ``name`` (same hash tag, so one Cluster slot): see
        :func:`hash_tag`."""
        tag = hash_tag(name)
        return [str(self.cache.make_key(f"django_leader:{{{tag}}}:{part}")) for part in parts]

    def store_key(self, name: str) -> str:
        """The store marker that ``name``'s acquisitions check: which server process last
        wrote, and any lock-delay running. One per store; on a cluster, one per slot."""
        return self._beside(name, "store")

    def terms_key(self, name: str) -> str:
        """The hash of lease names to the end of their last term (server microseconds) that
        holds ``name``'s: one per store; on a cluster, one per slot."""
        return self._beside(name, "terms")

    def _beside(self, name: str, part: str) -> str:
        if not self.cluster:
            return self._store_wide[part]
        return self._tagged(slot_tag(self.keys(name)[0]), part)

    def _tagged(self, tag: str, part: str) -> str:
        return str(self.cache.make_key(f"django_leader:{{{tag}}}:{part}"))

    def store_keys(self) -> list[str]:
        """Every store marker: the store's one; on a cluster, one per slot."""
        if not self.cluster:
            return [self._store_wide["store"]]
        return sorted(self._tagged(tag, "store") for tag in slot_tags())

    @property
    def _channel_prefix(self) -> str:
        return str(self.cache.make_key("django_leader"))

    # -- calls ----------------------------------------------------------------------------------
    def unavailable(self, exc: Exception) -> BackendUnavailable:
        """The error a caller sees for Redis's ``exc`` (raise it ``from exc``)."""
        return BackendUnavailable(f"redis cache {self.alias!r}: {exc}")

    def now(self) -> datetime:
        """The Redis server's clock (``TIME``)."""
        try:
            seconds, microseconds = self.client.time()
        except errors() as exc:
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
        keys = [*self.keys(name, parts), *extra]
        # Without WAIT, one server: the script alone (a pipeline of one costs more).
        if durable and (self.wait_replicas > 0 or self.cluster):
            return self.pipelined(script, [[len(keys), *keys, *args]], durable=True)[0]
        try:
            if self.cluster:  # redis-py routes it to the slot's master
                return script(keys=keys, args=list(args))
            return call_script(self.client, script, keys, args)
        except errors() as exc:
            raise self.unavailable(exc) from exc

    def _call_each(
        self, script: Any, names: Sequence[str], *, parts: tuple[str, ...], batch: int = 1000
    ) -> list[Any]:
        """``script`` on the keys (``parts``) of each of ``names``, no arguments, ``batch``
        calls per pipeline: the replies in order (a read of many names, a round trip per
        batch)."""
        replies: list[Any] = []
        for start in range(0, len(names), batch):
            calls = []
            for name in names[start : start + batch]:
                keys = self.keys(name, parts)
                calls.append([len(keys), *keys])
            replies += self.pipelined(script, calls, durable=False)
        return replies

    def pipelined(self, script: Any, calls: list[list[Any]], *, durable: bool) -> list[Any]:
        """``EVALSHA script`` with each of ``calls`` (numkeys, keys, args) in one pipeline per
        server (one round trip on a single Redis; on a cluster, one per master concerned):
        the replies in order. A ``durable`` pipeline ends with ``WAIT``: if fewer than
        ``REDIS_WAIT_REPLICAS`` replicas confirm its writes within :attr:`wait_ms`,
        :class:`NotConfirmed` carries the replies. A script the server does not know is
        loaded and sent again; on a cluster, a call redirected (MOVED, or ASK while its slot
        migrates: neither ran) is sent again where it was redirected to."""
        from redis.exceptions import RedisError

        replies: list[Any] = [_PENDING] * len(calls)
        confirmed: int | None = None
        try:
            routes = self._routes(list(range(len(calls))), calls)
            for _ in range(3):  # once more after a NOSCRIPT, once more after a redirection
                again: list[Route] = []
                for route in routes:
                    acked, redo = self._send(route, script, calls, replies, durable)
                    if acked is not None:
                        confirmed = acked if confirmed is None else min(confirmed, acked)
                    again += redo
                if not again:
                    break
                routes = again
            else:
                raise RedisError("a call was redirected or refused its script too often")
        except errors() as exc:
            if self.cluster:
                # A master gone or failed over: learn the cluster's layout anew for the
                # next call (redis-py does so for the calls it routes itself).
                with contextlib.suppress(*errors()):
                    self.client.nodes_manager.initialize()
            raise self.unavailable(exc) from exc
        if confirmed is not None and confirmed < self.wait_replicas:
            raise NotConfirmed(
                f"redis cache {self.alias!r}: a lease write reached {confirmed} of the "
                f"{self.wait_replicas} replicas DJANGO_LEADER['REDIS_WAIT_REPLICAS'] asks for "
                f"within {self.wait_ms} ms; it does not count (a failover could lose it)",
                replies,
            )
        return replies

    def _routes(self, indexes: list[int], calls: list[list[Any]]) -> list[Route]:
        """``calls`` (by index) grouped by the server that serves their first key's slot:
        (the server's client, the indexes, whether to send ``ASKING`` first)."""
        if not self.cluster:
            return [(self.client, indexes, False)]
        cluster = self.client.get()
        found: dict[str, Route] = {}
        for index in indexes:
            node = cluster.get_node_from_key(calls[index][1])
            found.setdefault(node.name, (cluster.get_redis_connection(node), [], False))
            found[node.name][1].append(index)
        return list(found.values())

    def _send(
        self, route: Route, script: Any, calls: list[list[Any]], replies: list[Any], durable: bool
    ) -> tuple[int | None, list[Route]]:
        """One pipeline to one server: the calls of ``route`` (their replies filled in),
        then ``WAIT`` if ``durable`` (it covers the writes sent before it on the same
        connection: this pipeline's). Returns the replicas ``WAIT`` counted (None without
        it) and the routes of the calls to send again."""
        from redis.exceptions import AskError, MovedError, NoScriptError

        server, indexes, asking = route
        wait = durable and self.wait_replicas > 0
        commands: list[Sequence[Any]] = []
        for index in indexes:
            if asking:
                commands.append(("ASKING",))
            commands.append(("EVALSHA", script.sha, *calls[index]))
        if wait:
            commands.append(("WAIT", self.wait_replicas, self.wait_ms))
        results = call_all(server, commands)
        acked = results.pop() if wait else None
        if asking:
            results = results[1::2]
        unknown, moved, redo = [], [], []
        for index, result in zip(indexes, results, strict=True):
            if isinstance(result, NoScriptError):
                unknown.append(index)
            elif isinstance(result, MovedError):  # (a kind of AskError: test it first)
                self.client.nodes_manager.move_slot(result)
                moved.append(index)
            elif isinstance(result, AskError):
                target = self.client.get_node(host=result.host, port=result.port)
                if target is None:
                    raise result
                redo.append((self.client.get_redis_connection(target), [index], True))
            elif isinstance(result, Exception):
                raise result
            else:
                replies[index] = result
        if unknown:
            script.sha = server.script_load(script.script)
            redo.append((server, unknown, asking))
        if moved:
            redo += self._routes(moved, calls)
        if not any(replies[index] is not _PENDING for index in indexes):
            # Nothing ran here (every call redirected, or its script unknown): no write
            # for WAIT to count, and a master demoted to replica refuses WAIT anyway.
            return None, redo
        if isinstance(acked, Exception):
            raise acked
        return (None if acked is None else int(acked)), redo

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


def _driver_bounded(client: Any, timeout: float) -> bool:
    """Whether every call of ``client`` ends within a few ``timeout`` by redis-py's own
    timeouts: the blocking pool of one server that :func:`bounded` made (not a cluster's
    redirections, nor the Sentinels asked one after the other, nor a pool of the project's
    own)."""
    import redis

    pool = getattr(client, "connection_pool", None)
    return (
        type(pool) is redis.BlockingConnectionPool
        and pool.timeout == timeout
        and pool.connection_kwargs.get("socket_timeout") == timeout
        and pool.connection_kwargs.get("socket_connect_timeout") == timeout
    )
