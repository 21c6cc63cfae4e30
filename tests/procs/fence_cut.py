"""A holder whose network is cut in the middle of a statement inside ``lease.fenced()``.

Run by tests/processes/test_fenced_cut.py inside a network namespace of the test's own,
with ``DATABASE_URL`` naming a private server in that namespace. It waits for the server,
migrates, takes a lease (TTL ``FENCE_CUT_TTL``), enters ``fenced()`` and prints
``{"ev": "in"}``; then runs a statement that sleeps 60 s on the server. The test cuts the
namespace's network meanwhile. The child prints how the statement ended and when:
``{"ev": "ended", "error": ..., "after": seconds since the statement was sent,
"time_left": the lease's time left when it was sent}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    deadline = time.monotonic() + 60
    while True:
        try:
            connection.ensure_connection()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    call_command("migrate", verbosity=0)

    from django_leader import lock
    from django_leader.backends.db import DatabaseBackend

    ttl = float(os.environ.get("FENCE_CUT_TTL", "3"))
    sleep = "SELECT pg_sleep(60)" if connection.vendor == "postgresql" else "SELECT SLEEP(60)"
    backend = DatabaseBackend("default")
    with lock("cut", ttl=ttl, backend=backend) as lease:
        try:
            with lease.fenced(), connection.cursor() as cursor:
                emit(ev="in")
                time_left = lease.time_left()
                sent = time.monotonic()
                cursor.execute(sleep)
                emit(ev="ended", error=None, after=time.monotonic() - sent, time_left=time_left)
        except Exception as exc:  # the statement's error: what the test looks at
            emit(
                ev="ended",
                error=f"{type(exc).__name__}: {exc}"[:300],
                after=time.monotonic() - sent,
                time_left=time_left,
            )
        os._exit(0)  # the release cannot reach the server: do not wait for it


if __name__ == "__main__":
    main()
