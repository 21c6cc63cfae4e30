"""Response time of the admin's history (LeaseEvent) changelist with 1,000,000 events.

    python bench/admin_changelist.py [--rows 1000000] [--names 50] [--n 100] [--fresh]

Runs against PostgreSQL (``DATABASE_URL``, default the ``django_leader`` database on
127.0.0.1:5432, migrated first). Fills the history with ``--rows`` events of ``--names``
leases spread over 30 days (one ``INSERT ... SELECT FROM generate_series``, then
``VACUUM ANALYZE``); rows from an earlier run are reused unless ``--fresh``. Then requests
each page ``--n`` times as a superuser with Django's test client (middleware, queries and
template rendering included) and prints the median and p99 in milliseconds, and the query
plan of the one-lease list.

Only rows named ``bench-admin-*`` are written or deleted; other rows in the table stay.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _setup import migrate, setup

PREFIX = "bench-admin-"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/django_leader"


def fill(rows: int, names: int, fresh: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_leader_leaseevent WHERE name LIKE %s", [PREFIX + "%"]
        )
        have = cursor.fetchone()[0]
        if have == rows and not fresh:
            print(f"reusing {have:,} history rows from an earlier run")
        else:
            started = time.perf_counter()
            cursor.execute(
                "DELETE FROM django_leader_leaseevent WHERE name LIKE %s", [PREFIX + "%"]
            )
            # One lease changes hands every 30 days * names / rows on average; kinds cycle
            # through an acquisition and what ends it.
            cursor.execute(
                "INSERT INTO django_leader_leaseevent "
                "(name, kind, holder, token, previous_holder, at, detail, actor) "
                "SELECT %s || (g %% %s), "
                "(ARRAY['acquired', 'released', 'taken_over', 'lost', 'acquired', "
                "'forced_release'])[1 + (g / %s) %% 6], "
                "'worker-' || (g %% 13) || ':' || (1000 + g %% 97), g / %s, '', "
                "statement_timestamp() - (%s - g) * (interval '30 days' / %s), '', '' "
                "FROM generate_series(1, %s) AS g",
                [PREFIX, names, names, names, rows, rows, rows],
            )
            print(f"inserted {rows:,} history rows in {time.perf_counter() - started:.1f} s")
        cursor.execute(
            "INSERT INTO django_leader_lease "
            "(name, holder, previous_holder, token, transitions, acquired_at, renewed_at, "
            "expires_at) SELECT %s || n, '', '', 0, 0, now(), now(), now() "
            "FROM generate_series(0, %s - 1) AS n ON CONFLICT DO NOTHING",
            [PREFIX, names],
        )
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_leader_leaseevent")
    print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")


def measure(client: object, url: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get(url)  # type: ignore[attr-defined]
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.status_code)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--names", type=int, default=50)
    parser.add_argument("--n", type=int, default=100, help="requests per page")
    parser.add_argument("--fresh", action="store_true", help="delete and refill the rows")
    args = parser.parse_args()
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        raise SystemExit(f"needs PostgreSQL (DATABASE_URL), got {connection.vendor}")
    # As in production: no query log. (No setup_test_environment() either: its template
    # instrumentation copies every context, which would be measured too.)
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["*"]
    migrate("default")
    fill(args.rows, args.names, args.fresh)

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)

    one = f"{PREFIX}7"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_leader_leaseevent")
        total = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM django_leader_leaseevent WHERE name = %s", [one])
        per_lease = cursor.fetchone()[0]
    pages = [
        ("one lease", f"/admin/django_leader/leaseevent/?name={one}"),
        ("one lease, page 50", f"/admin/django_leader/leaseevent/?name={one}&p=50"),
        ("one lease, kind=lost", f"/admin/django_leader/leaseevent/?name={one}&kind=lost"),
        ("unfiltered", "/admin/django_leader/leaseevent/"),
        ("unfiltered, kind=lost", "/admin/django_leader/leaseevent/?kind=lost"),
        ("lease page (timeline)", f"/admin/django_leader/lease/{one}/change/?timeline=day"),
    ]
    print(
        f"history changelist, {total:,} rows in the table, {per_lease:,} of lease {one!r}; "
        f"{args.n} requests each (Django test client, superuser)"
    )
    for label, url in pages:
        measure(client, url, 3)  # warm up: connections, template cache
        samples = sorted(measure(client, url, args.n))
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(
            f"  {label:24s} median {statistics.median(samples) * 1000:7.1f} ms"
            f"  p99 {p99 * 1000:7.1f} ms   {url}"
        )

    with CaptureQueriesContext(connection) as queries:
        client.get(pages[0][1])
    listing = [q["sql"] for q in queries.captured_queries if "LIMIT" in q["sql"]]
    if listing:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN ANALYZE " + listing[-1])
            print("plan of the one-lease list query:")
            for (line,) in cursor.fetchall():
                print("   ", line)


if __name__ == "__main__":
    main()
