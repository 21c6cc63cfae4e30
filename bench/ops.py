"""Round-trips per second of the lease operations, one process, each store.

    python bench/ops.py [--n 2000]

For every reachable store: acquire+release of a free lease, and renew of a held lease,
each timed one by one; prints ops/s, median and p99 latency.
"""

from __future__ import annotations

import argparse
import time
import uuid

from _setup import migrate, setup, summary


def measure(backend, n: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    name = f"bench-{uuid.uuid4().hex[:8]}"
    cycle: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        lease, _ = backend.acquire(name, "bench", 30)
        backend.release(lease)
        cycle.append(time.perf_counter() - started)
    lease, _ = backend.acquire(name, "bench", 30)
    renew: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        assert backend.renew(lease, 30) is not None
        renew.append(time.perf_counter() - started)
    backend.release(lease)
    backend.flush_history(60)
    return cycle, renew


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    setup()
    from django.conf import settings

    from django_leader.backends.cache import CacheBackend
    from django_leader.backends.db import DatabaseBackend
    from testproject.services import UNAVAILABLE

    stores = []
    for alias, label in (("default", "sqlite"), ("postgresql", "postgresql"), ("mysql", "mariadb")):
        if alias in settings.DATABASES:
            migrate(alias)
            stores.append((label, DatabaseBackend(alias)))
    if "redis" in settings.CACHES:
        migrate("default")  # history of the cache backend
        stores.append(("redis", CacheBackend("redis")))
    print(f"lease operations, one process, n={args.n} each (history on)")
    for label, backend in stores:
        measure(backend, min(100, args.n))  # warm up: connections, scripts
        cycle, renew = measure(backend, args.n)
        print(f"{label:11s} acquire+release {summary(cycle)}")
        print(f"{label:11s} renew           {summary(renew)}")
    for reason in UNAVAILABLE.values():
        print(f"skipped: {reason}")


if __name__ == "__main__":
    main()
