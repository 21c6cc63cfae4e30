"""The Redis backend's former module: ``"django_leader.backends.cache.CacheBackend"`` in
``DJANGO_LEADER["BACKEND"]`` keeps working.

:class:`CacheBackend` is :class:`~django_leader.backends.redis.RedisBackend` under its old
name (the same class: ``isinstance`` checks agree). New settings should name
``"django_leader.backends.redis.RedisBackend"``.
"""

from __future__ import annotations

from .redis import RedisBackend, redis_client

#: Another name for :class:`~django_leader.backends.redis.RedisBackend`.
CacheBackend = RedisBackend

__all__ = ["CacheBackend", "redis_client"]
