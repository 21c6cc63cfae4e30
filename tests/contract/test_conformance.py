"""The lease contract (``django_leader.testing.contract``) run against every store of the
suite and the shipped ``MemoryBackend``; below it, what only the database stores promise
(leases outside the caller's transaction, ``fenced()``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections, transaction

from django_leader import LeadershipLost
from django_leader.backends.base import Backend
from django_leader.lease import clock
from django_leader.testing import MemoryBackend
from django_leader.testing.contract import BackendContract, wait_until_expired
from tests.support.stores import stores_db, wipe
from tests.support.waiting import wait_until

pytestmark = stores_db

TTL = 1.0


class TestEveryStore(BackendContract):
    """Each store of the suite (SQLite, PostgreSQL, MariaDB, Redis, django-redis)."""

    @pytest.fixture
    def backend(self, backend: Backend) -> Backend:  # the suite's store fixture
        return backend

    def forget(self, backend: Backend, name: str) -> None:
        wipe(backend, name)


class TestMemoryBackend(BackendContract):
    """The in-process store ``django_leader.testing`` gives users' tests."""

    def make_backend(self) -> Backend:
        return MemoryBackend()


def test_lease_commits_inside_callers_atomic(db_alias: str, lease_name: str) -> None:
    from django_leader import lock
    from django_leader.backends.db import DatabaseBackend

    observer = DatabaseBackend(db_alias)
    try:
        with (
            transaction.atomic(using=db_alias),
            lock(lease_name, backend=DatabaseBackend(db_alias), blocking=False) as lease,
        ):
            # Another connection sees the lease while the caller's transaction is open.
            seen = observer.read(lease_name)
            assert seen is not None and seen.token == lease.token
            raise_rollback = True
        assert raise_rollback
    finally:
        observer.close()


def test_lease_survives_callers_rollback(db_alias: str, lease_name: str) -> None:
    from django_leader.backends.db import DatabaseBackend

    store = DatabaseBackend(db_alias)
    try:
        with pytest.raises(RuntimeError), transaction.atomic(using=db_alias):
            lease, _ = store.acquire(lease_name, "alice", 30)
            raise RuntimeError("caller rolls back")
        assert store.read(lease_name).token == lease.token
    finally:
        store.close()


def test_fenced_write_commits_while_held(db_backend: Any, lease_name: str) -> None:
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once
    from testproject.demoapp.models import FencedWrite

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(30))
    with lease.fenced():
        FencedWrite.objects.using(db_backend.alias).create(writer="alice", token=lease.token)
    assert FencedWrite.objects.using(db_backend.alias).filter(token=lease.token).count() == 1


def test_fenced_write_rejected_after_takeover(db_backend: Any, lease_name: str) -> None:
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once
    from testproject.demoapp.models import FencedWrite

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(TTL))
    wait_until_expired(db_backend, lease_name)
    db_backend.acquire(lease_name, "bob", 30)
    lease.deadline = clock() + 60  # pretend the local deadline did not catch it
    with pytest.raises(LeadershipLost), lease.fenced():
        FencedWrite.objects.using(db_backend.alias).create(writer="alice", token=lease.token)
    assert not FencedWrite.objects.using(db_backend.alias).filter(writer="alice").exists()


def test_fenced_write_commits_with_every_store(backend: Any, lease_name: str) -> None:
    """Every store fences: the database with its lease row, the others with a fence row
    in the settings' database."""
    from django_leader.conf import get_settings, resolve_timing
    from django_leader.term import acquire_once
    from testproject.demoapp.models import FencedWrite

    alias = get_settings().database
    lease, _ = acquire_once(backend, lease_name, "alice", resolve_timing(30))
    assert lease is not None
    with lease.fenced():
        FencedWrite.objects.using(alias).create(writer=lease_name, token=lease.token)
    assert FencedWrite.objects.using(alias).filter(writer=lease_name).count() == 1


def test_fenced_uses_statement_time_inside_callers_transaction(
    db_backend: Any, lease_name: str
) -> None:
    """An outer transaction that began before the lease expired must not make it look
    unexpired (PostgreSQL's now() is the transaction's start time)."""
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(TTL))
    with transaction.atomic(using=db_backend.alias):
        with connections[db_backend.alias].cursor() as cursor:
            cursor.execute("SELECT 1")  # the transaction has begun
        # Expired in the store (read on the backend's own connection, outside this
        # transaction), while the transaction stays open.
        wait_until(
            lambda: db_backend.read(lease_name) is None,
            timeout=TTL + 10,
            message="the lease never expired in the store",
        )
        lease.deadline = clock() + 60  # pretend the local deadline missed it
        with pytest.raises(LeadershipLost), lease.fenced():
            pytest.fail("fenced() passed an expired lease")
