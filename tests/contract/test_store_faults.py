"""A store that drops every connection (what a restart, a failover or a proxy does to its
clients): the leader reconnects at its next renewal and keeps its term.

The connections are killed on the server (``pg_terminate_backend``, MariaDB's ``KILL``,
Redis's ``CLIENT KILL``), which the client only notices at its next call, as after a real
restart. Only this test's own connections are killed: the test database's (databases),
or the elector's own sockets (Redis, whose database 9 other runs may share).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_leader import Elector
from tests.support.stores import answered, open_store, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

# SQLite has no server and no connections to drop: the fault does not exist there.
SERVER_STORES = ["postgresql", "mysql", "redis", "django-redis"]
TIMING: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.5, "retry_interval": 0.2}
WAIT = 15.0


@pytest.fixture(params=SERVER_STORES)
def server_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_store(request.param)


def drop_connections(backend: Any) -> int:
    """Kill, on the server, the store connections this test opened; how many were killed."""
    from django_leader.backends.cache import CacheBackend

    if isinstance(backend, CacheBackend):
        import redis

        pool = backend.client.connection_pool
        # A BlockingConnectionPool lists every connection it made; a ConnectionPool, those
        # free and those in use.
        made = getattr(pool, "_connections", None)
        if made is None:
            made = [*pool._available_connections, *pool._in_use_connections]
        mine = {
            "%s:%s" % conn._sock.getsockname()[:2]  # noqa: UP031 - ip:port as Redis lists it
            for conn in made
            if conn._sock is not None
        }
        # From a connection of its own: CLIENT KILL never kills the connection it runs on.
        killer = redis.Redis(
            connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class, **pool.connection_kwargs
            )
        )
        try:
            return sum(
                killer.client_kill_filter(_id=client["id"])
                for client in killer.client_list()
                if client["addr"] in mine
            )
        finally:
            killer.close()
    connection = connections[backend.alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT id FROM information_schema.PROCESSLIST "
            "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        ids = [row[0] for row in cursor.fetchall()]
        for connection_id in ids:
            cursor.execute(f"KILL {int(connection_id)}")
        return len(ids)


def test_leader_keeps_its_term_when_the_store_drops_every_connection(
    server_store: Any, lease_name: str
) -> None:
    backend = server_store
    elector = Elector(lease_name, identity="survivor", backend=backend, **TIMING)
    elector.start()
    try:
        assert elector.wait_for_leadership(WAIT)
        lease = elector.lease
        assert lease is not None
        # A renewal went through: the renewer's connection is open, and idle till the next.
        granted = lease.renewed_at
        wait_until(lambda: lease.renewed_at != granted, timeout=WAIT, message="no renewal")

        assert drop_connections(backend) >= 1
        # This test's connection died too: a few quick tries while it reconnects.
        dropped_at = answered(backend.read, lease_name, timeout=0.15)
        assert dropped_at is not None

        # Renewals go on over new connections: the same term, renewed after the kill,
        # and well past the TTL that a failed renewal would have let run out (a fixed
        # sleep: holding on that long is what is tested).
        time.sleep(TIMING["ttl"] + 1.0)
        assert elector.is_leader and not lease.lost.is_set(), lease.lost_reason
        now = backend.read(lease_name)
        assert now is not None and (now.holder, now.token) == ("survivor", lease.token)
        assert now.renewed_at > dropped_at.renewed_at
    finally:
        elector.stop(timeout=WAIT)
    assert backend.read(lease_name) is None  # and the release went through too
