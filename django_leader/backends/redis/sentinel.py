"""A Django cache on Redis behind Sentinels, from one URL, for projects without
django-redis: :class:`RedisSentinelCache`.

``LOCATION`` is ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]``
(the scheme of the ``redis-sentinel-url`` package; ``rediss+sentinel://`` for TLS to the
data nodes): the Sentinels, the service name they monitor, the database. Every client it
gives talks to the primary the Sentinels name, through redis-py's
``SentinelConnectionPool``, which the lease backend bounds in time as it bounds any pool
(client.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.core.exceptions import ImproperlyConfigured

SCHEMES = ("redis+sentinel", "rediss+sentinel")


def parse(location: str) -> dict[str, Any]:
    """The Sentinels, service, database and credentials of a ``redis+sentinel://`` URL;
    ImproperlyConfigured (the URL's shape, never its password) if it is not one."""
    parts = urlsplit(location)
    path = [part for part in parts.path.split("/") if part]
    netloc = parts.netloc.rpartition("@")[2]
    shape = f"{parts.scheme}://…/{'/'.join(path)}"
    if parts.scheme not in SCHEMES or not netloc or not 1 <= len(path) <= 2:
        raise ImproperlyConfigured(
            f"a Sentinel LOCATION is redis+sentinel://[[user]:password@]host:port[,host:port…]"
            f"/service[/db], got {shape!r}"
        )
    sentinels = []
    for address in netloc.split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ImproperlyConfigured(f"a Sentinel address is host:port, got {address!r}")
        sentinels.append((host.strip("[]"), int(port)))
    if len(path) == 2 and not path[1].isdigit():
        raise ImproperlyConfigured(f"the database of {shape!r} is a number")
    return {
        "sentinels": sentinels,
        "service": unquote(path[0]),
        "db": int(path[1]) if len(path) == 2 else 0,
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "ssl": parts.scheme == "rediss+sentinel",
    }


class SentinelCacheClient(RedisCacheClient):
    """Django's Redis cache client, every connection to the primary the Sentinels name."""

    def __init__(self, servers: list[str], serializer: Any = None, **options: Any) -> None:
        super().__init__(servers, serializer=serializer)
        if len(servers) != 1:
            raise ImproperlyConfigured("a Sentinel LOCATION is one redis+sentinel:// URL")
        self.target = parse(servers[0])
        #: For redis-py's clients: socket timeouts and the like (the Sentinels' own in
        #: ``sentinel_kwargs``).
        self.options = options
        self._client_made: Any = None

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        if self._client_made is None:
            import redis
            from redis.sentinel import Sentinel, SentinelConnectionPool

            target, options = self.target, dict(self.options)
            credentials = {"username": target["username"], "password": target["password"]}
            sentinel_kwargs = options.pop("sentinel_kwargs", None) or {}
            if target["ssl"]:
                options.setdefault("connection_class", redis.SSLConnection)
            manager = Sentinel(target["sentinels"], sentinel_kwargs=sentinel_kwargs)
            pool = SentinelConnectionPool(
                target["service"], manager, db=target["db"], **credentials, **options
            )
            self._client_made = redis.Redis(connection_pool=pool)
        return self._client_made


class RedisSentinelCache(RedisCache):
    """A Django cache on the primary of a Redis behind Sentinels, named by one URL (see the
    module docstring); ``OPTIONS`` go to redis-py's connections (``socket_timeout``…;
    ``sentinel_kwargs`` to the Sentinels'). For ``DJANGO_LEADER["CACHE"]``, or as a plain
    cache."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        # One URL, whose commas separate Sentinels (Django would split it into servers).
        self._servers = [server] if isinstance(server, str) else list(server)
        self._class = SentinelCacheClient
