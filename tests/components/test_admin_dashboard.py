"""The admin's dashboard: every lease with its leader, the candidates waiting, its last
transition and its alerts, read through the backend contract from every store (each
database, and Redis through both cache clients); who may see it, and where it is linked.

Django's test client against the real test databases and Redis; the lease backends write
on private connections that commit on their own, so every test runs with
``transaction=True``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db.models import F
from django.test import Client, override_settings
from django.urls import reverse

from django_leader.admin.constants import FLAPPING_TRANSITIONS
from django_leader.backends import get_backend
from django_leader.backends.zookeeper import ZooKeeperBackend
from django_leader.election import Candidate
from django_leader.models import LeaseEvent
from tests.support.counting import round_trips
from tests.support.stores import (
    CACHE_STORES,
    DATABASE_STORES,
    OTHER_STORES,
    require,
    store_settings,
    unreachable_redis,
    zookeeper_backend,
)

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

DASHBOARD = "admin:django_leader_lease_dashboard"


@pytest.fixture(params=[*DATABASE_STORES, *CACHE_STORES, *OTHER_STORES])
def leader_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The admin pointed at each store (DJANGO_LEADER overridden), and a backend of it."""
    store_id = request.param
    if store_id == "zookeeper":
        zk = zookeeper_backend()  # the tests' root, initialized
        conf = {**settings.DJANGO_LEADER, **store_settings(zk)}
        zk.shutdown()
    elif store_id in DATABASE_STORES:
        require(DATABASE_STORES[store_id])
        conf = {
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DATABASE": DATABASE_STORES[store_id],
        }
    else:
        require(CACHE_STORES[store_id], kind="cache")
        conf = {
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.cache.CacheBackend",
            "CACHE": CACHE_STORES[store_id],
        }
    with override_settings(DJANGO_LEADER=conf):
        backend = get_backend()
        try:
            yield backend
        finally:
            backend.flush_history(10)
            backend.close()
            if isinstance(backend, ZooKeeperBackend):
                backend.shutdown()


def rows(html: str) -> dict[str, str]:
    """The dashboard's rows by lease name, in the order shown (dicts keep it)."""
    found = re.findall(r'<tr class="leader-lease[^"]*" data-lease="([^"]+)">(.*?)</tr>', html, re.S)
    return dict(found)


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def backdate(backend: Any, name: str, by: timedelta) -> None:
    """Move every history event of ``name`` back by ``by``."""
    assert backend.flush_history(10)
    events = LeaseEvent.objects.using(backend.history_database).filter(name=name)
    assert events.update(at=F("at") - by) > 0


def test_dashboard_shows_leaders_candidates_transitions_and_alerts(
    admin_client: Client, leader_store: Any
) -> None:
    backend = leader_store
    base = f"dash-{uuid.uuid4().hex[:10]}"
    held, orphaned, flappy, idle = (f"{base}-{n}" for n in ("held", "orphaned", "flappy", "idle"))
    lease, _ = backend.acquire(held, "alice", 60)
    assert lease is not None
    backend.announce(held, Candidate("bob"), 60)
    # Released five minutes ago, two candidates waiting, nobody took it: no leader.
    released, _ = backend.acquire(orphaned, "carol", 60)
    backend.release(released)
    for identity in ("dave", "erin"):
        backend.announce(orphaned, Candidate(identity), 60)
    # More transitions than the limit within the window: flapping.
    for n in range(FLAPPING_TRANSITIONS + 1):
        term, _ = backend.acquire(flappy, f"worker-{n}", 60)
        if n < FLAPPING_TRANSITIONS:
            backend.release(term)
    # Released an hour ago, nobody waiting: idle, no alert.
    done, _ = backend.acquire(idle, "frank", 60)
    backend.release(done)
    backdate(backend, orphaned, timedelta(minutes=5))
    backdate(backend, idle, timedelta(hours=1))

    response = admin_client.get(reverse(DASHBOARD), {"q": base})
    assert response.status_code == 200
    html = response.content.decode()
    shown = rows(html)
    assert set(shown) == {held, orphaned, flappy, idle}
    # Alerts first, then by name.
    assert list(shown) == [flappy, orphaned, held, idle]

    row = text(shown[held])
    assert "alice" in row and str(lease.token) in row and "1: bob" in row
    assert re.search(r"\b\d+ s\b", row), row  # time left, by the store's clock
    assert "acquired" in row and "data-alert" not in shown[held]

    row = text(shown[orphaned])
    assert 'data-alert="no-leader"' in shown[orphaned] and "nobody" in row
    assert "2: dave" in row and "erin" in row
    assert "released 5 min" in row and "2 candidates waiting" in row

    assert 'data-alert="flapping"' in shown[flappy]
    assert f"{FLAPPING_TRANSITIONS + 1} transitions in the last 10 min" in text(shown[flappy])

    assert "data-alert" not in shown[idle] and "released" in text(shown[idle])
    # The store's clock, its zone, and times to the second.
    assert "Store clock:" in html and "shown in UTC" in html
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text(shown[held]))
    assert "4 leases" in text(html) and "2 with alerts" in text(html)


@pytest.mark.parametrize("leader_store", [*DATABASE_STORES, *CACHE_STORES], indirect=True)
def test_dashboard_reads_the_store_in_a_few_round_trips_whatever_the_leases(
    admin_client: Client, leader_store: Any
) -> None:
    """The dashboard read each lease and its candidates, two round trips per lease shown
    (400 for a page of 200). Now one batch for the page: a page of 200 leases costs the
    store as many round trips as a page of 10, give or take a few. History queries (two per
    lease, on their index) are not the store's and are left out of the count."""
    backend = leader_store
    base = f"dash-{uuid.uuid4().hex[:10]}"
    names = [f"{base}-{i:04d}" for i in range(200)]
    for name in names:
        assert backend.acquire(name, "alice", 300)[0] is not None
    backend.announce(names[3], Candidate("bob"), 300)

    def store_trips(query: str) -> tuple[int, str]:
        with round_trips() as trips:
            response = admin_client.get(reverse(DASHBOARD), {"q": query})
        assert response.status_code == 200
        return sum(
            1 for trip in trips if "leaseevent" not in trip.lower()
        ), response.content.decode()

    few, html = store_trips(f"{base}-000")  # 10 leases
    assert len(rows(html)) == 10 and "1: bob" in text(rows(html)[names[3]])
    many, html = store_trips(base)  # 200 leases
    shown = rows(html)
    assert len(shown) == 200
    assert all("alice" in text(row) for row in shown.values())
    assert many - few <= 5, (few, many)


def test_a_store_that_cannot_be_reached_shows_an_error_not_a_crash(admin_client: Client) -> None:
    pytest.importorskip("redis")
    with override_settings(**unreachable_redis()):
        response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    assert "Cannot list the leases of the store" in response.content.decode()


def test_dashboard_needs_the_view_permission_and_is_linked(
    client: Client, django_user_model: Any
) -> None:
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(DASHBOARD)).status_code == 403
    index = client.get(reverse("admin:app_list", args=["django_leader"]))
    assert index.status_code in (403, 404)

    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_leader", codename="view_lease")
    )
    assert client.get(reverse(DASHBOARD)).status_code == 200
    dashboard = reverse(DASHBOARD)
    # The admin's index and the section list the dashboard (issue 28: the index did not),
    # whose entry leads to it.
    entry = reverse("admin:django_leader_leasedashboard_changelist")
    for page in (reverse("admin:index"), reverse("admin:app_list", args=["django_leader"])):
        assert f'href="{entry}"' in client.get(page).content.decode(), page
    assert client.get(entry).url == dashboard
    listing = client.get(reverse("admin:django_leader_lease_changelist")).content.decode()
    assert f'href="{dashboard}"' in listing


def test_a_schedule_two_periods_behind_while_a_leader_holds_is_flagged(
    admin_client: Client, leader_store: Any
) -> None:
    from django_leader import lock
    from django_leader.backends.slots import Slot

    backend = leader_store
    base = f"sched-{uuid.uuid4().hex[:10]}"
    late, on_time = f"{base}-late", f"{base}-on-time"
    schedule = {
        "digest": {"task": "testproject.demoapp.jobs.tick", "every": 60},
        "report": {"task": "testproject.demoapp.jobs.tick", "every": 3600},
    }
    now = backend.slots().now()
    with (
        override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "TASKS_SCHEDULE": schedule}),
        lock(late, backend=backend, ttl=60) as behind,
        lock(on_time, backend=backend, ttl=60) as keeping_up,
    ):
        slots = backend.slots()
        # "digest" every minute, last recorded three minutes ago: two slots fell due since.
        minutes_ago = now - timedelta(minutes=3)
        slots.claim(behind, Slot("digest", minutes_ago, behind.token, behind.holder, "t"))
        # "report" every hour, last recorded three minutes ago: not even the next one is due.
        slots.claim(behind, Slot("report", minutes_ago, behind.token, behind.holder, "t"))
        slots.claim(keeping_up, Slot("digest", now, keeping_up.token, keeping_up.holder, "t"))
        # A slot of something that is not in TASKS_SCHEDULE (a beat's entry): not judged.
        slots.claim(keeping_up, Slot("celery-x", minutes_ago, keeping_up.token, "b", "t"))
        html = admin_client.get(reverse(DASHBOARD), {"q": base}).content.decode()
    shown = rows(html)
    assert 'data-alert="behind"' in shown[late]
    assert "digest: last slot recorded 3 min" in text(shown[late])
    assert "report" not in text(shown[late])
    assert "data-alert" not in shown[on_time]
