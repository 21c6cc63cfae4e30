"""Django set-up shared by the benchmarks: the test project's settings with ``DEBUG = False``
(``bench/settings.py``), real servers."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The settings of the bench and of every process it starts (DEBUG off).
SETTINGS = "bench.settings"


def setup() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()


def migrate(alias: str) -> None:
    """Create database ``alias`` on its server if it is missing, then migrate it (the real
    database of the test project's settings, not a test database)."""
    from django.core.management import call_command
    from django.db import connections

    connection = connections[alias]
    if connection.vendor in ("postgresql", "mysql"):
        name = connection.settings_dict["NAME"]
        with connection._nodb_cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
            else:
                cursor.execute(
                    f"CREATE DATABASE IF NOT EXISTS {connection.ops.quote_name(name)} "
                    "CHARACTER SET utf8mb4"
                )
    call_command("migrate", database=alias, verbosity=0)


def summary(samples: list[float]) -> str:
    """ops/s, median and p99 of per-operation latencies (seconds)."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    total = sum(samples)
    return (
        f"{len(samples) / total:8.0f} ops/s  median {statistics.median(samples) * 1000:7.3f} ms"
        f"  p99 {p99 * 1000:7.3f} ms"
    )
