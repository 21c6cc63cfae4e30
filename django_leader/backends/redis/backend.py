""":class:`RedisBackend`: leases in Redis (the package's docstring describes its keys and
what happens when Redis forgets). The operations live in the modules it is made of: leases
in :mod:`.leases`, batch renewal in :mod:`.batch`, candidates in :mod:`.registry`,
wake-ups in :mod:`.listen`, the beat's slot records in :mod:`.slots`; here, what the admin,
the beat and the checks need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from django_leader.backends.redis.batch import BatchRenewal
from django_leader.backends.redis.client import bounded, redis_client
from django_leader.backends.redis.cluster import LazyCluster
from django_leader.backends.redis.leases import RedisLeases
from django_leader.backends.redis.listen import WakeUps
from django_leader.backends.redis.registry import Registry
from django_leader.backends.redis.slots import RedisSlots
from django_leader.backends.redis.store import errors
from django_leader.conf import get_settings

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from django_leader.conf import LeaderSettings


class RedisBackend(RedisLeases, BatchRenewal, Registry, WakeUps):
    """Leases in the Redis behind ``DJANGO_LEADER["CACHE"]`` (default ``"default"``)."""

    def __repr__(self) -> str:
        return f"<RedisBackend {self.alias!r}>"

    # -- what the admin, beat and checks need ---------------------------------------------
    #: Beat slot records are a hash beside the lease's keys, written by a Lua script that
    #: checks the lease first.
    shared_slots: ClassVar[bool] = True

    def slots(self) -> RedisSlots:
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
                    "django.core.cache.backends.redis.RedisCache (on a Redis Cluster, "
                    "django_leader.backends.redis.RedisClusterCache), or use the database "
                    "backend.",
                    id="django_leader.E004",
                )
            ]
        return []

    @classmethod
    def check_replication(cls, conf: LeaderSettings, timeout: float) -> list[CheckMessage]:
        """W020/W021: what a failover can do with the replicas the primary has (see
        ``check_replicas`` below)."""
        try:
            client = redis_client(caches[conf.cache])
        except Exception:  # reported by check_configuration (E004)
            return []
        return check_replicas(conf, bounded(client, timeout))

    def close(self) -> None:
        """Connections are pooled by redis-py and shared by threads: nothing per thread."""


def check_replicas(conf: LeaderSettings, client: Any) -> list[CheckMessage]:
    """W020 when the primary has replicas (or stands behind Sentinels) and lease writes do
    not wait for any (``REDIS_WAIT_REPLICAS`` 0); W021 when they wait for more replicas
    than the primary has. Nothing when Redis does not answer (E-checks of the connection
    are the backend's calls' business)."""
    from django.core.checks import Warning
    from redis.cluster import RedisCluster
    from redis.sentinel import SentinelConnectionPool

    cluster = isinstance(client, LazyCluster)
    try:
        if cluster:  # the master with the fewest replicas
            found = client.info("replication", target_nodes=RedisCluster.PRIMARIES)
            counts = [info.get("connected_slaves", 0) for info in found.values()]
            replicas = min(int(count) for count in counts)
        else:
            replicas = int(client.info("replication").get("connected_slaves", 0))
    except errors():
        return []
    sentinel = not cluster and isinstance(client.connection_pool, SentinelConnectionPool)
    wait = conf.redis_wait_replicas
    where = f"DJANGO_LEADER['CACHE'] {conf.cache!r}"
    primary = "the Redis primary"
    if cluster:
        primary = "the Redis Cluster master with the fewest replicas"
    if wait == 0 and (replicas or sentinel):
        return [
            Warning(
                f"{where}: {primary} has {replicas} replica(s)"
                f"{' behind Sentinels' if sentinel else ''} and lease writes do not wait for "
                "any (REDIS_WAIT_REPLICAS is 0). A failover may promote a replica that "
                "missed a lease write (the lock-delay then covers it), but a primary split "
                "off by the failover goes on renewing its holder's lease while another "
                "candidate leads through the new primary: two leaders.",
                hint="Set DJANGO_LEADER['REDIS_WAIT_REPLICAS'] to 1 or more (at most the "
                "replicas the primary keeps); see docs/production.md.",
                id="django_leader.W020",
            )
        ]
    if wait > replicas:
        return [
            Warning(
                f"{where}: REDIS_WAIT_REPLICAS is {wait} but {primary} has "
                f"{replicas} replica(s) connected: every lease write fails until {wait} are.",
                hint="Lower DJANGO_LEADER['REDIS_WAIT_REPLICAS'] or add replicas.",
                id="django_leader.W021",
            )
        ]
    return []
