"""The parts of the backend contract beyond the lease operations (``backends/base.py``):
the store's clock, beat slot records, the backend's own system checks, what the admin
needs, and the defaults a third-party backend inherits (batched renewal, wake-ups).

Store behaviour is tested against every real store (the ``backend`` fixture); the
defaults against a minimal subclass of the contract that overrides none of them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.checks import CheckMessage
from django.test import override_settings

from django_leader.backends import get_backend
from django_leader.backends.base import Backend
from django_leader.backends.db import migration_state
from django_leader.backends.slots import LocalSlots, Slot, SlotStore
from django_leader.conf import get_settings
from django_leader.exceptions import NotSupportedError
from django_leader.lease import Lease, clock
from django_leader.models import LeaseFence
from tests.support.stores import require, stores_db

pytestmark = stores_db

TTL = 30.0


class Bare(Backend):
    """The contract with only its abstract methods, each a trivial in-process answer:
    every optional member is the contract's default."""

    def __init__(self) -> None:
        self.renewed: list[str] = []
        self._lock = threading.Lock()

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        now = datetime.now(timezone.utc)
        lease = Lease(name, holder, 1, now, now, now + timedelta(seconds=ttl), 1)
        return lease, lease

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        with self._lock:
            self.renewed.append(lease.name)
        return None if lease.holder == "stale" else lease

    def release(self, lease: Lease) -> bool:
        return True

    def read(self, name: str) -> Lease | None:
        return None

    def names(self) -> list[str]:
        return []

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        return None


def held(lease: Lease) -> Lease:
    """``lease`` as its holder holds it (a local deadline)."""
    lease.deadline = clock() + TTL
    return lease


# -- the defaults --------------------------------------------------------------------------
def test_default_now_is_this_processs_clock_aware_utc() -> None:
    before = datetime.now(timezone.utc)
    now = Bare().now()
    after = datetime.now(timezone.utc)
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert before <= now <= after


def test_default_slots_are_local_unshared_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    backend = Bare()
    assert Bare.shared_slots is False
    with caplog.at_level(logging.WARNING, logger="django_leader"):
        slots = backend.slots()
    assert isinstance(slots, LocalSlots) and not slots.shared
    assert "cannot fence the beat's shared slot records" in caplog.text
    lease, _ = backend.acquire("beat", "me", TTL)
    assert lease is not None
    slot = Slot("entry", datetime.now(timezone.utc), lease.token, lease.holder, "task-1")
    slots.claim(held(lease), slot)
    assert slots.load(lease) == {"entry": slot}
    assert slots.confirm(lease, slot) and slots.load(lease)["entry"].sent
    assert backend.slots().load(lease) == {}  # a new store: this process, this object only


def test_default_renew_many_renews_one_by_one_in_order() -> None:
    backend = Bare()
    leases = [
        backend.acquire(name, holder, TTL)[0]
        for name, holder in [("a", "me"), ("b", "stale"), ("c", "me")]
    ]
    assert all(lease is not None for lease in leases)
    results = backend.renew_many(leases, TTL)  # type: ignore[arg-type]
    assert results == [leases[0], None, leases[2]]
    assert backend.renewed == ["a", "b", "c"]
    assert backend.renew_many([], TTL) == []


def test_default_watch_none_means_poll() -> None:
    assert Bare().watch("name", lambda: None) is None


def test_default_admin_and_check_members() -> None:
    backend = Bare()
    assert backend.rows_database is None
    with pytest.raises(NotSupportedError):
        backend.now_expression()
    assert backend.describe() == "Bare: live state read from the store; no history."
    assert Bare.check_configuration(get_settings()) == []
    assert backend.candidates("name") is None
    lease, _ = backend.acquire("name", "me", TTL)
    assert lease is not None
    # The default fences with the name's fence row in the settings' database.
    with backend.fenced(held(lease)):
        pass
    fence = LeaseFence.objects.using(get_settings().database).get(name="name")
    assert (fence.token, fence.holder) == (1, "me")


# -- every real store -----------------------------------------------------------------------
def test_now_is_the_stores_clock(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", TTL)
    assert lease is not None
    now = backend.now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    # The clock lease times are in: after the acquisition, and the same clock as read().
    assert lease.acquired_at <= now
    snapshot = backend.read(lease_name)
    assert snapshot is not None and now <= snapshot.read_at <= backend.now()
    # The services run on this machine: the same clock, give or take.
    assert abs((now - datetime.now(timezone.utc)).total_seconds()) < 5


def test_shipped_stores_share_and_fence_slot_records(backend: Any, lease_name: str) -> None:
    assert type(backend).shared_slots is True
    slots = backend.slots()
    assert isinstance(slots, SlotStore) and slots.shared
    lease, _ = backend.acquire(lease_name, "alice", TTL)
    assert lease is not None
    lease = held(lease)
    slot = Slot("entry", slots.now(), lease.token, lease.holder, "task-1")
    slots.claim(lease, slot)
    assert backend.slots().load(lease) == {"entry": slot}  # another store object: shared
    assert abs((slots.now() - backend.now()).total_seconds()) < 5
    backend.release(lease)


def test_renew_many_on_real_stores(backend: Any, lease_name: str) -> None:
    first, _ = backend.acquire(lease_name, "alice", TTL)
    second, _ = backend.acquire(lease_name + "-2", "bob", TTL)
    assert first is not None and second is not None
    stale = replace(second, token=second.token + 1000)
    renewed = backend.renew_many([first, stale, second], TTL)
    assert [lease is not None for lease in renewed] == [True, False, True]
    assert renewed[0].holder == "alice" and renewed[2].holder == "bob"
    assert renewed[0].expires_at >= first.expires_at
    # PostgreSQL and Redis push wake-ups; SQLite and MySQL/MariaDB cannot: candidates poll.
    watch = backend.watch(lease_name, lambda: None)
    assert (watch is not None) == (getattr(backend, "vendor", "postgresql") == "postgresql")
    if watch is not None:
        watch.close()


def test_admin_members(backend: Any, lease_name: str) -> None:
    from django_leader.models import Lease as LeaseRow

    line = backend.describe()
    assert "\n" not in line and type(backend).__name__ in line
    if backend.rows_database is None:  # Redis, ZooKeeper: read live
        if "Redis" in type(backend).__name__:
            assert "CacheBackend" in line  # the name settings have used for it
        with pytest.raises(NotSupportedError):
            backend.now_expression()
        return
    assert backend.rows_database == backend.alias
    backend.acquire(lease_name, "alice", TTL)
    row = (
        LeaseRow.objects.using(backend.rows_database)
        .filter(name=lease_name, expires_at__gt=backend.now_expression())
        .annotate(store_now=backend.now_expression())
        .get()
    )
    assert row.holder == "alice"
    store_now = row.store_now
    if store_now.tzinfo is None:
        store_now = store_now.replace(tzinfo=timezone.utc)
    assert abs((store_now - backend.now()).total_seconds()) < 5


# -- system checks and the migration probe ---------------------------------------------------
def ids(messages: list[CheckMessage]) -> list[str | None]:
    return [message.id for message in messages]


def test_check_configuration_of_each_backend_class() -> None:
    from django_leader.backends.db import DatabaseBackend
    from django_leader.backends.redis import RedisBackend

    conf = get_settings()
    assert DatabaseBackend.check_configuration(conf) == []
    with override_settings(DJANGO_LEADER={"CACHE": "default"}):  # not a Redis cache
        assert ids(RedisBackend.check_configuration(get_settings())) == ["django_leader.E004"]
    with override_settings(DJANGO_LEADER={"CACHE": "missing"}):
        assert ids(RedisBackend.check_configuration(get_settings())) == ["django_leader.E004"]
    require("redis", kind="cache")
    with override_settings(DJANGO_LEADER={"CACHE": "redis"}):
        assert RedisBackend.check_configuration(get_settings()) == []


def test_cache_backend_is_the_redis_backend_under_its_former_name() -> None:
    from django_leader.backends import cache, redis

    assert cache.CacheBackend is redis.RedisBackend
    assert cache.redis_client is redis.redis_client
    require("redis", kind="cache")
    for path in (
        "django_leader.backends.cache.CacheBackend",
        "django_leader.backends.redis.RedisBackend",
    ):
        with override_settings(DJANGO_LEADER={"BACKEND": path, "CACHE": "redis"}):
            backend = get_backend()
            assert isinstance(backend, redis.RedisBackend)
            assert repr(backend) == "<RedisBackend 'redis'>"


def test_migration_state_of_a_migrated_database(db_alias: str) -> None:
    assert migration_state(db_alias) == ([], [])
