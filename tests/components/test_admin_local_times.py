"""The admin of a project with ``USE_TZ = False`` and a ``TIME_ZONE`` other than UTC, on
each database: every page renders, and each time it shows is the instant the store
recorded, in that zone.

Before: the history list and a lease's page failed (``localtime() cannot be applied to a
naive datetime``: the ORM gives naive times there), and so did the dashboard on MySQL and
SQLite (an aware time in a query, which Django refuses when ``USE_TZ = False``); on
PostgreSQL, whose ORM gives naive local times, those taken for UTC were off by the zone's
offset.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from django_leader.backends import get_backend
from django_leader.lease import EventKind, HistoryEvent, Lease

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

#: +05:45: a time shown in the wrong zone is off by hours and minutes.
ZONE = "Asia/Kathmandu"


@pytest.fixture
def store(settings: Any, db_alias: str) -> Iterator[Any]:
    """The admin's store: the database ``db_alias``, with ``USE_TZ = False``."""
    settings.USE_TZ, settings.TIME_ZONE = False, ZONE
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "DATABASE": db_alias}
    backend = get_backend()
    yield backend
    backend.flush_history(10)
    backend.close()


def shown(instant: datetime) -> list[str]:
    """How the admin may write ``instant`` in :data:`ZONE`, to the second (the second
    before or after too: a history event is stamped by its own statement)."""
    zone = ZoneInfo(ZONE)
    moments = (instant + timedelta(seconds=s) for s in (-1, 0, 1))
    return [m.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S") for m in moments]


def page(client: Client, url: str, **params: str) -> str:
    response = client.get(url, params)
    assert response.status_code == 200, response.content.decode()[-2000:]
    return str(response.content.decode())


def test_every_page_shows_the_stores_instants_in_the_zone(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    lease, _ = store.acquire(lease_name, "alice", 60)
    assert lease is not None and lease.expires_at is not None
    assert store.flush_history(10)

    listed = page(admin_client, reverse("admin:django_leader_lease_changelist"), q=lease_name)
    (row,) = [r for r in listed.split("<tr") if f">{lease_name}<" in r]
    assert "leader-state-leading" in row
    left = re.search(r">(\d+) s<", row)
    assert left is not None and 40 <= int(left.group(1)) <= 60, row
    assert any(text in row for text in shown(lease.renewed_at)), row

    url = reverse("admin:django_leader_lease_change", args=[quote(lease_name)])
    detail = page(admin_client, url)
    assert any(text in detail for text in shown(lease.acquired_at)), detail
    assert 'class="gap"' not in detail  # nothing red: alice leads since the first event

    dashboard = page(admin_client, reverse("admin:django_leader_lease_dashboard"), q=lease_name)
    assert "alice" in dashboard and "data-alert" not in dashboard

    history = page(admin_client, reverse("admin:django_leader_leaseevent_changelist"))
    assert any(text in history for text in shown(lease.acquired_at)), history
    year = page(
        admin_client,
        reverse("admin:django_leader_leaseevent_changelist"),
        at__year=str(lease.acquired_at.astimezone(ZoneInfo(ZONE)).year),
    )
    assert lease_name in year


def test_the_history_drill_down_counts_days_in_the_zone(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    """Review of this change: Django bounds a day of the drill-down in naive local time,
    and MySQL and SQLite columns hold naive UTC: the day of an event written at
    20:00 UTC (01:45 the next day in the zone) listed it a day early there."""
    at = datetime(2026, 3, 10, 20, 0, tzinfo=timezone.utc)  # 2026-03-11 01:45 in the zone
    lease = Lease(lease_name, "alice", 1, at, at, at + timedelta(seconds=30), 1)
    store.write_events([HistoryEvent(EventKind.ACQUIRED, lease, at, "", "")])
    url = reverse("admin:django_leader_leaseevent_changelist")

    def listed(day: int) -> bool:
        params = {"at__year": "2026", "at__month": "3", "at__day": str(day)}
        html = page(admin_client, url, name=lease_name, **params)
        return 'class="field-holder_id"' in html  # a row of the list

    assert listed(11) and not listed(10)
