"""A churn of lease names, then retention (issue 27): what the store and the metrics keep.

    python bench/churn.py [--names 100000] [--threads 8]
        [--stores sqlite,postgresql,mariadb,redis,zookeeper]

For each store, ``--threads`` threads take and release ``--names`` distinct names with
``lock()`` (a name made from data, as ``singleton_task(key=...)`` makes them), one lease
each; then ``manage.py leader prune --days 0`` forgets the names nobody uses. Printed per
store: the churn's rate, what the store keeps before and after the prune (rows of the
lease, history and candidate tables for a database, keys under the run's own prefix for
Redis, znodes under the run's own root for ZooKeeper), how long the prune took, and the
size of the Prometheus exposition afterwards (labels bounded by ``METRICS_NAMES``). The
databases are the test project's real ones (``bench/settings.py``), migrated first; only
this run's names are counted there.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from io import StringIO
from typing import Any

from _setup import migrate, setup

STORES = ("sqlite", "postgresql", "mariadb", "redis", "zookeeper")
DATABASES = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mysql"}


def configure(store: str, run: str) -> tuple[Any, dict[str, Any]]:
    """The backend of ``store`` on a namespace of this run's own, and the settings."""
    from django.conf import settings

    conf = {**settings.DJANGO_LEADER, "HISTORY": True}
    caches = dict(settings.CACHES)
    if store in DATABASES:
        alias = DATABASES[store]
        migrate(alias)
        conf.update(BACKEND="django_leader.backends.db.DatabaseBackend", DATABASE=alias)
    elif store == "redis":
        caches["churn"] = {**settings.CACHES["redis"], "KEY_PREFIX": f"churn-{run}"}
        conf.update(BACKEND="django_leader.backends.redis.RedisBackend", CACHE="churn")
    else:
        conf.update(BACKEND="django_leader.backends.zookeeper.ZooKeeperBackend")
        conf["ZOOKEEPER"] = {**settings.ZOOKEEPER, "ROOT": f"/django-leader-churn-{run}"}
    return conf, caches


def churn(run: str, names: int, threads: int) -> float:
    """Seconds to take and release ``names`` names with ``lock()`` from ``threads``
    threads."""
    from django_leader import lock

    def work(start: int) -> None:
        for index in range(start, names, threads):
            with lock(f"churn-{run}-{index}", blocking=False, ttl=30):
                pass

    began = time.perf_counter()
    workers = [threading.Thread(target=work, args=(start,)) for start in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - began


def exposition() -> int:
    """Bytes of the Prometheus exposition (the default registry, as ``metrics/`` serves)."""
    from prometheus_client import REGISTRY, generate_latest

    return len(generate_latest(REGISTRY))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--stores", default=",".join(STORES))
    args = parser.parse_args()
    setup()
    import logging

    logging.getLogger("django_leader").setLevel(logging.WARNING)  # a line per lock else
    from django.core.management import call_command
    from django.test import override_settings

    from django_leader import metrics
    from django_leader.backends import get_backend
    from tests.support.stores import kept

    metrics.install()
    print(f"{'store':<11} {'names':>8} {'lock()/s':>9} {'kept before':>12} {'after prune':>12}"
          f" {'prune s':>8} {'metrics bytes':>14}")  # fmt: skip
    for store in args.stores.split(","):
        run = uuid.uuid4().hex[:8]
        conf, caches = configure(store, run)
        with override_settings(DJANGO_LEADER=conf, CACHES=caches):
            backend: Any = get_backend()
            if store == "zookeeper":
                backend.initialize()  # a root of its own, never used: no lock-delay
            seconds = churn(run, args.names, args.threads)
            backend.flush_history(60)
            before = kept(backend, f"churn-{run}-")
            began = time.perf_counter()
            out = StringIO()
            call_command("leader", "prune", "--days", "0", stdout=out)
            pruned = time.perf_counter() - began
            after = kept(backend, f"churn-{run}-")
            print(f"{store:<11} {args.names:>8} {args.names / seconds:>9.0f} {before:>12}"
                  f" {after:>12} {pruned:>8.1f} {exposition():>14}", flush=True)  # fmt: skip
            if store == "zookeeper":  # the run's own root, on the machine's ZooKeeper
                backend.client.delete(backend.root, recursive=True)
            elif store == "redis":  # what is left under the run's own prefix
                pattern = str(backend.cache.make_key("django_leader:*"))
                for key in list(backend.client.scan_iter(match=pattern, count=5000)):
                    backend.client.delete(key)
            backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
