"""The Redis connection: the redis-py client behind a Django cache, and a copy of it whose
every call is bounded in time."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


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

    from django_leader.backends.redis.cluster import LazyCluster, RedisClusterCache

    if isinstance(cache, RedisClusterCache):
        return cache._cache.cluster
    try:
        if isinstance(cache, RedisCache):
            client = cache._cache.get_client(None, write=True)
        elif hasattr(cache, "client") and hasattr(cache.client, "get_client"):  # django-redis
            client = cache.client.get_client(write=True)
    except NotImplementedError:  # e.g. django-redis's ShardClient: no single server
        client = None
    if isinstance(client, redis.cluster.RedisCluster):  # another package's cluster cache
        return LazyCluster.like(client)
    if not isinstance(client, redis.Redis):
        raise ImproperlyConfigured(
            f"django_leader's Redis backend needs a Redis cache (django-redis or "
            f"django.core.cache.backends.redis.RedisCache, or on a cluster "
            f"django_leader.backends.redis.RedisClusterCache), got {type(cache).__module__}."
            f"{type(cache).__qualname__}: only Redis gives an atomic compare-and-set "
            "across processes"
        )
    return client


def bounded(client: Any, timeout: float) -> Any:
    """A client on the same server whose every call is bounded by ``timeout`` seconds.

    For a cluster (:class:`~django_leader.backends.redis.cluster.LazyCluster`), every call
    to a node.
    For a plain connection pool, and for a Sentinel pool (django-redis's ``SentinelClient``):
    then the Sentinels are asked for the primary with the same bound, and every new
    connection goes to the primary they name (after a failover, the promoted replica).
    Other pools are used as configured (set their ``socket_timeout`` yourself).
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel, SentinelConnectionPool

    from django_leader.backends.redis.cluster import LazyCluster

    if isinstance(client, LazyCluster):
        return client.bounded(timeout)
    pool = client.connection_pool
    sentinel = type(pool) is SentinelConnectionPool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool) and not sentinel:
        return client
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = timeout
    kwargs["socket_connect_timeout"] = timeout
    kwargs["retry"] = Retry(NoBackoff(), 0)  # the election loop retries, on its own schedule
    kwargs.pop("retry_on_timeout", None)
    if sentinel:
        kwargs.pop("connection_pool", None)  # the pool's proxy, made anew below
        manager = pool.sentinel_manager
        asked = {**manager.sentinel_kwargs, "socket_timeout": timeout,
                 "socket_connect_timeout": timeout}  # fmt: skip
        found = [s.connection_pool.connection_kwargs for s in manager.sentinels]
        addresses = [(address["host"], address["port"]) for address in found]
        manager = Sentinel(
            addresses, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=asked
        )
        # Always the primary: a lease is written, and read, where it is decided.
        return redis.Redis(
            connection_pool=SentinelConnectionPool(
                pool.service_name, manager, is_master=True,
                check_connection=pool.check_connection,
                connection_class=pool.connection_class, **kwargs,
            )
        )  # fmt: skip
    # A blocking pool: a call beyond max_connections at once waits for a free connection
    # (within the bound) instead of failing with "Too many connections" — one process may
    # run many Electors and locks.
    return redis.Redis(
        connection_pool=redis.BlockingConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool_limit(getattr(pool, "max_connections", None)),
            timeout=timeout,
            **kwargs,
        )
    )


#: The most connections the backend's own pool allows a process: a blocking pool makes a
#: slot for each when it is made.
MAX_CONNECTIONS = 10_000
#: What redis-py before 6 gives a pool made without a limit (none, in effect).
_UNLIMITED = 2**31


def pool_limit(project: int | None) -> int:
    """The limit of the backend's own pool: the project pool's ``max_connections``, at
    least 100 (also when it sets none), at most :data:`MAX_CONNECTIONS`."""
    if not project or project >= _UNLIMITED:
        return 100
    return max(100, min(int(project), MAX_CONNECTIONS))
