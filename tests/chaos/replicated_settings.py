"""The test project's settings for chaos candidates on a replicated store
(tests/chaos/replicated.py): django-redis through the run's Sentinels
(``CHAOS_SENTINELS``, ``CHAOS_SENTINEL_SERVICE``, ``CHAOS_REDIS_WAIT``), a Redis Cluster
(``CHAOS_CLUSTER``: its nodes, and ``CHAOS_REDIS_WAIT``), or PostgreSQL by
libpq multi-host over the run's primary and standby (``CHAOS_PG_PORTS``,
``CHAOS_PG_DATABASE``), or through the run's PgBouncer (``CHAOS_PG_BOUNCER``), whichever
the environment gives.
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import CACHES, DATABASES, DJANGO_LEADER

if os.environ.get("CHAOS_SENTINELS"):
    addresses = [a.rsplit(":", 1) for a in os.environ["CHAOS_SENTINELS"].split(",")]
    CACHES["redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{os.environ['CHAOS_SENTINEL_SERVICE']}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": [
                (host, int(port))
                for host, port in (
                    a.rsplit(":", 1) for a in os.environ["CHAOS_SENTINELS"].split(",")
                )
            ],
        },
    }
    DJANGO_LEADER["CACHE"] = "redis"
    DJANGO_LEADER["REDIS_WAIT_REPLICAS"] = int(os.environ.get("CHAOS_REDIS_WAIT", "1"))

if os.environ.get("CHAOS_CLUSTER"):
    CACHES["redis"] = {
        "BACKEND": "django_leader.backends.redis.RedisClusterCache",
        "LOCATION": [f"redis://{node}" for node in os.environ["CHAOS_CLUSTER"].split(",")],
    }
    DJANGO_LEADER["CACHE"] = "redis"
    DJANGO_LEADER["REDIS_WAIT_REPLICAS"] = int(os.environ.get("CHAOS_REDIS_WAIT", "1"))

if os.environ.get("CHAOS_PG_PORTS"):
    ports = os.environ["CHAOS_PG_PORTS"]
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": ",".join("127.0.0.1" for _ in ports.split(",")),
        "PORT": ports,
        "NAME": os.environ["CHAOS_PG_DATABASE"],
        "USER": "postgres",
        "PASSWORD": "",
        "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 2},
    }

if os.environ.get("CHAOS_PG_BOUNCER"):
    # Through the run's PgBouncer (transaction pooling), which points at the primary.
    DATABASES["default"].update(
        HOST="127.0.0.1", PORT=os.environ["CHAOS_PG_BOUNCER"], OPTIONS={"connect_timeout": 2}
    )
