""":class:`RedisBackend`: leases in Redis (the package's docstring describes its keys and
what happens when Redis forgets). The operations live in the modules it is made of: leases
in :mod:`.leases`, batch renewal in :mod:`.batch`, candidates in :mod:`.registry`,
wake-ups in :mod:`.listen`, the beat's slot records in :mod:`.slots`; here, what the admin,
the beat and the checks need."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from django_leader.backends.redis.batch import BatchRenewal
from django_leader.backends.redis.client import redis_client
from django_leader.backends.redis.leases import RedisLeases
from django_leader.backends.redis.listen import WakeUps
from django_leader.backends.redis.registry import Registry
from django_leader.backends.redis.slots import RedisSlots
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
                    "django.core.cache.backends.redis.RedisCache, or use the database backend.",
                    id="django_leader.E004",
                )
            ]
        return []

    def close(self) -> None:
        """Connections are pooled by redis-py and shared by threads: nothing per thread."""
