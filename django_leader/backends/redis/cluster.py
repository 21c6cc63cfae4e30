"""Redis Cluster: a Django cache on a cluster (:class:`RedisClusterCache`), the cluster
client the backend uses (:class:`LazyCluster`, connected on first use), and the per-slot
keys that take the place of the store-wide ones (:func:`slot_tag`).

On a cluster a script may only touch keys of one hash slot. A lease's own keys share its
name's hash tag; the store marker and the registry of terms, store-wide on a single Redis,
are kept once per slot instead (``django_leader:{<slot tag>}:store`` and ``:terms``, where
the slot tag is a short string of that slot), so that every lease script still runs on one
node, atomically. Each master's ``run_id`` is then checked for the slots it serves: a
failover of one master starts the lock-delay for the leases of its slots only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

from django_leader.forksafe import ForkSafeLock

#: Hash slots of a Redis Cluster.
SLOTS = 16384


@lru_cache(maxsize=1)
def slot_tags() -> tuple[str, ...]:
    """For each hash slot, the shortest decimal string that hashes to it (about 0.2 s to
    find them all, once per process, only on a cluster): the store markers of a whole
    cluster are under these."""
    from redis.crc import key_slot

    tags: list[str | None] = [None] * SLOTS
    missing, number = SLOTS, 0
    while missing:
        tag = str(number)
        slot = key_slot(tag.encode())
        if tags[slot] is None:
            tags[slot] = tag
            missing -= 1
        number += 1
    return tuple(tag for tag in tags if tag is not None)


def slot_tag(key: str) -> str:
    """A hash tag whose keys hash to the same slot as ``key``. (A key prefix with braces of
    its own puts every key in the prefix's slot, this one's too.)"""
    from redis.crc import key_slot

    return slot_tags()[key_slot(key.encode())]


class LazyCluster:
    """A ``redis.cluster.RedisCluster`` made on first use: its constructor connects to the
    cluster, which a backend made while the cluster is down must not need. Every attribute
    but the ones below is the client's; a failure to connect raises the cluster's error
    there, as any call to a down store does."""

    def __init__(self, startup_nodes: list[tuple[str, int]], **kwargs: Any) -> None:
        self.startup_nodes = startup_nodes
        self.kwargs = kwargs
        self._client: Any = None
        self._lock = ForkSafeLock()

    def get(self) -> Any:
        """The ``RedisCluster``, connected now if it was not."""
        if self._client is None:
            from redis.cluster import ClusterNode, RedisCluster

            with self._lock:
                if self._client is None:
                    nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
                    self._client = RedisCluster(startup_nodes=nodes, **self.kwargs)
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)

    def get_encoder(self) -> Any:
        """The encoder of the client's settings (for a script's digest): no connection."""
        from redis.connection import Encoder

        return Encoder(
            self.kwargs.get("encoding", "utf-8"),
            self.kwargs.get("encoding_errors", "strict"),
            self.kwargs.get("decode_responses", False),
        )

    def register_script(self, script: str) -> Any:
        from redis.commands.core import Script

        return Script(self, script)  # type: ignore[arg-type]  # a RedisCluster on use

    def bounded(self, timeout: float) -> LazyCluster:
        """The same cluster, every call to a node bounded by ``timeout`` seconds, with no
        retry of its own (the election loop retries, on its own schedule), following MOVED
        and ASK as redis-py does, and usable while a failover leaves some slots without a
        master (only the leases in those slots are unavailable)."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs = {**self.kwargs, "socket_timeout": timeout, "socket_connect_timeout": timeout}
        kwargs.pop("retry_on_timeout", None)
        kwargs.update(retry=Retry(NoBackoff(), 0), require_full_coverage=False)
        return LazyCluster(self.startup_nodes, **kwargs)

    @classmethod
    def like(cls, client: Any) -> LazyCluster:
        """A lazy copy of a connected ``RedisCluster`` (from a cache of another package)."""
        from redis.cluster import cleanup_kwargs

        nodes = [(node.host, node.port) for node in client.get_nodes()]
        return cls(nodes, **cleanup_kwargs(**client.nodes_manager.connection_kwargs))


class ClusterCacheClient(RedisCacheClient):
    """Django's Redis cache client, on a cluster: one ``RedisCluster`` for reads and
    writes; the calls over many keys split by slot."""

    def __init__(self, servers: list[str], serializer: Any = None, **options: Any) -> None:
        super().__init__(servers, serializer=serializer)
        from urllib.parse import urlsplit

        nodes = [urlsplit(server if "//" in server else f"redis://{server}") for server in servers]
        # The first node's URL gives the credentials and TLS, unless OPTIONS does.
        if nodes[0].scheme == "rediss":
            options.setdefault("ssl", True)
        if nodes[0].password:
            options.setdefault("password", nodes[0].password)
        if nodes[0].username:
            options.setdefault("username", nodes[0].username)
        addresses = [(node.hostname or "127.0.0.1", node.port or 6379) for node in nodes]
        self.cluster = LazyCluster(addresses, **options)

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        return self.cluster.get()

    def get_many(self, keys: Any) -> dict[Any, Any]:
        client = self.get_client(None)
        found = client.mget_nonatomic(keys)
        return {k: self._serializer.loads(v) for k, v in zip(keys, found, strict=True) if v}

    def set_many(self, data: dict[Any, Any], timeout: Any) -> None:
        for key, value in data.items():
            self.set(key, value, timeout)

    def clear(self) -> bool:
        from redis.cluster import RedisCluster

        return bool(self.get_client(None).flushdb(target_nodes=RedisCluster.PRIMARIES))


class RedisClusterCache(RedisCache):
    """A Django cache on a Redis Cluster, for ``DJANGO_LEADER["CACHE"]``: ``LOCATION`` is one
    or more nodes (``redis://host:port``, comma-separated or a list; the others are found
    from them); ``OPTIONS`` are passed to ``redis.cluster.RedisCluster`` (``password``,
    ``ssl``, ``socket_timeout``…). It works as a plain Django cache too."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class: Callable[..., Any] = ClusterCacheClient
