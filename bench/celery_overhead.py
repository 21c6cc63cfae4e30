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
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _setup import ROOT, SETTINGS, migrate, setup

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


def interleaved(calls: dict[str, Any], n: int) -> dict[str, list[float]]:
    """``n`` timed calls of each, taken in turn (one of each, then again), so that a change
    of the machine's load during the run weighs on each alike."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(n):
        for label, call in calls.items():
            started = time.perf_counter()
            call()
            samples[label].append(time.perf_counter() - started)
    return samples


def in_process(n: int) -> tuple[list[float], list[float]]:
    from testproject.demoapp.tasks import plain_noop, singleton_noop

    for task in (plain_noop, singleton_noop):  # warm up (connections, imports)
        for _ in range(20):
            task.apply().get()
    found = interleaved(
        {"plain": lambda: plain_noop.apply().get(), "single": lambda: singleton_noop.apply().get()},
        n,
    )
    return found["plain"], found["single"]


def through_worker(store: str, n: int, peer: bool = False) -> dict[str, list[float]]:
    """``apply_async().get()`` one at a time through a worker: ``plain`` and ``singleton``
    samples, and with ``peer`` (when celery-singleton is installed) ``celery-singleton``:
    its no-op task (bench/peer_tasks.py), one lock per call (each call's own argument, so
    that no call finds the lock of the one before, which the worker releases only after
    the result is stored)."""
    from testproject.demoapp.tasks import plain_noop, singleton_noop
    from tests.celeryprocs import Processes

    calls = {"plain": plain_noop, "singleton": singleton_noop}
    if peer:
        with contextlib.suppress(ImportError):
            from bench.peer_tasks import celery_singleton_noop

            calls["celery-singleton"] = celery_singleton_noop
    env = {**os.environ, "DJANGO_LEADER_LOG_LEVEL": "WARNING"}
    env.update({f"DJANGO_LEADER_{key}": value for key, value in STORES[store].items()})
    queue = f"bench-overhead-{uuid.uuid4().hex[:8]}"
    found: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        procs = Processes(Path(directory), env)
        procs.env["DJANGO_SETTINGS_MODULE"] = SETTINGS  # DEBUG off
        try:
            procs.worker("worker", queue, concurrency=1)
            counter = itertools.count()

            def call(task: Any) -> None:
                args = [next(counter)] if task is calls.get("celery-singleton") else []
                task.apply_async(args=args, queue=queue).get(timeout=30)

            for task in calls.values():
                for _ in range(20):
                    call(task)
            found = interleaved(
                {label: (lambda task=task: call(task)) for label, task in calls.items()}, n
            )
        finally:
            procs.close()
    return found


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
        worker = through_worker(store, args.roundtrips)
        print(line("through a worker", worker["plain"], worker["singleton"]))


if __name__ == "__main__":
    main()
