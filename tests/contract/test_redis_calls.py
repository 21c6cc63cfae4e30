"""The Redis backend's own script calls (``backends/redis/call.py``), which replace
redis-py's ``Script.__call__`` and pipelines on the lease operations' path: the same bytes
on the wire, the same replies and errors, every connection given back to the pool, a
script the server forgot loaded again, a connection the server dropped failing one call
only (the rest of the Redis suite runs every lease operation through them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_leader.backends.redis.call import call_all, call_script, pack
from django_leader.exceptions import BackendUnavailable
from tests.contract.test_store_faults import drop_connections
from tests.support.stores import CACHE_STORES, open_store, stores_db

redis = pytest.importorskip("redis")
pytestmark = stores_db


@pytest.fixture(params=list(CACHE_STORES))
def redis_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_store(request.param)


def made(pool: Any) -> list[Any]:
    """Every connection ``pool`` holds (free or in use)."""
    found = getattr(pool, "_connections", None)  # a BlockingConnectionPool
    if found is None:
        found = [*pool._available_connections, *pool._in_use_connections]
    return list(found)


def test_pack_is_what_redis_py_sends() -> None:
    connection = redis.Connection()  # packing needs no server
    parts = ("EVALSHA", "0" * 40, 2, "k:{é}", b"raw\r\nbytes", "", 15, 1.5, -3, 2**70)
    assert pack(connection, parts) == b"".join(connection.pack_command(*parts))
    with pytest.raises(redis.DataError):  # what redis-py refuses, refused alike
        pack(connection, ("SET", "k", True))


def test_a_script_answers_as_through_redis_py(redis_store: Any, lease_name: str) -> None:
    client = redis_store.client
    script = client.register_script("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    keys, args = [f"{lease_name}:k"], ["é\r\n", 41]
    assert call_script(client, script, keys, args) == script(keys=keys, args=args)
    assert call_script(client, script, keys, args)[2] == 42


def test_a_script_the_server_does_not_know_is_loaded_and_sent_again(
    redis_store: Any, lease_name: str
) -> None:
    client = redis_store.client
    script = client.register_script("return ARGV[1] .. '!'")
    real = script.sha
    script.sha = "0" * 40  # as after SCRIPT FLUSH or a restart
    assert call_script(client, script, [f"{lease_name}:k"], ["again"]) == b"again!"
    assert script.sha == real


def test_an_error_reply_is_raised_and_the_connection_serves_on(
    redis_store: Any, lease_name: str
) -> None:
    client = redis_store.client
    key = f"{lease_name}:hash"
    client.hset(key, "field", "1")
    try:
        wrong = client.register_script("return redis.call('INCR', KEYS[1])")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            call_script(client, wrong, [key], [])
        pool = client.connection_pool
        before = len(made(pool))
        for _ in range(5):
            lease, _ = redis_store.acquire(lease_name, "alice", 30)
            assert lease is not None and redis_store.release(lease)
        assert len(made(pool)) == before  # one connection, given back after each call
    finally:
        client.delete(key)


def test_a_pipeline_answers_each_command_in_order_errors_in_place(redis_store: Any) -> None:
    client = redis_store.client
    replies = call_all(client, [("PING",), ("EVALSHA", "0" * 40, 0), ("ECHO", "é")])
    assert replies[0] in (b"PONG", "PONG", True)
    assert isinstance(replies[1], redis.exceptions.NoScriptError)
    assert replies[2] == "é".encode()


def test_a_connection_the_server_dropped_fails_one_call_and_the_next_reconnects(
    redis_store: Any, lease_name: str
) -> None:
    client = redis_store.client
    lease, _ = redis_store.acquire(lease_name, "alice", 30)
    assert lease is not None
    # Every connection of the pool that is open, killed on the server by the helper of
    # the store-fault tests.
    opened = sum(conn._sock is not None for conn in made(client.connection_pool))
    assert opened
    assert drop_connections(redis_store) == opened
    outcomes: list[bool] = []
    for _ in range(2):
        try:
            renewed = redis_store.renew(lease, 30)
        except BackendUnavailable:
            outcomes.append(False)
        else:
            assert renewed is not None and renewed.token == lease.token
            outcomes.append(True)
    assert outcomes in ([False, True], [True, True]), outcomes
    assert redis_store.release(lease)


@pytest.mark.parametrize("project_limit", [None, 2**31, 50, 500])
def test_the_bounded_pool_has_a_limit_it_can_make(
    project_limit: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py before 6 gives a pool without ``max_connections`` a limit of 2**31, and its
    ``BlockingConnectionPool`` fills a queue with one slot per connection allowed: the
    backend's bounded pool, made with that limit, never finished being made (every
    process with Django's ``RedisCache`` on redis-py 4.5 or 5 hung there, its memory
    growing). The limit is the project's, at least 100, at most ``MAX_CONNECTIONS``."""
    from redis import BlockingConnectionPool

    from django_leader.backends.redis import client as client_module

    made: dict[str, Any] = {}

    class Recorded(BlockingConnectionPool):
        def __init__(self, **kwargs: Any) -> None:
            made.update(kwargs)
            super().__init__(**{**kwargs, "max_connections": 10})

    monkeypatch.setattr(redis, "BlockingConnectionPool", Recorded)
    project = redis.ConnectionPool(host="127.0.0.1", port=6379)
    project.max_connections = project_limit if project_limit is not None else 2**31
    client_module.bounded(redis.Redis(connection_pool=project), 1.0)
    expected = {None: 100, 2**31: 100, 50: 100, 500: 500}[project_limit]
    assert made["max_connections"] == expected
    assert made["max_connections"] <= client_module.MAX_CONNECTIONS
