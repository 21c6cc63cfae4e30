"""A statement inside ``lease.fenced()`` returns its own result, however long it runs.

The fenced transaction sets the server's bounds on itself again after a statement that
took ``FENCE_FLOOR`` (1 s) or longer. It once did so on the statement's own cursor, which
replaced the statement's result with its own (issue 24, defect 0): ``SELECT 42 FROM
pg_sleep(1.2)`` returned ``('1200ms', …)``, an ``INSERT … RETURNING`` committed a row and
returned the timeouts, and a lease row locked after a wait of a second or more read as held
whoever held it. Each case runs on PostgreSQL and MariaDB (SQLite sets no bounds), with
the lease in the database itself and in each other store (the fence row).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_leader import LeadershipLost, lock
from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from django_leader.lease import Lease
from django_leader.models import Lease as LeaseRow
from testproject.demoapp.models import FencedWrite
from tests.support.stores import DATABASE_STORES, open_store, require, stores_db

pytestmark = stores_db

#: Longer than FENCE_FLOOR: the bounds are set again after such a statement.
SLOW = 1.3
#: Long enough that no lease here expires during a case.
TTL = 30.0

#: The databases that bound a fenced transaction on the server (SQLite cannot).
BOUNDED = ["postgresql", "mysql"]


def slow(alias: str, select: str) -> str:
    """``select`` (a select list) evaluated after the server slept SLOW seconds."""
    if connections[alias].vendor == "postgresql":
        return f"SELECT {select} FROM pg_sleep({SLOW}) AS nap"
    return f"SELECT {select} FROM (SELECT SLEEP({SLOW}) AS nap) AS slept"


@pytest.fixture(params=BOUNDED)
def alias(request: pytest.FixtureRequest) -> str:
    alias = DATABASE_STORES[request.param]
    require(alias)
    return alias


@pytest.fixture(params=["database", "redis", "zookeeper"])
def store(request: pytest.FixtureRequest, alias: str) -> Iterator[Backend]:
    """The lease's store: the database the writes go to, or another one (fence row)."""
    if request.param == "database":
        backend = DatabaseBackend(alias)
        yield backend
        backend.close()
    else:
        yield from open_store(request.param)


def fenced(lease: Lease, store: Backend, alias: str) -> Any:
    if isinstance(store, DatabaseBackend):
        return lease.fenced()
    return lease.fenced(using=alias)


def test_a_slow_select_returns_its_own_row(store: Backend, alias: str) -> None:
    name = f"slow-{uuid.uuid4().hex[:8]}"
    with (
        lock(name, ttl=TTL, backend=store) as lease,
        fenced(lease, store, alias),
        connections[alias].cursor() as cursor,
    ):
        cursor.execute(slow(alias, "42, 'forty-two'"))
        assert list(cursor.fetchall()) == [(42, "forty-two")]
        cursor.execute("SELECT 43")  # and the next statement too
        assert cursor.fetchone() == (43,)


def test_a_slow_insert_returns_the_row_it_inserted(store: Backend, alias: str) -> None:
    table = connections[alias].ops.quote_name(FencedWrite._meta.db_table)
    name = f"slow-{uuid.uuid4().hex[:8]}"
    with (
        lock(name, ttl=TTL, backend=store) as lease,
        fenced(lease, store, alias),
        connections[alias].cursor() as cursor,
    ):
        cursor.execute(
            f"INSERT INTO {table} (writer, token, note) " + slow(alias, "%s, %s, 'slow'"),
            ["slow-writer", lease.token],
        )
        if connections[alias].vendor == "postgresql":
            cursor.execute("SELECT lastval()")
        else:
            cursor.execute("SELECT LAST_INSERT_ID()")
        (pk,) = cursor.fetchone()
        written = FencedWrite.objects.using(alias).create(writer="orm", token=lease.token)
    assert FencedWrite.objects.using(alias).get(pk=pk).writer == "slow-writer"
    assert FencedWrite.objects.using(alias).get(pk=written.pk).writer == "orm"


def test_returning_after_a_slow_statement_names_the_inserted_row() -> None:
    """PostgreSQL's ``INSERT … RETURNING`` that itself takes over a second."""
    alias = DATABASE_STORES["postgresql"]
    require(alias)
    store = DatabaseBackend(alias)
    table = connections[alias].ops.quote_name(FencedWrite._meta.db_table)
    try:
        name = f"slow-{uuid.uuid4().hex[:8]}"
        with (
            lock(name, ttl=TTL, backend=store) as lease,
            lease.fenced(),
            connections[alias].cursor() as cursor,
        ):
            cursor.execute(
                f"INSERT INTO {table} (writer, token, note) "
                + slow(alias, "%s, %s, 'slow'")
                + " RETURNING id, writer, token",
                ["returning", lease.token],
            )
            row = cursor.fetchone()
    finally:
        store.close()
    assert row is not None and row[1:] == ("returning", lease.token)
    assert FencedWrite.objects.using(alias).get(pk=row[0]).writer == "returning"


def hold_row_slowly(
    alias: str, table: str, name: str, locked: threading.Event, *change: str
) -> None:
    """Another client locks the row of ``name`` in ``table``, runs the ``change``
    statements (params: ``name``), sets ``locked`` and commits only after SLOW seconds."""
    other = connections.create_connection(alias)
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(f"SELECT token FROM {table} WHERE name = %s FOR UPDATE", [name])
            for statement in change:
                cursor.execute(statement, [name])
            locked.set()
            cursor.execute(slow(alias, "1"))
            cursor.fetchall()
        other.commit()
    finally:
        other.close()


def test_a_lease_row_locked_after_a_long_wait_is_checked(alias: str) -> None:
    """The lease changed hands while ``fenced()`` waited (over a second) for its row lock:
    the row, read once the lock is granted, no longer matches, and the write is refused."""
    store = DatabaseBackend(alias)
    name = f"slow-{uuid.uuid4().hex[:8]}"
    table = connections[alias].ops.quote_name(LeaseRow._meta.db_table)
    locked = threading.Event()
    # Another client hands the lease to someone else, and commits only after SLOW seconds:
    # fenced() waits for the row lock that long.
    take_over = f"UPDATE {table} SET holder = 'someone-else', token = token + 1 WHERE name = %s"

    try:
        with lock(name, ttl=TTL, backend=store) as lease:
            thread = threading.Thread(
                target=hold_row_slowly, args=(alias, table, name, locked, take_over)
            )
            thread.start()
            assert locked.wait(10)
            with (
                pytest.raises(LeadershipLost),
                lease.fenced(),
                connections[alias].cursor() as cursor,
            ):
                cursor.execute(
                    "INSERT INTO demoapp_fencedwrite (writer, token, note) "
                    "VALUES ('stale', %s, '')",
                    [lease.token],
                )
            thread.join(10)
    finally:
        store.close()
    assert not FencedWrite.objects.using(alias).filter(writer="stale").exists()


@pytest.fixture(params=["redis", "zookeeper"])
def fence_store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A lease store that fences with the fence row."""
    yield from open_store(request.param)


def test_a_fence_row_locked_after_a_long_wait_is_read(fence_store: Backend, alias: str) -> None:
    """The fence row was locked by another transaction for over a second: once granted,
    its token is read (it once read the bounds' text, ``int('1s')`` failing)."""
    from django_leader.models import LeaseFence

    name = f"slow-{uuid.uuid4().hex[:8]}"
    table = connections[alias].ops.quote_name(LeaseFence._meta.db_table)
    locked = threading.Event()

    with lock(name, ttl=TTL, backend=fence_store) as lease:
        with lease.fenced(using=alias):  # the name's first write makes its fence row
            FencedWrite.objects.using(alias).create(writer="first", token=lease.token)
        thread = threading.Thread(target=hold_row_slowly, args=(alias, table, name, locked))
        thread.start()
        assert locked.wait(10)
        with lease.fenced(using=alias):
            FencedWrite.objects.using(alias).create(writer="after-wait", token=lease.token)
        thread.join(10)
    assert FencedWrite.objects.using(alias).filter(writer="after-wait").count() == 1
