"""The admin in a real browser: Playwright (the Python package) driving Debian's chromium
against a live server, at 1280 and 1920 px wide.

What a newcomer sees: force release keeps the timeline's range; the dashboard lists every
lease with its alerts and fits the screen; each timeline range draws the lease's history
with "no history" before its first event, a legend, and holder labels that fit; the
history's token, actor and detail columns stay on the screen with a long holder id.

Skipped, with the reason, when the ``playwright`` package or ``/usr/bin/chromium`` is
missing — unless ``DJANGO_LEADER_REQUIRE_SERVICES=1`` (CI), which makes that a failure.
``DJANGO_LEADER_SCREENSHOTS=<directory>`` also saves the pages as PNG there
(``docs/screenshots/`` holds the ones the documentation shows).

No Django ORM call happens while the browser runs: Playwright's synchronous API keeps an
event loop in this thread, where Django refuses synchronous database access.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.contrib.auth.models import Permission

from django_leader.admin import constants
from django_leader.election import Candidate
from django_leader.models import LeaseEvent
from tests.support.stores import REQUIRE_SERVICES, history
from tests.support.waiting import wait_until

CHROMIUM = os.environ.get("DJANGO_LEADER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = os.environ.get("DJANGO_LEADER_SCREENSHOTS", "")
PASSWORD = "correct horse battery staple"
LEASE = "report-builder"
#: The current holder of LEASE: a long id, as Kubernetes pods and Celery workers have.
LONG_HOLDER = "celery@report-worker-7f9c8d6b5-x2x9q.prod.eu-west-1.example.internal:48213"
WAIT_MS = 10_000
WIDTHS = [1280, 1920]

pytestmark = pytest.mark.django_db(transaction=True)


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package 'playwright' not installed (pip install -e '.[dev]')"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} not found (Debian: apt-get install chromium)"
    return None


@pytest.fixture
def browser_available() -> None:
    reason = _missing()
    if reason is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"browser test cannot run: {reason}")
    pytest.skip(f"browser test skipped: {reason}")


@pytest.fixture
def operator(django_user_model: Any, settings: Any) -> Any:
    """A staff user who may view leases and history and force-release; the live server
    serves the admin's CSS (STATIC_URL from STATIC_ROOT)."""
    settings.STATIC_ROOT = str(Path(django.contrib.admin.__file__).resolve().parent / "static")
    user = django_user_model.objects.create_user("operator", password=PASSWORD, is_staff=True)
    for codename in ("view_lease", "view_leaseevent", "release_lease"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_leader", codename=codename)
        )
    return user


def backdate(name: str, **minutes_ago: float) -> None:
    """Move the newest event of ``name`` of each kind to that many minutes ago."""
    for kind, minutes in minutes_ago.items():
        event = LeaseEvent.objects.filter(name=name, kind=kind).order_by("-at", "-id").first()
        assert event is not None, (name, kind)
        event.at = datetime.now(dt_timezone.utc) - timedelta(minutes=minutes)
        event.save(update_fields=["at"])


def seed(store: Any) -> None:
    """Leases in every situation the dashboard tells apart, and a day of history for
    ``LEASE`` (with gaps), held now by ``LONG_HOLDER`` with two candidates waiting."""
    now = datetime.now(dt_timezone.utc)
    past = [
        ("acquired", "worker-a:4711", 1, 20 * 60, "", ""),
        ("released", "worker-a:4711", 1, 14 * 60, "", ""),
        ("acquired", "worker-b:5123", 2, 14 * 60 - 1, "", ""),
        ("taken_over", "worker-c:6001", 3, 9 * 60, "", "lease of worker-b:5123 had expired"),
        ("forced_release", "worker-c:6001", 3, 6 * 60, "ops-alice", "stuck in a GC pause"),
        ("acquired", "worker-a:4711", 4, 5 * 60 + 50, "", ""),
        ("released", "worker-a:4711", 4, 2 * 60, "", "deploy"),
        # then nobody for over an hour, until LONG_HOLDER (token 5) 45 minutes ago
    ]
    for kind, holder, token, minutes_ago, actor, detail in past:
        LeaseEvent.objects.create(
            name=LEASE,
            kind=kind,
            holder=holder,
            token=token,
            at=now - timedelta(minutes=minutes_ago),
            actor=actor,
            detail=detail,
            previous_holder="worker-b:5123" if kind == "taken_over" else "",
        )
    store.acquire(LEASE, LONG_HOLDER, 300)
    for standby in ("worker-a:4711", "worker-c:6001"):  # followers campaigning for it
        store.announce(LEASE, Candidate(standby), 300)
    # Move the current term's start back 45 minutes, so the picture shows it as a bar.
    LeaseEvent.objects.filter(name=LEASE, token=5).update(at=now - timedelta(minutes=45))

    store.acquire("nightly-import", "beat-1:812", 300)
    # Force-released five minutes ago: nobody leads since.
    store.acquire("billing-sync", "worker-d:733", 300)
    store.force_release("billing-sync", actor="ops-alice", detail="wedged")
    # Released by its holder, nobody waiting: idle, no alert.
    lease, _ = store.acquire("cleanup", "worker-a:4711", 60)
    store.release(lease)
    # Released three minutes ago while two candidates wait: no leader.
    lease, _ = store.acquire("payments-reconciler", "worker-e:902", 60)
    store.release(lease)
    for standby in ("worker-f:311", "worker-g:312"):
        store.announce("payments-reconciler", Candidate(standby), 300)
    # Expired unreleased: its holder crashed, nobody took over.
    store.acquire("cache-warmer", "web-3:901", 0.2)
    # Flapping: eight holders in the last ten minutes.
    for n in range(8):
        lease, _ = store.acquire("session-sweeper", f"web-{n % 3}:70{n}", 60)
        if n < 7:
            store.release(lease)
    wait_until(lambda: store.read("cache-warmer") is None, timeout=10, message="no expiry")
    store.flush_history(10)
    backdate("billing-sync", acquired=35, forced_release=5)
    backdate("payments-reconciler", acquired=50, released=3)
    backdate("cleanup", acquired=90, released=80)
    backdate("cache-warmer", acquired=2)


def shoot(page: Any, name: str, width: int, full_page: bool = True, part: Any = None) -> None:
    """Save the page (or ``part`` of it, a locator) as ``<name>.png``, ``<name>-1920.png``
    at 1920 px, when DJANGO_LEADER_SCREENSHOTS names a directory."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        suffix = "" if width == WIDTHS[0] else f"-{width}"
        path = str(Path(SCREENSHOTS) / f"{name}{suffix}.png")
        if part is not None:
            part.screenshot(path=path)
        else:
            page.screenshot(path=path, full_page=full_page)


@contextmanager
def logged_in(live_server: Any, width: int, next_url: str) -> Iterator[Any]:
    """A page of a fresh chromium, ``width`` px wide, logged in as the operator at
    ``next_url``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{live_server.url}/admin/login/?next={next_url}")
            page.fill("#id_username", "operator")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(f"**{next_url}")
            yield page
        finally:
            browser.close()


def box(locator: Any) -> dict[str, float]:
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not rendered"
    return dict(found)


def assert_on_screen(page: Any, locator: Any, what: str) -> None:
    """``locator``'s box lies within the viewport's width (no horizontal scrolling)."""
    width = page.viewport_size["width"]
    shape = box(locator)
    assert shape["x"] >= 0 and shape["x"] + shape["width"] <= width, (what, shape, width)


def assert_no_horizontal_scroll(page: Any) -> None:
    scroll, client = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert scroll <= client, f"the page scrolls sideways: {scroll} > {client}"


def assert_no_cell_cut(page: Any, table: str) -> None:
    """No cell of ``table`` hides part of its content (a long id is cut on purpose inside
    its own ``.leader-id`` box, with the whole id as its tooltip, so its cell is not)."""
    cut = page.evaluate(
        """(table) => Array.from(document.querySelectorAll(table + ' td'))
            .filter(td => td.scrollWidth > td.clientWidth + 1)
            .map(td => td.className + ': ' + td.textContent.trim())""",
        table,
    )
    assert cut == [], f"cells of {table} cut short: {cut}"


def assert_labels_fit(timeline: Any) -> None:
    """Every lane label and legend item lies inside the picture, and each label ends
    before the plot starts: nothing is clipped."""
    picture = box(timeline)
    scale = picture["width"] / float(timeline.get_attribute("data-width"))
    plot_left = picture["x"] + float(timeline.get_attribute("data-plot-x")) * scale
    labels = timeline.locator("text.holder, text.lane-label")
    assert labels.count() >= 2
    for i in range(labels.count()):
        label = box(labels.nth(i))
        assert label["x"] >= picture["x"] - 0.5, (labels.nth(i).text_content(), label, picture)
        assert label["x"] + label["width"] <= plot_left + 0.5, (labels.nth(i).text_content(),)
    items = timeline.locator("g.legend-item")
    for i in range(items.count()):
        item = box(items.nth(i))
        assert item["x"] >= picture["x"] - 0.5, items.nth(i).text_content()
        assert item["x"] + item["width"] <= picture["x"] + picture["width"] + 0.5
        assert item["y"] + item["height"] <= picture["y"] + picture["height"] + 0.5


def test_operator_force_releases_a_lease_in_the_browser(
    browser_available: None, live_server: Any, operator: Any, store: Any
) -> None:
    from playwright.sync_api import expect

    seed(store)
    width = WIDTHS[0]
    with logged_in(live_server, width, "/admin/django_leader/lease/") as page:
        row = page.locator("#result_list tbody tr", has_text=LEASE)
        expect(row.locator(".leader-id")).to_have_attribute("title", LONG_HOLDER)
        expect(row.locator(".leader-state")).to_have_text("leading")
        expect(
            page.locator("#result_list tbody tr", has_text="cache-warmer").locator(".leader-state")
        ).to_have_text("expired")
        # Times to the second, with the zone; the store's clock named above the list.
        expect(row.locator("time.leader-time")).to_have_text(
            re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
        )
        expect(page.locator(".leader-clock")).to_contain_text("shown in UTC")
        assert_no_horizontal_scroll(page)
        assert_no_cell_cut(page, "#result_list")
        shoot(page, "lease-list", width, full_page=False)

        # Open the lease: the timeline shows who leads now, over its whole history.
        row.locator("a", has_text=LEASE).click()
        expect(page.locator(".field-candidates_waiting")).to_contain_text(
            "worker-a:4711, worker-c:6001"
        )
        expect(page.locator("a.leader-election-history")).to_have_text("Election history")
        expect(page.locator("a.historylink")).to_have_text("Admin log")
        timeline = page.locator("svg.leader-timeline")
        expect(timeline).to_be_visible()
        expect(page.locator(".leader-timeline-ranges strong")).to_have_text("whole history")
        current = timeline.locator("text.holder.current")
        expect(current).to_contain_text("(leads now)")
        expect(current.locator("title")).to_have_text(LONG_HOLDER)
        assert timeline.locator("g.period").count() >= 5
        assert timeline.locator("g.gap").count() >= 1
        assert_labels_fit(timeline)
        shoot(page, "lease-detail", width)

        # Choose the last week, then force release: the page comes back on the last week.
        page.click(".leader-timeline-ranges a[data-range=week]")
        page.wait_for_url("**?timeline=week")
        page.fill("#id_reason", "browser test: hand over")
        page.click("#leader-release input[type=submit]")
        expect(page.locator(".messagelist")).to_contain_text("Force-released")
        assert page.url.endswith("?timeline=week"), page.url
        expect(page.locator(".leader-timeline-ranges strong")).to_have_text("last week")
        new_row = page.locator("#leader-history tr.leader-event-forced_release").first
        expect(new_row).to_contain_text("operator")
        expect(new_row).to_contain_text("browser test: hand over")
        expect(page.locator("#leader-release")).to_have_count(0)

        # The full history of the lease.
        page.click("#leader-history h2 a")
        page.wait_for_url("**/admin/django_leader/leaseevent/?name=*")
        first = page.locator("#result_list tbody tr").first
        expect(first).to_contain_text("force-released")
        expect(first).to_contain_text("operator")
        shoot(page, "history", width)

    assert store.read(LEASE) is None
    kind, holder, _previous, _token, actor = history(store, LEASE)[-1]
    assert (kind, holder, actor) == ("forced_release", LONG_HOLDER, "operator")


@pytest.mark.parametrize("width", WIDTHS)
def test_dashboard_lists_every_lease_with_its_alerts(
    browser_available: None, live_server: Any, operator: Any, store: Any, width: int
) -> None:
    from playwright.sync_api import expect

    seed(store)
    with logged_in(live_server, width, "/admin/") as page:
        # From the admin's index (issue 28: it did not list the dashboard) to the dashboard.
        page.click("#content-main a[href$='/django_leader/leasedashboard/']")
        page.wait_for_url("**/admin/django_leader/lease/dashboard/")
        table = page.locator("#leader-dashboard")
        expect(table).to_be_visible()

        def row(name: str) -> Any:
            return table.locator(f"tr[data-lease='{name}']")

        names = (
            LEASE,
            "nightly-import",
            "billing-sync",
            "cleanup",
            "payments-reconciler",
            "cache-warmer",
            "session-sweeper",
        )
        for name in names:
            expect(row(name)).to_have_count(1)
        expect(row(LEASE).locator(".leader-holder .leader-id")).to_have_attribute(
            "title", LONG_HOLDER
        )
        expect(row(LEASE).locator(".leader-waiting")).to_contain_text("2:")
        expect(row(LEASE).locator(".leader-left")).to_contain_text(" s")
        expect(row(LEASE).locator(".leader-alerts")).to_have_text("none")

        def alerts(name: str) -> list[str]:
            found = row(name).locator("[data-alert]")
            return sorted(found.nth(i).get_attribute("data-alert") for i in range(found.count()))

        assert alerts("billing-sync") == ["no-leader"]
        expect(row("billing-sync").locator(".leader-last")).to_contain_text("by ops-alice")
        assert alerts("payments-reconciler") == ["no-leader"]
        expect(row("payments-reconciler").locator(".leader-alerts")).to_contain_text(
            "2 candidates waiting"
        )
        assert alerts("cache-warmer") == ["no-leader"]
        expect(row("cache-warmer").locator(".leader-alerts")).to_contain_text("expired unreleased")
        assert alerts("session-sweeper") == ["flapping"]
        assert alerts("cleanup") == [] and alerts("nightly-import") == []
        # Alerts first.
        first_rows = [
            table.locator("tbody tr").nth(i).get_attribute("data-lease") for i in range(4)
        ]
        assert set(first_rows) == {
            "billing-sync",
            "cache-warmer",
            "payments-reconciler",
            "session-sweeper",
        }
        expect(page.locator("#leader-summary")).to_contain_text("4 with alerts")
        expect(page.locator(".leader-clock")).to_contain_text("UTC")

        # Every column on the screen, also with a long holder id.
        assert_no_horizontal_scroll(page)
        headers = table.locator("thead th")
        assert headers.count() == 7
        for i in range(headers.count()):
            assert_on_screen(page, headers.nth(i), headers.nth(i).text_content())
        assert_no_cell_cut(page, "#leader-dashboard")
        shoot(page, "dashboard", width)

        # The lease list links to the dashboard too.
        page.click(".breadcrumbs a:has-text('Leases')")
        page.click("a.leader-dashboard-link")
        page.wait_for_url("**/admin/django_leader/lease/dashboard/")


@pytest.mark.parametrize("width", WIDTHS)
def test_each_timeline_range_fits_and_explains_itself(
    browser_available: None, live_server: Any, operator: Any, store: Any, width: int
) -> None:
    from playwright.sync_api import expect

    seed(store)
    first = LeaseEvent.objects.filter(name=LEASE).order_by("at").values_list("at", flat=True)[0]
    with logged_in(live_server, width, f"/admin/django_leader/lease/{LEASE}/change/") as page:
        timeline = page.locator("svg.leader-timeline")
        for key, (label, length) in constants.RANGES.items():
            if key != constants.DEFAULT_RANGE:
                page.click(f".leader-timeline-ranges a[data-range='{key}']")
                page.wait_for_url(f"**?timeline={key}")
            expect(page.locator(".leader-timeline-ranges strong")).to_have_text(label)
            start = datetime.fromisoformat(timeline.get_attribute("data-start"))
            now = datetime.fromisoformat(timeline.get_attribute("data-now"))
            if length is None:
                # Fitted to the history: it begins shortly before the first event.
                assert start < first and first - start < (now - first) * 0.1, (start, first)
            else:
                assert abs((now - start) - length) < timedelta(seconds=1), key
            # Before the first event: "no history", never "no leader".
            no_history = timeline.locator("g.no-history")
            expect(no_history).to_have_count(1 if start < first else 0)
            if start < first:
                gaps = timeline.locator("g.gap title")
                for i in range(gaps.count()):
                    text = gaps.nth(i).text_content()
                    assert not text.startswith(f"no leader: {start:%Y-%m-%d %H:%M:%S}"), text
            legend = timeline.locator("g.legend-item")
            keys = [legend.nth(i).get_attribute("data-key") for i in range(legend.count())]
            assert {"term", "gap", "no-history", "uncertain"} <= set(keys), keys
            expect(timeline.locator("text.holder.current title")).to_have_text(LONG_HOLDER)
            assert_labels_fit(timeline)
            assert_no_horizontal_scroll(page)
            if key in ("10min", "week") and width == WIDTHS[0]:
                shoot(page, f"timeline-{key}", width, part=page.locator("#leader-timeline"))


@pytest.mark.parametrize("width", WIDTHS)
def test_history_columns_stay_on_screen_with_a_long_holder_id(
    browser_available: None, live_server: Any, operator: Any, store: Any, width: int
) -> None:
    from playwright.sync_api import expect

    seed(store)
    store.force_release(LEASE, actor="ops-alice", detail="moving the reports to the new nodes")
    store.flush_history(10)
    with logged_in(live_server, width, "/admin/django_leader/leaseevent/") as page:
        # Every lease's history, then one lease's (without the lease column).
        for query in ("", f"?name={LEASE}"):
            page.goto(f"{live_server.url}/admin/django_leader/leaseevent/{query}")
            first = page.locator("#result_list tbody tr").first
            holder = first.locator(".field-holder_id .leader-id")
            expect(holder).to_have_attribute("title", LONG_HOLDER)
            time_cell = first.locator("time.leader-time")
            expect(time_cell).to_have_text(re.compile(r"\d\d:\d\d:\d\d UTC$"))
            for column in ("token", "actor_name", "short_detail"):
                assert_on_screen(page, page.locator(f"#result_list th.column-{column}"), column)
                assert_on_screen(page, first.locator(f"td.field-{column}"), column)
            results = page.locator("#changelist-form .results")
            scroll, client = results.evaluate("el => [el.scrollWidth, el.clientWidth]")
            assert scroll <= client, f"the history scrolls sideways: {scroll} > {client}"
            assert_no_horizontal_scroll(page)
            assert_no_cell_cut(page, "#result_list")
        expect(page.locator("#result_list th.column-lease")).to_have_count(0)

        # The recent history on the lease's page keeps its columns on the screen too.
        page.goto(f"{live_server.url}/admin/django_leader/lease/{LEASE}/change/")
        recent = page.locator("#leader-history table")
        assert_on_screen(page, recent, "recent history")
        assert_on_screen(page, recent.locator("th").last, "detail")
        assert_no_cell_cut(page, "#leader-history table")


@pytest.mark.parametrize("width", WIDTHS)
def test_dotted_names_and_default_holders_fit_the_lease_list(
    browser_available: None, live_server: Any, operator: Any, store: Any, width: int
) -> None:
    """Issue 28, item 5: a dotted lease name (a singleton task's) ran over the holder's
    column, and a default identity was cut to ``vm:250…`` at 1280 px with space to spare."""
    leases = {
        "singleton:billing.tasks.send_invoice": "vm:25003:1745615c",
        "celery-beat:proj.celery": "vm:25011:9a8b7c6d",
    }
    for name, holder in leases.items():
        assert store.acquire(name, holder, 300)[0] is not None
    with logged_in(live_server, width, "/admin/django_leader/lease/") as page:
        assert_no_cell_cut(page, "#result_list")
        overflowing = page.evaluate(
            """() => Array.from(document.querySelectorAll('#result_list tbody th'))
                .filter(th => th.scrollWidth > th.clientWidth + 1).map(th => th.textContent)"""
        )
        assert overflowing == [], f"names run over the next column: {overflowing}"
        cut = page.evaluate(
            """() => Array.from(document.querySelectorAll('#result_list .leader-id'))
                .filter(id => id.scrollHeight > id.clientHeight + 1
                              || id.scrollWidth > id.clientWidth + 1)
                .map(id => id.textContent)"""
        )
        assert cut == [], f"ids cut short: {cut}"
        shoot(page, "lease-list-dotted", width)
