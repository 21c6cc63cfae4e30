"""The admin in a real browser: Playwright (the Python package) driving Debian's chromium
against a live server.

Skipped, with the reason, when the ``playwright`` package or ``/usr/bin/chromium`` is
missing — unless ``DJANGO_LEADER_REQUIRE_SERVICES=1`` (CI), which makes that a failure.
``DJANGO_LEADER_SCREENSHOTS=<directory>`` also saves the three pages as PNG there
(``docs/screenshots/`` holds the ones the documentation shows).

No Django ORM call happens while the browser runs: Playwright's synchronous API keeps an
event loop in this thread, where Django refuses synchronous database access.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.contrib.auth.models import Permission

from django_leader.backends import get_backend
from django_leader.models import LeaseEvent
from tests.support.stores import REQUIRE_SERVICES, history

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
WAIT_MS = 10_000


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
def store() -> Iterator[Any]:
    backend = get_backend()
    yield backend
    backend.flush_history(10)
    backend.close()


def seed(store: Any) -> None:
    """A day of history for ``LEASE`` (with a gap), worker-b leading now, and other leases."""
    now = datetime.now(dt_timezone.utc)
    past = [
        ("acquired", "worker-a:4711", 1, 20 * 60, "", ""),
        ("released", "worker-a:4711", 1, 14 * 60, "", ""),
        ("acquired", "worker-b:5123", 2, 14 * 60 - 1, "", ""),
        ("taken_over", "worker-c:6001", 3, 9 * 60, "", "lease of worker-b:5123 had expired"),
        ("forced_release", "worker-c:6001", 3, 6 * 60, "ops-alice", "stuck in a GC pause"),
        ("acquired", "worker-a:4711", 4, 5 * 60 + 50, "", ""),
        ("released", "worker-a:4711", 4, 2 * 60, "", "deploy"),
        # then nobody for over an hour, until worker-b (token 5) 45 minutes ago
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
    store.acquire(LEASE, "worker-b:5123", 300)
    for standby in ("worker-a:4711", "worker-c:6001"):  # followers campaigning for it
        store.announce(LEASE, standby, 300)
    # Move the current term's start back 45 minutes, so the picture shows it as a bar.
    LeaseEvent.objects.filter(name=LEASE, token=5).update(at=now - timedelta(minutes=45))
    store.acquire("nightly-import", "beat-1:812", 300)
    store.acquire("billing-sync", "worker-d:733", 300)
    store.force_release("billing-sync", actor="ops-alice", detail="wedged")
    lease, _ = store.acquire("cleanup", "worker-a:4711", 60)
    store.release(lease)
    store.acquire("cache-warmer", "web-3:901", 0.2)
    give_up = time.monotonic() + 10
    while store.read("cache-warmer") is not None:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    store.flush_history(10)


def shoot(page: Any, name: str, full_page: bool = True) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=full_page)


@pytest.mark.django_db(transaction=True)
def test_operator_force_releases_a_lease_in_the_browser(
    browser_available: None, live_server: Any, django_user_model: Any, store: Any, settings: Any
) -> None:
    from playwright.sync_api import expect, sync_playwright

    # The live server serves STATIC_URL from STATIC_ROOT: point it at the admin's CSS.
    settings.STATIC_ROOT = str(Path(django.contrib.admin.__file__).resolve().parent / "static")

    user = django_user_model.objects.create_user("operator", password=PASSWORD, is_staff=True)
    for codename in ("view_lease", "view_leaseevent", "release_lease"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_leader", codename=codename)
        )
    seed(store)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(WAIT_MS)

            # Log in; land on the lease list.
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_leader/lease/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/django_leader/lease/")
            if SCREENSHOTS:
                page.click("#toggle-nav-sidebar")  # room for the columns; remembered
            row = page.locator("#result_list tbody tr", has_text=LEASE)
            expect(row).to_contain_text("worker-b:5123")
            expect(row.locator(".leader-state")).to_have_text("leading")
            expect(
                page.locator("#result_list tbody tr", has_text="cache-warmer").locator(
                    ".leader-state"
                )
            ).to_have_text("expired")
            shoot(page, "lease-list", full_page=False)

            # Open the lease: the timeline shows who leads now.
            row.locator("a", has_text=LEASE).click()
            expect(page.locator(".field-candidates_waiting")).to_contain_text(
                "worker-a:4711, worker-c:6001"
            )
            timeline = page.locator("svg.leader-timeline")
            expect(timeline).to_be_visible()
            expect(timeline.locator("text.holder.current")).to_contain_text("worker-b:5123")
            assert timeline.locator("g.period").count() >= 5
            assert timeline.locator("g.gap").count() >= 1
            shoot(page, "lease-detail")

            # Force release it, with a reason; the new history row names the operator.
            page.fill("#id_reason", "browser test: hand over")
            page.click("#leader-release input[type=submit]")
            expect(page.locator(".messagelist")).to_contain_text("Force-released")
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
            shoot(page, "history")
        finally:
            browser.close()

    assert store.read(LEASE) is None
    kind, holder, _previous, _token, actor = history(store, LEASE)[-1]
    assert (kind, holder, actor) == ("forced_release", "worker-b:5123", "operator")
