"""What ``@singleton_task`` adds to a task's latency, on Redis and on PostgreSQL.

    python bench/celery_overhead.py [--n 2000] [--roundtrips 300]

Two measurements per lease store, each a plain ``shared_task`` against the same no-op task
made a ``singleton_task`` (testproject/demoapp/tasks.py):

* **in process** — ``task.apply()`` (the Celery tracer, no broker), ``--n`` calls: the lock's
  acquire, renewer start and release, and nothing else;
* **through a worker** — ``apply_async().get()`` one at a time through Redis (broker and
  result backend) and a ``celery worker`` (prefork, one process), ``--roundtrips`` calls:
  what a caller sees.

Prints median and p99 of each, and the difference. Needs Redis at the broker URL of the test
project and PostgreSQL at ``DJANGO_LEADER_POSTGRESQL_URL`` (stores that are not reachable
are left out). Uses the ``django_leader`` databases, migrated first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _setup import ROOT, migrate, setup

STORES = {
    "redis": {
        "BACKEND": "django_leader.backends.cache.CacheBackend",
        "CACHE": "redis",
    },
    "postgresql": {
        "BACKEND": "django_leader.backends.db.DatabaseBackend",
        "DATABASE": "postgresql",
    },
}


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def line(label: str, plain: list[float], single: list[float]) -> str:
    (pm, p99), (sm, s99) = quantiles(plain), quantiles(single)
    return (
        f"  {label:<16} plain median {pm * 1000:7.3f} ms p99 {p99 * 1000:7.3f} ms | "
        f"singleton median {sm * 1000:7.3f} ms p99 {s99 * 1000:7.3f} ms | "
        f"added median {(sm - pm) * 1000:+7.3f} ms p99 {(s99 - p99) * 1000:+7.3f} ms"
    )


def timed(call: Any, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def in_process(n: int) -> tuple[list[float], list[float]]:
    from testproject.demoapp.tasks import plain_noop, singleton_noop

    for task in (plain_noop, singleton_noop):  # warm up (connections, imports)
        for _ in range(20):
            task.apply().get()
    plain = timed(lambda: plain_noop.apply().get(), n)
    single = timed(lambda: singleton_noop.apply().get(), n)
    return plain, single


def through_worker(store: str, n: int) -> tuple[list[float], list[float]]:
    from testproject.demoapp.tasks import plain_noop, singleton_noop
    from tests.celeryprocs import Processes

    env = {**os.environ, "DJANGO_LEADER_LOG_LEVEL": "WARNING"}
    env.update({f"DJANGO_LEADER_{key}": value for key, value in STORES[store].items()})
    queue = f"bench-overhead-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as directory:
        procs = Processes(Path(directory), env)
        try:
            procs.worker("worker", queue, concurrency=1)
            for task in (plain_noop, singleton_noop):
                for _ in range(20):
                    task.apply_async(queue=queue).get(timeout=30)
            plain = timed(lambda: plain_noop.apply_async(queue=queue).get(timeout=30), n)
            single = timed(lambda: singleton_noop.apply_async(queue=queue).get(timeout=30), n)
        finally:
            procs.close()
    return plain, single


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="in-process calls per task")
    parser.add_argument("--roundtrips", type=int, default=300, help="worker calls per task")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_LEADER_LOG_LEVEL", "WARNING")  # a log line per lock
    setup()
    from django.conf import settings
    from django.test.utils import override_settings

    import testproject.celery  # noqa: F401  (the current app)

    print(f"python {sys.version.split()[0]}, broker {settings.CELERY_BROKER_URL}, cwd {ROOT}")
    for store, conf in STORES.items():
        if store == "redis" and "redis" not in settings.CACHES:
            print(f"{store}: not reachable, skipped")
            continue
        if store == "postgresql":
            if "postgresql" not in settings.DATABASES:
                print(f"{store}: not reachable, skipped")
                continue
            migrate("postgresql")
        print(f"{store}:")
        with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, **conf}):
            print(line("in process", *in_process(args.n)))
        print(line("through a worker", *through_worker(store, args.roundtrips)))


if __name__ == "__main__":
    main()
