"""What reading the head of a queue costs the store: the same with 500 candidates waiting
as with 10, on Redis (commands run, those inside the backend's scripts included: a
private ``redis-server`` whose ``INFO commandstats`` only this test moves) and on ZooKeeper
(requests the client sends).

A fifo hand-over reads the head of the queue (``Backend.next_in_line``). It used to read
the whole registry: on Redis one script that ran an ``HGET`` per candidate (999 commands
per hand-over at 500 waiting, issue 30), on ZooKeeper one ``get`` per candidate. Before
``next_in_line`` the hand-over read ``candidates()``, which these tests show to grow with
the queue."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leader.backends.base import Backend
from django_leader.election import Candidate
from tests.support.redis_server import RedisServer
from tests.support.stores import open_store, stores_db

pytestmark = stores_db

SIZES = (10, 500)
#: What a queue's length may add: nothing, give or take the odd command of a server.
SLACK = 2


def queue_of(backend: Backend, name: str, size: int) -> None:
    for index in range(size):
        backend.announce(name, Candidate(f"c{index:04d}", priority=index % 3), 60)


def cost(count: Callable[[], int], call: Callable[[], Any]) -> int:
    before = count()
    call()
    return count() - before


@pytest.fixture
def private_redis(tmp_path: Path, settings: Any) -> Iterator[tuple[Backend, Any]]:
    """A CacheBackend on a Redis server of this test's own, and a client of that server."""
    pytest.importorskip("redis")
    server = RedisServer(tmp_path)
    server.start()
    caches = {
        **settings.CACHES,
        "queue-cost": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{server.port}/0",
        },
    }
    conf = {**settings.DJANGO_LEADER, "CACHE": "queue-cost"}
    with override_settings(CACHES=caches, DJANGO_LEADER=conf):
        from django_leader.backends.redis import RedisBackend

        backend = RedisBackend("queue-cost")
        try:
            yield backend, backend.client
        finally:
            backend.close()
            server.stop()


def commands_run(client: Any) -> int:
    """Every command the server ran so far (scripts' own commands too), but INFO."""
    stats = client.info("commandstats")
    return sum(int(value["calls"]) for key, value in stats.items() if key != "cmdstat_info")


def test_redis_reads_the_head_of_a_long_queue_as_of_a_short_one(
    private_redis: tuple[Backend, Any], lease_name: str
) -> None:
    backend, client = private_redis
    found: dict[str, Counter[int]] = {"next_in_line": Counter(), "candidates": Counter()}
    for size in SIZES:
        name = f"{lease_name}-{size}"
        queue_of(backend, name, size)
        backend.next_in_line(name, "fifo", holder="c0000")  # the script loaded
        head = backend.next_in_line(name, "fifo", holder="c0000")
        assert head is not None and head.identity == "c0001"
        counter = functools.partial(commands_run, client)
        found["next_in_line"][size] = cost(
            counter, functools.partial(backend.next_in_line, name, "fifo", holder="c0000")
        )
        found["candidates"][size] = cost(counter, functools.partial(backend.candidates, name))
    print(found)
    small, large = (found["next_in_line"][size] for size in SIZES)
    assert abs(large - small) <= SLACK, found
    # What a hand-over read before: the whole registry, an HGET per candidate.
    assert found["candidates"][500] >= 500 > found["candidates"][10], found


@pytest.fixture
def zookeeper() -> Iterator[Backend]:
    yield from open_store("zookeeper")


def test_zookeeper_reads_the_head_of_a_long_queue_as_of_a_short_one(
    zookeeper: Backend, lease_name: str
) -> None:
    client = zookeeper.client  # type: ignore[attr-defined]
    sent = Counter[str]()
    originals = {}
    for method in ("get_async", "get_children_async", "exists_async", "set_async"):
        original = getattr(client, method)
        originals[method] = original

        def counted(*args: Any, _method: str = method, _original: Any = original, **kw: Any) -> Any:
            sent[_method] += 1
            return _original(*args, **kw)

        setattr(client, method, counted)
    found: dict[str, Counter[int]] = {"next_in_line": Counter(), "candidates": Counter()}
    try:
        for size in SIZES:
            name = f"{lease_name}-{size}"
            queue_of(zookeeper, name, size)
            head = zookeeper.next_in_line(name, "fifo", holder="c0000")
            assert head is not None and head.identity == "c0001"
            found["next_in_line"][size] = cost(
                sent.total, functools.partial(zookeeper.next_in_line, name, "fifo", holder="c0000")
            )
            found["candidates"][size] = cost(
                sent.total, functools.partial(zookeeper.candidates, name)
            )
    finally:
        for method, original in originals.items():
            setattr(client, method, original)
        for size in SIZES:
            for index in range(size):
                zookeeper.withdraw(f"{lease_name}-{size}", f"c{index:04d}")
    print(found)
    small, large = (found["next_in_line"][size] for size in SIZES)
    assert abs(large - small) <= SLACK and large <= 4, found
    assert found["candidates"][500] > 500 > found["candidates"][10], found
