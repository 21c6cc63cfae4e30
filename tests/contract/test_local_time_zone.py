"""A project with ``USE_TZ = False`` and a ``TIME_ZONE`` other than UTC (Django keeps its
times naive, in local time), on each real database: every time the database store gives
is still the instant it names, and what it writes is accepted.

Before: on PostgreSQL, Django's connection is in ``TIME_ZONE`` when ``USE_TZ = False``
and gives naive local times, which the store labelled UTC: each lease time, the store's
clock and the candidates' times were off by the zone's offset (the batch renewal alone,
which reads times as integers, was right), and a beat slot came back naive. On MySQL and
SQLite, Django refuses an aware time when ``USE_TZ = False``: recording a beat slot (the
Celery, RQ, huey and APScheduler integrations) raised ``ValueError``, and the history of
the other stores (Redis, ZooKeeper: events with their own time) was dropped.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_leader.backends.db import DatabaseBackend
from django_leader.backends.slots import Slot
from django_leader.election import Candidate
from django_leader.lease import EventKind, HistoryEvent, Lease, clock
from django_leader.models import LeaseEvent, from_orm, to_orm
from tests.support.stores import stores_db

pytestmark = stores_db

#: +05:45: a time read in the wrong zone is off by hours and minutes.
ZONE = "Asia/Kathmandu"
#: The database servers run here: their clocks and this process's agree to well within it.
CLOSE = timedelta(seconds=30)


@pytest.fixture
def local_times(settings: Any, db_alias: str) -> str:
    """``USE_TZ = False``, ``TIME_ZONE`` :data:`ZONE` (Django sets the time zone of the
    connections it opens from now on, and of those already open: a setting_changed
    receiver)."""
    settings.USE_TZ = False
    settings.TIME_ZONE = ZONE
    return db_alias


def near(value: datetime | None, expected: datetime) -> bool:
    return value is not None and value.tzinfo is not None and abs(value - expected) < CLOSE


def test_lease_times_and_the_store_clock_are_instants(local_times: str, lease_name: str) -> None:
    store = DatabaseBackend(local_times)
    try:
        now = datetime.now(timezone.utc)
        assert near(store.now(), now), store.now()
        lease, _ = store.acquire(lease_name, "alice", 30)
        assert lease is not None
        assert near(lease.acquired_at, now) and near(lease.renewed_at, now), lease
        assert near(lease.expires_at, now + timedelta(seconds=30)), lease
        read = store.read(lease_name)
        assert read is not None and near(read.expires_at, lease.expires_at), read  # type: ignore[arg-type]
        assert near(read.read_at, now), read.read_at
        refused, current = store.acquire(lease_name, "bob", 30)
        assert refused is None and current is not None
        assert near(current.read_at, now) and near(current.expires_at, now + timedelta(seconds=30))
        renewed = store.renew(lease, 60)
        assert renewed is not None and near(renewed.expires_at, now + timedelta(seconds=60))
        (batch,) = store.renew_many([renewed], 90)
        assert batch is not None and near(batch.expires_at, now + timedelta(seconds=90))
        store.announce(lease_name, Candidate("bob"), 30)
        (bob,) = store.candidates(lease_name) or []
        assert near(bob.seen_at, now) and near(bob.expires_at, now + timedelta(seconds=30)), bob
    finally:
        store.close()


def claimed_then_loaded(database: str, name: str, at: datetime) -> tuple[Slot, datetime]:
    """A slot at ``at`` claimed under a lease of ``name``, then loaded back; and the slot
    records' clock."""
    store = DatabaseBackend(database)
    try:
        lease, _ = store.acquire(name, "alice", 30)
        assert lease is not None
        lease.deadline = clock() + 20  # as its term would have it: held
        slots = store.slots()
        slots.claim(lease, Slot("digest", at, lease.token, lease.holder, "task-1"))
        return slots.load(lease)["digest"], slots.now()
    finally:
        store.close()


def test_a_beat_slot_keeps_its_instant(local_times: str, lease_name: str) -> None:
    at = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)
    found, now = claimed_then_loaded(local_times, lease_name, at)
    assert found.at == at and found.at.tzinfo is not None, found
    assert near(now, datetime.now(timezone.utc))


def test_another_stores_history_is_written_at_its_time(local_times: str, lease_name: str) -> None:
    """What the history writer of Redis and ZooKeeper does: events with their own time."""
    at = datetime.now(timezone.utc) - timedelta(minutes=5)
    lease = Lease(lease_name, "alice", 7, at, at, at + timedelta(seconds=30), 1)
    store = DatabaseBackend(local_times)
    try:
        store.write_events([HistoryEvent(EventKind.ACQUIRED, lease, at, "", "")])
    finally:
        store.close()
    events = LeaseEvent.objects.using(local_times).filter(name=lease_name)
    (event,) = events
    assert abs(from_orm(event.at, local_times) - at) < timedelta(milliseconds=1), event.at
    # A query of the history by an aware time, as the admin's.
    assert events.filter(at__gt=to_orm(at - timedelta(seconds=1), local_times)).count() == 1


def test_the_orm_reads_the_stores_times_as_the_instants_they_are(
    local_times: str, lease_name: str
) -> None:
    """What the admin reads through the ORM (the Lease rows, their history) and converts
    with :func:`~django_leader.models.from_orm`: the instants the store wrote."""
    from django_leader.models import Lease as LeaseRow

    store = DatabaseBackend(local_times)
    try:
        lease, _ = store.acquire(lease_name, "alice", 30)
        assert lease is not None
        assert store.flush_history(10)
    finally:
        store.close()
    row = LeaseRow.objects.using(local_times).get(name=lease_name)
    assert lease.expires_at is not None
    off = abs(from_orm(row.expires_at, local_times) - lease.expires_at)
    assert off < timedelta(milliseconds=1), (row.expires_at, lease.expires_at)
    event = LeaseEvent.objects.using(local_times).get(name=lease_name)
    assert near(from_orm(event.at, local_times), lease.acquired_at), event.at  # type: ignore[arg-type]


def test_leader_history_gives_each_events_instant(local_times: str, lease_name: str) -> None:
    """``manage.py leader history --json``: aware times (they were naive, and local on
    PostgreSQL, with ``USE_TZ = False``)."""
    store = DatabaseBackend(local_times)
    try:
        lease, _ = store.acquire(lease_name, "alice", 30)
        assert lease is not None and lease.acquired_at is not None
        assert store.flush_history(10)
    finally:
        store.close()
    out = io.StringIO()
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "DATABASE": local_times}):
        call_command("leader", "history", lease_name, "--json", stdout=out)
    (row,) = json.loads(out.getvalue())
    assert near(datetime.fromisoformat(row["at"]), lease.acquired_at), row


@pytest.fixture
def database_zone(db_alias: str) -> Iterator[str]:
    """``USE_TZ = True`` and ``DATABASES[db_alias]["TIME_ZONE"]`` :data:`ZONE` (a legacy
    database that keeps local times: the ORM writes and reads them in that zone)."""
    connection = connections[db_alias]

    def reset() -> None:
        connection.close()
        for cached in ("timezone", "timezone_name"):
            connection.__dict__.pop(cached, None)

    saved = connection.settings_dict.get("TIME_ZONE")
    connection.settings_dict["TIME_ZONE"] = ZONE
    reset()
    yield db_alias
    connection.settings_dict["TIME_ZONE"] = saved
    reset()


def test_a_beat_slot_keeps_its_instant_in_a_database_of_local_times(
    database_zone: str, lease_name: str
) -> None:
    """Review of this change: with the slots read raw and written through the ORM, a
    database whose ``TIME_ZONE`` is set gave the slot back off by the zone's offset (MySQL,
    SQLite). Both ways go through the ORM."""
    at = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    found, _ = claimed_then_loaded(database_zone, lease_name, at)
    assert found.at == at
