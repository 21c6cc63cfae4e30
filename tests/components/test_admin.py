"""The admin: who may see and force-release leases, the read-only history, both stores,
the store's clock, the timeline, and the history's query plans at scale.

Django's test client against the real test databases. The lease backends write on private
connections that commit on their own, so every test here runs with ``transaction=True``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core import checks
from django.db import connections
from django.db.models import F
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leader import admin as leader_admin
from django_leader.admin import drawing, periods
from django_leader.backends import get_backend
from django_leader.election import Candidate
from django_leader.models import Lease, LeaseEvent
from tests.support.stores import history, require, unreachable_redis
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
#: For tests that use a database other than the default one.
every_db = pytest.mark.django_db(transaction=True, databases="__all__")

LIST = "admin:django_leader_lease_changelist"
EVENTS = "admin:django_leader_leaseevent_changelist"
PASSWORD = "pw-for-tests"
ACTION_CHECKBOX = "_selected_action"


def change_url(name: str) -> str:
    return reverse("admin:django_leader_lease_change", args=[quote(name)])


def release_url(name: str) -> str:
    return reverse("admin:django_leader_lease_release", args=[quote(name)])


def handover_url(name: str) -> str:
    return reverse("admin:django_leader_lease_handover", args=[quote(name)])


@pytest.fixture
def make_staff(django_user_model: Any) -> Any:
    def make(username: str, *perms: str) -> Any:
        user = django_user_model.objects.create_user(username, password=PASSWORD, is_staff=True)
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        return user

    return make


def login(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


def row_of(html: str, name: str) -> str:
    """The changelist table row that shows ``name``."""
    rows = [row for row in html.split("<tr") if f">{name}<" in row]
    assert len(rows) == 1, f"no single row for {name!r}"
    return rows[0]


def action_post(names: list[str], action: str = "force_release") -> dict[str, Any]:
    return {"action": action, ACTION_CHECKBOX: names, "index": "0"}


def events_of(name: str) -> list[tuple[str, str, str]]:
    """``(kind, holder, actor)`` of each event of ``name``, oldest first."""
    return list(
        LeaseEvent.objects.filter(name=name)
        .order_by("at", "id")
        .values_list("kind", "holder", "actor")
    )


# -- permissions ----------------------------------------------------------------------------


def test_staff_without_permissions_sees_no_lease_pages(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    login(client, make_staff("nobody"))

    index = client.get(reverse("admin:index"))
    assert index.status_code == 200
    assert "Leader election" not in index.content.decode()
    for url in (
        reverse(LIST),
        change_url(lease_name),
        reverse(EVENTS),
        release_url(lease_name),
        reverse("admin:app_list", args=["django_leader"]),
    ):
        assert client.get(url).status_code in (403, 404), url
    assert client.post(release_url(lease_name)).status_code == 403
    assert client.post(reverse(LIST), action_post([lease_name])).status_code == 403
    assert store.read(lease_name).holder == "alice"
    assert [kind for kind, *_ in events_of(lease_name)] == ["acquired"]


def test_view_permission_shows_leases_but_no_force_release(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    login(client, make_staff("viewer", "django_leader.view_lease", "django_leader.view_leaseevent"))

    listing = client.get(reverse(LIST), {"q": lease_name})  # page 1 may hold other leases
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "alice" in row_of(html, lease_name)
    assert "leader-state-leading" in row_of(html, lease_name)
    assert "force_release" not in html and ACTION_CHECKBOX not in html

    page = client.get(change_url(lease_name))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'class="leader-timeline"' in html and "alice" in html
    assert release_url(lease_name) not in html and 'id="leader-release"' not in html

    assert client.get(release_url(lease_name)).status_code == 403
    assert client.post(release_url(lease_name)).status_code == 403
    client.post(reverse(LIST), action_post([lease_name]))  # the action is not offered
    assert store.read(lease_name).holder == "alice"
    assert [kind for kind, *_ in events_of(lease_name)] == ["acquired"]


def test_release_permission_force_releases_and_history_names_the_user(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    lease, _ = store.acquire(lease_name, "alice", 60)
    login(client, make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"))

    page = client.get(change_url(lease_name)).content.decode()
    assert 'id="leader-release"' in page and release_url(lease_name) in page

    response = client.post(release_url(lease_name), {"reason": "stuck after a deploy"})
    assert response.status_code == 302 and response["Location"] == change_url(lease_name)
    assert store.read(lease_name) is None
    last = history(store, lease_name)[-1]
    assert last == ("forced_release", "alice", "", lease.token, "operator")
    assert LeaseEvent.objects.get(name=lease_name, kind="forced_release").detail == (
        "stuck after a deploy"
    )
    from django.contrib.admin.models import LogEntry

    logged = LogEntry.objects.get(object_id=lease_name)
    assert logged.user.username == "operator" and "Force-released" in logged.change_message
    # The holder finds out at its next renewal.
    assert store.renew(lease, 60) is None
    # The page shows the released lease (nobody may take it before the term ends), the
    # new history row, and no release button.
    page = client.get(change_url(lease_name)).content.decode()
    assert "leader-state-releasing" in page and "free in" in page
    assert "leader-event-forced_release" in page
    assert 'id="leader-release"' not in page


def test_force_release_action_on_the_list(client: Client, make_staff: Any, store: Any) -> None:
    names = [f"test-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    for name in names:
        store.acquire(name, f"holder-of-{name}", 60)
    login(client, make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"))

    listing = client.get(reverse(LIST)).content.decode()
    assert 'value="force_release"' in listing

    response = client.post(reverse(LIST), action_post(names[:2]), follow=True)
    assert response.status_code == 200
    assert "Force-released" in response.content.decode()
    assert [store.read(name) is None for name in names] == [True, True, False]
    for name in names[:2]:
        assert events_of(name)[-1] == ("forced_release", f"holder-of-{name}", "operator")
    assert events_of(names[2])[-1][0] == "acquired"


def test_get_on_release_url_changes_nothing(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    login(client, make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"))

    response = client.get(release_url(lease_name))
    assert response.status_code == 200  # a confirmation page
    html = response.content.decode()
    assert "alice" in html and 'method="post"' in html
    assert store.read(lease_name).holder == "alice"
    assert [kind for kind, *_ in events_of(lease_name)] == ["acquired"]
    for method in ("put", "delete", "patch"):
        assert getattr(client, method)(release_url(lease_name)).status_code == 405
    assert store.read(lease_name).holder == "alice"


def test_forged_post_without_csrf_token_is_rejected(
    make_staff: Any, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    browser = login(
        Client(enforce_csrf_checks=True),
        make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"),
    )
    assert browser.post(release_url(lease_name)).status_code == 403
    assert browser.post(reverse(LIST), action_post([lease_name])).status_code == 403
    assert store.read(lease_name).holder == "alice"
    assert [kind for kind, *_ in events_of(lease_name)] == ["acquired"]

    # The same request with the page's token goes through: the 403 was the CSRF check.
    page = browser.get(release_url(lease_name)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    response = browser.post(release_url(lease_name), {"csrfmiddlewaretoken": token.group(1)})
    assert response.status_code == 302
    assert store.read(lease_name) is None


def test_history_is_read_only_for_superusers(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    lease, _ = store.acquire(lease_name, "alice", 60)
    store.release(lease)
    store.flush_history(10)
    event = LeaseEvent.objects.filter(name=lease_name).order_by("at", "id").first()
    assert event is not None
    before = list(LeaseEvent.objects.filter(name=lease_name).values())
    url = reverse("admin:django_leader_leaseevent_change", args=[event.pk])
    delete = reverse("admin:django_leader_leaseevent_delete", args=[event.pk])

    page = admin_client.get(url)
    assert page.status_code == 200  # viewable
    assert 'name="_save"' not in page.content.decode()
    assert admin_client.post(url, {"holder": "mallory", "kind": "released"}).status_code == 403
    assert admin_client.get(delete).status_code == 403
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert admin_client.get(reverse("admin:django_leader_leaseevent_add")).status_code == 403
    listing = admin_client.get(reverse(EVENTS)).content.decode()
    assert 'name="action"' not in listing
    admin_client.post(reverse(EVENTS), action_post([str(event.pk)], "delete_selected"))
    assert list(LeaseEvent.objects.filter(name=lease_name).values()) == before
    # Nor can anyone edit a lease by hand, or add one.
    assert admin_client.get(reverse("admin:django_leader_lease_add")).status_code == 403
    assert admin_client.post(change_url(lease_name), {"holder": "x"}).status_code == 403
    lease_delete = reverse("admin:django_leader_lease_delete", args=[lease_name])
    assert admin_client.post(lease_delete).status_code == 403


# -- the store's clock, both stores ---------------------------------------------------------


def wait_until_expired(backend: Any, name: str, timeout: float = 10.0) -> None:
    wait_until(lambda: backend.read(name) is None, timeout=timeout, message="lease never expired")


@every_db
def test_state_and_time_left_come_from_the_database_clock(
    admin_client: Client, db_alias: str
) -> None:
    """With this process's clock two hours off, the states are still the database's."""
    import time_machine

    base = f"test-{uuid.uuid4().hex[:10]}"
    alive, stale, free, forced = (f"{base}-{n}" for n in ("a", "s", "f", "r"))
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "DATABASE": db_alias}):
        backend = get_backend()
        try:
            backend.acquire(alive, "alice", 60)
            backend.acquire(stale, "bob", 0.2)
            lease, _ = backend.acquire(free, "carol", 60)
            assert lease is not None
            backend.release(lease)
            backend.acquire(forced, "dave", 60)
            backend.force_release(forced, actor="test")
            wait_until_expired(backend, stale)
            with time_machine.travel(datetime.now(dt_timezone.utc) + timedelta(hours=2)):
                # Searched: the list's first page may be full of other tests' leases.
                html = admin_client.get(reverse(LIST), {"q": base}).content.decode()
                leading = admin_client.get(
                    reverse(LIST), {"state": "leading", "q": base}
                ).content.decode()
        finally:
            backend.close()
        assert Lease.objects.using(db_alias).filter(name=alive).exists()
    assert "leader-state-leading" in row_of(html, alive)
    seconds = re.search(r">(\d+) s<", row_of(html, alive))
    assert seconds is not None and 40 <= int(seconds.group(1)) <= 60
    assert "leader-state-expired" in row_of(html, stale) and "expired" in row_of(html, stale)
    assert "leader-state-free" in row_of(html, free)
    assert "leader-state-releasing" in row_of(html, forced)
    assert "free in" in row_of(html, forced) and "(was dave)" in row_of(html, forced)
    assert alive in leading and not {stale, free, forced} & set(re.findall(r">([^<]+)<", leading))


def test_cache_backend_shows_the_live_redis_state(admin_client: Client, lease_name: str) -> None:
    require("redis", kind="cache")
    conf = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.cache.CacheBackend",
        "CACHE": "redis",
    }
    with override_settings(DJANGO_LEADER=conf):
        backend = get_backend()
        try:
            lease, _ = backend.acquire(lease_name, "redis-holder", 60)
            assert lease is not None
            assert backend.flush_history(10)
            # Searched: Redis lists every name ever used, more than one page of them.
            html = admin_client.get(reverse(LIST), {"q": lease_name}).content.decode()
            assert "CacheBackend" in html
            assert "redis-holder" in row_of(html, lease_name)
            assert "leader-state-leading" in row_of(html, lease_name)
            assert str(lease.token) in row_of(html, lease_name)

            page = admin_client.get(change_url(lease_name)).content.decode()
            assert "redis-holder (leads now)" in page
            assert "leader-event-acquired" in page and 'id="leader-release"' in page

            response = admin_client.post(release_url(lease_name), {"reason": "test"})
            assert response.status_code == 302
            assert backend.read(lease_name) is None
            assert history(backend, lease_name)[-1] == (
                "forced_release",
                "redis-holder",
                "",
                lease.token,
                "admin",
            )
            page = admin_client.get(change_url(lease_name)).content.decode()
            assert "leader-state-free" in page and "leader-event-forced_release" in page
            # Nothing of it came from the lease table: the state is Redis's.
            assert not Lease.objects.filter(name=lease_name).exists()
            assert admin_client.get(change_url("never-" + lease_name)).status_code == 302
        finally:
            backend.flush_history(10)
            backend.close()


def test_unreachable_redis_shows_an_error_not_a_crash(admin_client: Client) -> None:
    pytest.importorskip("redis")
    now = datetime.now(dt_timezone.utc)
    LeaseEvent.objects.create(name="somewhere", kind="acquired", holder="h", token=1, at=now)
    with override_settings(**unreachable_redis()):
        assert admin_client.get(reverse(LIST)).status_code == 200
        page = admin_client.get(change_url("somewhere"))
        assert page.status_code == 200
        assert "leader-state-unknown" in page.content.decode()
        assert "Cannot read the lease store" in page.content.decode()
        assert admin_client.get(reverse(EVENTS)).status_code == 200


def test_lease_page_timeline_shows_terms_gaps_and_current_holder(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    first, _ = store.acquire(lease_name, "alice", 60)
    store.release(first)
    time.sleep(0.05)  # a gap the timeline must show between the two terms
    store.acquire(lease_name, "bob", 60)
    store.flush_history(10)

    for key in ("hour", "day", "week"):
        page = admin_client.get(change_url(lease_name), {"timeline": key}).content.decode()
        start = page.index('class="leader-timeline"')
        svg = page[start : page.index("</svg>", start)]
        assert 'data-holder="alice"' in svg and 'data-holder="bob"' in svg
        assert "bob (leads now)" in svg
        assert 'class="gap"' in svg  # before alice, and between alice and bob
        assert "<script" not in svg and "http://" not in svg.replace(
            'xmlns="http://www.w3.org/2000/svg"', ""
        )
    assert 'aria-label="Who held' in page


def svg_of(html: str) -> str:
    start = html.index('class="leader-timeline"')
    return html[start : html.index("</svg>", start)]


def svg_times(svg: str) -> tuple[datetime, datetime]:
    """The picture's range: ``(start, now)``."""
    start = re.search(r'data-start="([^"]+)"', svg)
    now = re.search(r'data-now="([^"]+)"', svg)
    assert start is not None and now is not None
    return datetime.fromisoformat(start.group(1)), datetime.fromisoformat(now.group(1))


def test_a_new_lease_timeline_fits_its_history_and_paints_nothing_red(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    """The default range is the lease's history; before its first event "no history"."""
    store.acquire(lease_name, "alice", 60)
    store.flush_history(10)
    # Acquired an hour ago (as far as the history says).
    LeaseEvent.objects.filter(name=lease_name).update(at=F("at") - timedelta(hours=1))
    first = LeaseEvent.objects.get(name=lease_name).at

    html = admin_client.get(change_url(lease_name)).content.decode()
    svg = svg_of(html)
    assert 'class="gap"' not in svg  # nothing red: alice has led since the first event
    start, now = svg_times(svg)
    assert timedelta(minutes=2) < first - start < timedelta(minutes=4)  # 5 % of the hour
    assert abs(start - periods.fitted_start(first, now)) < timedelta(milliseconds=1)
    assert svg.count('class="no-history"') == 1
    assert "alice (leads now)" in svg
    assert '<strong data-range="history">whole history</strong>' in html
    for key, (_label, length) in leader_admin.constants.RANGES.items():
        if length is None:
            continue
        page = admin_client.get(change_url(lease_name), {"timeline": key}).content.decode()
        assert f'<strong data-range="{key}">' in page
        svg = svg_of(page)
        start, now = svg_times(svg)
        assert abs((now - start) - length) < timedelta(seconds=1), key
        assert 'class="gap"' not in svg, key  # before it existed: no history, not red
        assert svg.count('class="no-history"') == (1 if start < first else 0), key
        assert 'data-key="no-history"' in svg and 'data-key="gap"' in svg  # the legend


def test_force_release_comes_back_to_the_chosen_range(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    other = f"{lease_name}-2"
    store.acquire(lease_name, "alice", 60)
    store.acquire(other, "bob", 60)
    login(client, make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"))
    chosen = f"{release_url(lease_name)}?timeline=week"
    assert client.get(chosen).status_code == 200  # the confirmation page posts to itself
    response = client.post(chosen, {"reason": "moving"})
    assert response.status_code == 302
    assert response["Location"] == f"{change_url(lease_name)}?timeline=week"
    assert store.read(lease_name) is None
    # The lease's page sends its range along with the form.
    page = client.get(change_url(other), {"timeline": "week"}).content.decode()
    assert f'action="{release_url(other)}?timeline=week"' in page
    # Without a range chosen, back to the page as it was.
    response = client.post(release_url(other))
    assert response["Location"] == change_url(other)


@pytest.mark.parametrize("zone, abbreviation", [("UTC", "UTC"), ("Asia/Kolkata", "IST")])
def test_every_time_is_shown_to_the_second_with_its_zone(
    admin_client: Client, store: Any, lease_name: str, zone: str, abbreviation: str
) -> None:
    at = datetime(2026, 1, 1, 12, 0, 7, tzinfo=dt_timezone.utc)
    shown = {"UTC": "2026-01-01 12:00:07 UTC", "Asia/Kolkata": "2026-01-01 17:30:07 IST"}[zone]
    store.acquire(lease_name, "alice", 60)
    store.flush_history(10)
    event = LeaseEvent.objects.create(
        name=lease_name, kind="released", holder="alice", token=1, at=at
    )
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d " + abbreviation)

    def words(url: str, **params: str) -> str:
        html = admin_client.get(url, params).content.decode()
        return " ".join(re.sub(r"<[^>]+>", " ", html).split())

    with override_settings(TIME_ZONE=zone):
        listing = words(reverse(LIST), q=lease_name)
        page = words(change_url(lease_name))
        events = words(reverse(EVENTS), name=lease_name)
        one = words(reverse("admin:django_leader_leaseevent_change", args=[event.pk]))
    for what, words_ in (("lease", page), ("history", events), ("event", one)):
        assert shown in words_, what
    for what, words_ in (("list", listing), ("lease", page), ("history", events), ("event", one)):
        assert stamp.search(words_), what
        assert f"shown in {abbreviation}" in words_ or what == "event", what
    with override_settings(TIME_ZONE=zone):
        dashboard = words(reverse("admin:django_leader_lease_dashboard"), q=lease_name)
    assert stamp.search(dashboard) and f"shown in {abbreviation}" in dashboard
    # The timeline's tooltips too.
    svg = svg_of(admin_client.get(change_url(lease_name)).content.decode())
    assert re.search(r"alice, token \d+: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC to", svg)


def test_election_history_and_admin_log_are_told_apart(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    html = admin_client.get(change_url(lease_name)).content.decode()
    assert 'class="leader-election-history">Election history</a>' in html
    assert 'class="historylink">Admin log</a>' in html
    assert "Lease history" not in html and ">History</a>" not in html


def test_lease_page_lists_the_candidates_waiting(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    for identity in ("alice", "bob", "carol"):
        store.announce(lease_name, Candidate(identity), 60)
    page = admin_client.get(change_url(lease_name)).content.decode()
    field = page[page.index("field-candidates_waiting") :]
    field = field[: field.index("</div>", field.index("readonly"))]
    assert "bob, carol" in field and "alice" not in field


def section(page: str, element_id: str) -> str:
    """The ``<section id=element_id>`` of a page."""
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


def test_lease_page_shows_each_candidate_with_its_place_and_last_heartbeat(
    admin_client: Client, store: Any, lease_name: str
) -> None:
    store.acquire(lease_name, "alice", 60)
    store.announce(lease_name, Candidate("alice", 0, "host-a", 11), 60)  # leads: not waiting
    store.announce(lease_name, Candidate("bob", 3, "host-b", 22), 60)
    store.announce(lease_name, Candidate("carol", 7, "host-c", 33), 60)
    page = admin_client.get(change_url(lease_name)).content.decode()
    rows = section(page, "leader-candidates").split('<tr class="leader-candidate">')[1:]
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    assert [(c[0], c[2], c[3], c[4]) for c in cells] == [
        ("1", "3", "host-b", "22"),
        ("2", "7", "host-c", "33"),
    ]
    assert "bob" in cells[0][1] and "carol" in cells[1][1]
    # Last seen by the store's clock: announced a moment ago.
    assert all(re.fullmatch(r"\d+\.\d s ago", c[5]) for c in cells), cells
    assert 'class="leader-time"' in cells[0][6]  # joined
    # Nobody waiting: said so.
    other = f"{lease_name}-alone"
    store.acquire(other, "dave", 60)
    page = admin_client.get(change_url(other)).content.decode()
    assert "No candidate is waiting." in section(page, "leader-candidates")


def test_hand_over_from_the_lease_page_is_recorded_with_the_user(
    client: Client, make_staff: Any, store: Any, lease_name: str
) -> None:
    """The page offers the candidates, the next in line chosen; the hand-over needs the
    release permission and a POST with the CSRF token, and the holder's next renewal
    names the candidate chosen."""
    lease, _ = store.acquire(lease_name, "alice", 60)
    for identity in ("bob", "carol"):
        store.announce(lease_name, Candidate(identity), 60)
    viewer = make_staff("viewer", "django_leader.view_lease")
    page = login(client, viewer).get(change_url(lease_name)).content.decode()
    assert "carol" in section(page, "leader-candidates")
    assert handover_url(lease_name) not in page
    assert client.post(handover_url(lease_name), {"to": "carol"}).status_code == 403

    operator = make_staff("operator", "django_leader.view_lease", "django_leader.release_lease")
    browser = login(Client(enforce_csrf_checks=True), operator)
    page = browser.get(change_url(lease_name)).content.decode()
    form = section(page, "leader-candidates")
    assert f'action="{handover_url(lease_name)}"' in form
    assert '<option value="bob" selected>1. bob (next in line)</option>' in form
    assert '<option value="carol">2. carol</option>' in form
    assert browser.post(handover_url(lease_name), {"to": "carol"}).status_code == 403  # no CSRF
    assert browser.get(handover_url(lease_name)).status_code == 405
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    response = browser.post(
        handover_url(lease_name),
        {"csrfmiddlewaretoken": token.group(1), "to": "carol", "reason": "deploy"},
        follow=True,
    )
    assert response.redirect_chain == [(change_url(lease_name), 302)]
    assert "hands over to carol at its next renewal" in response.content.decode()
    assert history(store, lease_name)[-1] == ("handover", "alice", "", lease.token, "operator")
    assert LeaseEvent.objects.get(name=lease_name, kind="handover").detail == "to carol: deploy"
    from django.contrib.admin.models import LogEntry

    logged = LogEntry.objects.get(object_id=lease_name)
    assert logged.user == operator and "Handed over to carol" in logged.change_message
    renewed = store.renew(lease, 60)
    assert renewed is not None and renewed.handover_to == "carol"
    assert store.acquire(lease_name, "bob", 60)[0] is None


def test_hand_over_action_on_the_list_goes_to_the_next_in_line(
    client: Client, make_staff: Any, store: Any
) -> None:
    waiting, alone, free = (f"test-{uuid.uuid4().hex[:12]}" for _ in range(3))
    held, _ = store.acquire(waiting, "alice", 60)
    store.announce(waiting, Candidate("bob"), 60)
    store.announce(waiting, Candidate("carol"), 60)
    store.acquire(alone, "dave", 60)
    released, _ = store.acquire(free, "erin", 60)
    store.release(released)
    login(client, make_staff("operator", "django_leader.view_lease", "django_leader.release_lease"))
    assert 'value="hand_over"' in client.get(reverse(LIST)).content.decode()

    response = client.post(reverse(LIST), action_post([waiting, alone, free], "hand_over"))
    html = client.get(response["Location"]).content.decode()
    assert "hands over to bob at its next renewal" in html
    assert f"Could not hand “{alone}” over: no candidate is waiting" in html
    assert f"“{free}” was not held: nothing to hand over." in html
    assert events_of(waiting)[-1] == ("handover", "alice", "operator")
    assert [kind for kind, *_ in events_of(alone)] == ["acquired"]
    renewed = store.renew(held, 60)
    assert renewed is not None and renewed.handover_to == "bob"


def test_history_changelist_filters_and_newest_first(admin_client: Client) -> None:
    now = datetime.now(dt_timezone.utc).replace(microsecond=0)
    rows = [
        ("alpha", "acquired", "host-1", 1, now - timedelta(minutes=30)),
        ("alpha", "released", "host-1", 1, now - timedelta(minutes=20)),
        ("beta", "acquired", "host-2", 7, now - timedelta(minutes=10)),
        ("alpha", "taken_over", "host-3", 2, now - timedelta(minutes=5)),
    ]
    for name, kind, holder, token, at in rows:
        LeaseEvent.objects.create(name=name, kind=kind, holder=holder, token=token, at=at)
    for name in ("alpha", "beta"):  # the "by lease" filter offers the names of the leases
        Lease.objects.create(name=name, acquired_at=now, renewed_at=now, expires_at=now)

    def shown(**params: str) -> list[str]:
        html = admin_client.get(reverse(EVENTS), params).content.decode()
        return re.findall(r'class="field-holder_id"><span class="leader-id" [^>]*>([^<]*)<', html)

    assert shown() == ["host-3", "host-2", "host-1", "host-1"]  # newest first
    assert shown(name="alpha") == ["host-3", "host-1", "host-1"]
    assert shown(kind="acquired") == ["host-2", "host-1"]
    assert shown(q="host-2") == ["host-2"]
    assert shown(name="beta", kind="released") == []
    filters = admin_client.get(reverse(EVENTS)).content.decode()
    assert 'href="?name=alpha"' in filters and 'href="?name=beta"' in filters


def test_date_hierarchy_matches_djangos(admin_client: Client) -> None:
    """The index-seek date drill-down lists the same dates as Django's own."""
    stamps = [
        datetime(2025, 12, 31, 23, 0, tzinfo=dt_timezone.utc),
        datetime(2026, 1, 3, 8, 0, tzinfo=dt_timezone.utc),
        datetime(2026, 1, 3, 9, 0, tzinfo=dt_timezone.utc),
        datetime(2026, 1, 17, 0, 0, tzinfo=dt_timezone.utc),
        datetime(2026, 3, 1, 12, 0, tzinfo=dt_timezone.utc),
    ]
    for n, at in enumerate(stamps):
        LeaseEvent.objects.create(name="dates", kind="acquired", holder="h", token=n, at=at)
    for params in (
        {},
        {"at__year": "2026"},
        {"at__year": "2026", "at__month": "1"},
        {"at__year": "2026", "at__month": "1", "at__day": "3"},
        {"name": "dates", "at__year": "2025"},
    ):
        response = admin_client.get(reverse(EVENTS), params)
        assert response.status_code == 200
        cl = response.context["cl"]
        theirs, ours = date_hierarchy(cl), dict(cl.hierarchy)
        if "field_name" not in theirs:  # Django before 6.1 labels it with nothing
            del ours["field_name"]
        assert ours == theirs, params
    months = admin_client.get(reverse(EVENTS), {"at__year": "2026"}).context["cl"].hierarchy
    assert [c["title"] for c in months["choices"]] == ["January 2026", "March 2026"]


def test_admin_passes_djangos_system_checks() -> None:
    errors = [m for m in checks.run_checks(tags=[checks.Tags.admin]) if m.is_serious()]
    assert errors == []


# -- the history at scale: query plans on PostgreSQL ----------------------------------------


def fill_history(alias: str, rows: int, names: int) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_leader_leaseevent "
            "(name, kind, holder, token, previous_holder, at, detail, actor) "
            "SELECT 'lease-' || (g %% %s), "
            "CASE WHEN g %% 2 = 0 THEN 'acquired' ELSE 'released' END, "
            "'host-' || (g %% 7), g, '', "
            "statement_timestamp() - g * interval '2 seconds', '', '' "
            "FROM generate_series(1, %s) AS g",
            [names, rows],
        )
        cursor.execute("VACUUM ANALYZE django_leader_leaseevent")


def plans(alias: str, queries: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(sql, plan nodes)`` of every captured query that reads the history table."""
    found = []
    with connections[alias].cursor() as cursor:
        for query in queries:
            sql = query["sql"]
            if "django_leader_leaseevent" not in sql or not sql.lstrip().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
            raw = cursor.fetchone()[0]
            plan = json.loads(raw) if isinstance(raw, str) else raw
            nodes: list[dict[str, Any]] = []
            stack = [plan[0]["Plan"]]
            while stack:
                node = stack.pop()
                nodes.append(node)
                stack.extend(node.get("Plans", []))
            found.append((sql, nodes))
    return found


def scans_of_history(nodes: list[dict[str, Any]]) -> set[str]:
    return {
        node["Node Type"]
        for node in nodes
        if node.get("Relation Name") == "django_leader_leaseevent" or "Index Name" in node
    }


@every_db
def test_history_of_one_lease_uses_an_index_on_postgresql(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("postgresql")
    fill_history("postgresql", rows=60_000, names=30)
    monkeypatch.setattr(leader_admin.HistoryPaginator, "estimate_above", 10_000)
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "DATABASE": "postgresql"}):
        with CaptureQueriesContext(connections["postgresql"]) as one_lease:
            response = admin_client.get(reverse(EVENTS), {"name": "lease-7"})
        assert response.status_code == 200
        assert response.context["cl"].result_count == 2000
        with CaptureQueriesContext(connections["postgresql"]) as everything:
            response = admin_client.get(reverse(EVENTS))
        assert response.status_code == 200

    explained = plans("postgresql", one_lease.captured_queries)
    listing = [(sql, nodes) for sql, nodes in explained if "LIMIT" in sql and "name" in sql]
    assert listing, "the changelist query of one lease was not captured"
    for sql, nodes in explained:
        scans = scans_of_history(nodes)
        assert "Seq Scan" not in scans, f"sequential scan of the history for: {sql}"
    for _sql, nodes in listing:
        # The index hands the rows over in the changelist's order: no sort at all.
        assert any(node.get("Index Name") == "django_lead_name_at_id_idx" for node in nodes)
        assert not [node for node in nodes if "Sort" in node["Node Type"]], nodes

    # The unfiltered list neither counts every row nor scans the table.
    for sql, nodes in plans("postgresql", everything.captured_queries):
        assert not (re.search(r"COUNT\(\*\)", sql) and "WHERE" not in sql), sql
        assert "Seq Scan" not in scans_of_history(nodes), f"sequential scan for: {sql}"


# -- the timeline, as a function --------------------------------------------------------------

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=dt_timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_holding_periods_from_history() -> None:
    changes = [
        periods.Change("acquired", "alice", 1, at(0)),
        periods.Change("released", "alice", 1, at(10)),
        periods.Change("acquired", "bob", 2, at(15)),
        periods.Change("taken_over", "carol", 3, at(30)),  # bob's lease had expired
        periods.Change("lost", "bob", 2, at(31)),  # bob noticed late: changes nothing
        periods.Change("forced_release", "carol", 3, at(40)),
        periods.Change("acquired", "dave", 4, at(45)),
    ]
    current = periods.Current("dave", 4, at(61))
    terms = periods.holding_periods(changes, now=at(60), current=current)
    assert [(p.holder, p.start, p.end, p.ended_by) for p in terms] == [
        ("alice", at(0), at(10), "released"),
        ("bob", at(15), at(30), "taken_over"),
        ("carol", at(30), at(40), "forced_release"),
        ("dave", at(45), None, ""),
    ]
    gaps = periods.gaps(terms, at(-5), at(60))
    assert gaps == [(at(-5), at(0)), (at(10), at(15)), (at(40), at(45))]


def test_unreleased_lease_ends_at_its_known_expiry() -> None:
    changes = [periods.Change("acquired", "alice", 5, at(0))]
    expired = periods.Current("alice", 5, at(20))  # the database row keeps expires_at
    (period,) = periods.holding_periods(changes, now=at(60), current=expired)
    assert (period.end, period.ended_by, period.uncertain) == (at(20), "expired", False)
    assert periods.gaps([period], at(0), at(60)) == [(at(20), at(60))]


def test_unreleased_lease_with_unknown_expiry_is_uncertain() -> None:
    changes = [periods.Change("acquired", "alice", 5, at(0))]
    forgotten = periods.Current("", None, None)  # Redis forgot the expired lease
    (period,) = periods.holding_periods(
        changes, now=at(60), current=forgotten, min_term=timedelta(seconds=15)
    )
    assert period.uncertain and period.end == at(0.25)
    assert periods.gaps([period], at(0), at(60)) == []  # unknown is not "no leader"
    svg = drawing.render_svg([period], start=at(-10), now=at(60))
    assert 'class="uncertain"' in svg


def test_svg_escapes_names_and_marks_the_current_holder() -> None:
    evil = '<script>alert("x")</script>'
    terms = [
        periods.Period(evil, 1, at(0), at(20), "released"),
        periods.Period("bob", 2, at(30), None),
    ]
    svg = drawing.render_svg(
        terms, start=at(0), now=at(60), current_holder="bob", title=f"Who held {evil}"
    )
    assert "<script" not in svg and "&lt;script&gt;" in svg
    assert "bob (leads now)" in svg and 'class="holder current"' in svg
    assert svg.count('class="gap"') == 1  # 20-30 min
    # bob's bar starts at half the plot width.
    bar = re.search(r'data-holder="bob".*?<rect x="([\d.]+)"', svg)
    plot = re.search(r'data-plot-x="([\d.]+)"', svg)
    assert bar is not None and plot is not None
    plot_x = float(plot.group(1))
    middle = plot_x + (drawing.WIDTH - plot_x - drawing.RIGHT_PAD) / 2
    assert abs(float(bar.group(1)) - middle) < 0.2


def test_format_duration() -> None:
    assert periods.format_duration(4.25) == "4.2 s"
    assert periods.format_duration(59) == "59 s"
    assert periods.format_duration(299.9) == "4 min 59 s"
    assert periods.format_duration(600) == "10 min"
    assert periods.format_duration(3 * 3600 + 300) == "3 h 5 min"
    assert periods.format_duration(50 * 3600) == "2 d 2 h"
