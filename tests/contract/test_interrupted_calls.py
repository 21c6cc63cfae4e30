"""A stop request raised by a signal handler in the middle of a database statement (Celery
beat's SystemExit, KeyboardInterrupt, RQ's StopRequested: the handler raises wherever the
main thread is) comes out of the store call as it went in.

Found with RQ's cron scheduler on PostgreSQL: a SIGTERM during a store call left the
connection busy with the statement; setting autocommit back on it failed, and that error
replaced the stop request, reported as the store being unavailable (or retried, and the
stop lost). Here the signal fires 0.2 s into a statement that sleeps 1 s on the server, so
it lands inside the statement every time.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from django_leader.backends.db import DatabaseBackend
from tests.support.stores import require, stores_db

pytestmark = [
    stores_db,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals"),
]

#: A statement that keeps the server busy for a second, per database.
SLEEP = {"postgresql": "SELECT pg_sleep(1)", "mysql": "SELECT SLEEP(1)"}


class StopRequested(Exception):
    """What the signal handler raises (as RQ's does)."""


@pytest.fixture(params=list(SLEEP))
def backend(request: pytest.FixtureRequest) -> Iterator[DatabaseBackend]:
    """A store on a database whose server can be kept busy (SQLite has no server)."""
    require(request.param)
    store = DatabaseBackend(request.param)
    yield store
    store.close()


@pytest.fixture
def stop_in_a_while() -> Iterator[None]:
    """SIGALRM raises StopRequested 0.2 s from now."""

    def request_stop(signum: int, frame: Any) -> None:
        raise StopRequested()

    previous = signal.signal(signal.SIGALRM, request_stop)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_a_stop_request_inside_a_store_call_comes_out_as_it_went_in(
    backend: DatabaseBackend, stop_in_a_while: None
) -> None:
    # A call in a transaction of its own, as acquisitions and renewals run (the private
    # API: no public call runs a statement of the test's choosing).
    with pytest.raises(StopRequested), backend._tables.cursor(atomic=True) as cursor:
        cursor.execute(SLEEP[backend.alias])
    # The connection the statement kept busy was dropped: the next call works.
    lease, _ = backend.acquire("after-the-stop", "alice", 30)
    assert lease is not None
    assert backend.release(lease)


def test_a_stop_request_inside_a_fenced_transaction_comes_out_as_it_went_in(
    backend: DatabaseBackend, stop_in_a_while: None
) -> None:
    from django.db import connections

    from django_leader import lock

    with lock("fenced-stop", backend=backend, ttl=30) as lease:
        with (
            pytest.raises(StopRequested),
            lease.fenced(using=backend.alias),
            connections[backend.alias].cursor() as cursor,
        ):
            cursor.execute(SLEEP[backend.alias])
        # The next fenced write works.
        with lease.fenced(using=backend.alias), connections[backend.alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
