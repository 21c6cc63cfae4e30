"""Locks per second in one process: threads x distinct names, beside the peers, same run.

The ``throughput`` part of ``bench/report.py``. Each of ``threads`` threads takes and gives
back a lock of its own name (``with lock(name): pass``) as fast as it can for ``seconds``;
the same threads then do the same with python-redis-lock on the same Redis (plain, and with
``auto_renewal=True``: a thread of its own that renews, as django-leader's session does for
every lock), and with the driver's cheapest round trip (``PING``, ``SELECT 1``): the ceiling
of one Python process's client on this machine. Cases are interleaved (every case's repeat
1, then every case's repeat 2...) so that a change in the machine's load falls on all of
them. The connections each case ends with open are counted: django-leader's Redis backend
takes one per thread at a time from its pool (redis-py's blocking pool, at most 100 unless
the project's pool allows more), its database backend one per session thread.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

TTL = 30.0


def rate(work: Callable[[int], Any], threads: int, seconds: float) -> float:
    """Calls of ``work(thread index)`` per second, ``threads`` threads for ``seconds``."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    start = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        start.wait()
        while time.perf_counter() < stop:
            work(index)
            counts[index] += 1

    pool = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(threads)]
    for thread in pool:
        thread.start()
    began = time.perf_counter()
    start.wait()
    for thread in pool:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def cases(stores: list[str]) -> tuple[dict[str, tuple[str, Callable[[int], Any], Any]], list[str]]:
    """``{case: (store, work, connections counter)}`` for the reachable stores, and why the
    others are not measured."""
    from django.conf import settings

    from django_leader import lock

    found: dict[str, tuple[str, Callable[[int], Any], Any]] = {}
    missing: list[str] = []
    run = uuid.uuid4().hex[:6]
    if "redis" in stores and "redis" in settings.CACHES:
        import redis

        from django_leader.backends.redis import RedisBackend

        backend = RedisBackend("redis")
        pool = backend.client.connection_pool
        kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "retry"}
        client = redis.Redis(
            connection_pool=redis.BlockingConnectionPool(max_connections=100, **kwargs)
        )

        def open_connections(pool: Any = pool) -> int:
            return len(getattr(pool, "_connections", []))

        found["redis lock()"] = (
            "redis",
            lambda i: _hold(lock(f"tp-{run}-{i}", ttl=TTL, backend=backend)),
            open_connections,
        )
        try:
            import redis_lock

            found["redis python-redis-lock"] = (
                "redis",
                lambda i: _peer(redis_lock.Lock(client, f"tp-prl-{run}-{i}", expire=int(TTL))),
                lambda: len(client.connection_pool._connections),
            )
            found["redis python-redis-lock auto_renewal"] = (
                "redis",
                lambda i: _peer(
                    redis_lock.Lock(client, f"tp-pra-{run}-{i}", expire=int(TTL), auto_renewal=True)
                ),
                lambda: len(client.connection_pool._connections),
            )
        except ImportError:
            missing.append("python-redis-lock is not installed")
        found["redis PING"] = ("redis", lambda i: client.ping(), None)
    elif "redis" in stores:
        missing.append("redis: no Redis cache configured")
    if "postgresql" in stores and "postgresql" in settings.DATABASES:
        from django.db import connections

        from django_leader.backends.db import DatabaseBackend

        database = DatabaseBackend("postgresql")

        def sessions() -> int:
            with connections["postgresql"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
                return int(cursor.fetchone()[0])

        found["postgresql lock()"] = (
            "postgresql",
            lambda i: _hold(lock(f"tp-{run}-{i}", ttl=TTL, backend=database)),
            sessions,
        )
    elif "postgresql" in stores:
        missing.append("postgresql: not configured")
    return found, missing


def _hold(held: Any) -> None:
    with held:
        pass


def _peer(one: Any) -> None:
    assert one.acquire(blocking=False)
    one.release()


def run(
    thread_counts: list[int], seconds: float, repeats: int, stores: list[str]
) -> dict[str, Any]:
    """``{"rates": {case: {threads: [ops/s of each repeat]}}, "connections": {case:
    {threads: n}}, "missing": [...]}``."""
    found, missing = cases(stores)
    rates: dict[str, dict[int, list[float]]] = {
        case: {t: [] for t in thread_counts} for case in found
    }
    connections: dict[str, dict[int, int]] = {case: {} for case in found}
    for _, work, _ in found.values():  # warm up: connections, scripts
        rate(work, 1, 0.3)
    for repeat in range(repeats):
        for threads in thread_counts:
            for case, (_, work, count) in found.items():
                rates[case][threads].append(rate(work, threads, seconds))
                if count is not None:
                    connections[case][threads] = max(connections[case].get(threads, 0), count())
                print(
                    f"  throughput {case:<38} {threads} threads, repeat {repeat + 1}: "
                    f"{rates[case][threads][-1]:,.0f}/s",
                    flush=True,
                )
    return {
        "seconds": seconds,
        "repeats": repeats,
        "threads": thread_counts,
        "rates": {c: {str(t): v for t, v in r.items()} for c, r in rates.items()},
        "medians": {
            c: {str(t): statistics.median(v) for t, v in r.items()} for c, r in rates.items()
        },
        "connections": {c: {str(t): n for t, n in r.items()} for c, r in connections.items()},
        "missing": missing,
    }
