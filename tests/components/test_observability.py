"""Health views, Prometheus metrics and the testing helpers (issue 7)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, RequestFactory, override_settings

from django_leader import Elector, LeaseHeld, lock
from django_leader.backends.base import Backend
from django_leader.testing import MemoryBackend, leader_backend, override_leader
from tests.support.stores import stores_db
from tests.support.waiting import wait_until

FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "retry_interval": 0.1}
WAIT = 10.0

__all__ = ["leader_backend"]  # the fixture, imported for use below


class NoWrites(Backend):
    """Wraps a real store and fails the test on anything but a read."""

    def __init__(self, real: Backend) -> None:
        self.real = real

    def read(self, name: str) -> Any:
        return self.real.read(name)

    def _write(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the health view wrote to the store")

    acquire = renew = release = force_release = names = _write


@stores_db
def test_has_leader_200_then_503_and_only_reads(
    backend: Any, lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_leader import views

    monkeypatch.setattr(views, "get_backend", lambda: NoWrites(backend))
    url = f"/leader/health/{lease_name}/"
    factory = RequestFactory()

    def get() -> Any:
        return views.has_leader(factory.get(url), lease_name)

    assert get().status_code == 503
    lease, _ = backend.acquire(lease_name, "alice", 30)
    response = get()
    assert response.status_code == 200
    body = json.loads(response.content)
    # Anyone: whether there is a leader, not who it is (HEALTH_DETAILS is empty).
    assert body == {"name": lease_name, "has_leader": True}
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "HEALTH_DETAILS": ["token"]}):
        assert json.loads(get().content) == {
            "name": lease_name,
            "token": lease.token,
            "has_leader": True,
        }
    # One who may view leases (the admin's permission): every field.
    viewer = factory.get(url)
    viewer.user = Viewer()
    body = json.loads(views.has_leader(viewer, lease_name).content)
    assert body["holder"] == "alice" and body["token"] == lease.token and body["expires_at"]
    backend.release(lease)
    assert get().status_code == 503
    assert views.has_leader(factory.post(url), lease_name).status_code == 405


class Viewer:
    """A signed-in user with the permission to view leases, and no other."""

    is_authenticated = True

    def has_perm(self, permission: str) -> bool:
        return permission == "django_leader.view_lease"


def test_has_leader_503_when_store_unreachable_names_no_server_to_strangers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's error (hosts, ports, roles) goes to the log; a caller who may not view
    leases is told the category only."""
    from django_leader import views
    from django_leader.exceptions import BackendUnavailable

    error = 'connection to server at "10.1.2.3", port 5432 failed: role "app" does not exist'

    class Down(NoWrites):
        def read(self, name: str) -> Any:
            raise BackendUnavailable(error)

    monkeypatch.setattr(views, "get_backend", lambda: Down(MemoryBackend()))
    response = Client().get("/leader/health/x/")
    assert response.status_code == 503
    assert response.json() == {"name": "x", "error": "store unavailable"}
    assert error in caplog.text
    viewer = RequestFactory().get("/leader/health/x/")
    viewer.user = Viewer()
    assert json.loads(views.has_leader(viewer, "x").content)["error"] == error


def test_health_details_setting_is_validated() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_leader import views
    from django_leader.conf import get_settings

    assert views.DETAILS == ("holder", "token", "expires_at")
    for bad in ("holder", ["holder", "password"], 3):
        bad_settings = {**settings.DJANGO_LEADER, "HEALTH_DETAILS": bad}
        with (
            override_settings(DJANGO_LEADER=bad_settings),
            pytest.raises(ImproperlyConfigured, match="HEALTH_DETAILS"),
        ):
            get_settings()


def test_metrics_label_at_most_metrics_names_names(
    leader_backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names made from data must not grow the exposition without bound: past
    METRICS_NAMES distinct names, the rest count as "(other)"."""
    pytest.importorskip("prometheus_client")
    from django_leader import metrics

    Client().get("/leader/metrics/")  # installs the metrics
    monkeypatch.setattr(metrics, "_labelled", set())
    names = [f"invoice-{i}" for i in range(5)]
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "METRICS_NAMES": 2}):
        for name in names:
            with lock(name):
                pass
        text = Client().get("/leader/metrics/").content.decode()
    transitions = [
        line for line in text.splitlines() if line.startswith("django_leader_transitions_total{")
    ]
    labelled = {line.split('"')[1] for line in transitions}
    assert {"invoice-0", "invoice-1", "(other)"} <= labelled, transitions
    assert not labelled & {"invoice-2", "invoice-3", "invoice-4"}, transitions
    assert any(
        line.startswith('django_leader_transitions_total{name="(other)"} 3.0')
        for line in transitions
    ), transitions


def test_leads_here_follows_the_local_elector(leader_backend: MemoryBackend) -> None:
    url = "/leader/health/web/here/"
    assert Client().get(url).status_code == 503
    elector = Elector("web", **FAST)
    elector.start()
    try:
        assert elector.wait_for_leadership(WAIT)
        response = Client().get(url)
        assert response.status_code == 200 and response.json()["leads_here"] is True
    finally:
        elector.stop()
    assert Client().get(url).status_code == 503
    assert Client().get("/leader/health/%20/here/").status_code == 400


def test_metrics_show_is_leader_flip(
    leader_backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("prometheus_client")
    from django_leader import metrics

    # The names this worker labelled so far (every lease of every test before) are not
    # this test's: "metered" must not come past METRICS_NAMES.
    monkeypatch.setattr(metrics, "_labelled", set())

    def is_leader(name: str) -> float | None:
        text = Client().get("/leader/metrics/").content.decode()
        for line in text.splitlines():
            if line.startswith(f'django_leader_is_leader{{name="{name}"}}'):
                return float(line.split()[-1])
        return None

    Client().get("/leader/metrics/")  # installs the metrics
    elector = Elector("metered", **FAST)
    elector.start()
    try:
        assert elector.wait_for_leadership(WAIT)
        # The gauge follows leader_elected, sent just after.
        wait_until(
            lambda: is_leader("metered") == 1.0,
            timeout=WAIT,
            message=lambda: f"django_leader_is_leader: {is_leader('metered')}",
        )
        renewed = threading.Event()
        from django_leader import hooks

        def seen(event: str, name: str, value: float) -> None:
            if event == "renew" and name == "metered":
                renewed.set()

        hooks.add_observer(seen)
        try:
            assert renewed.wait(WAIT)
        finally:
            hooks.remove_observer(seen)
        text = Client().get("/leader/metrics/").content.decode()
        assert 'django_leader_renew_seconds_count{name="metered"}' in text
    finally:
        elector.stop()
    assert is_leader("metered") == 0.0


def test_override_leader_makes_this_process_lead() -> None:
    with override_leader("report"):
        elector = Elector("report", **FAST)
        elector.start()
        try:
            assert elector.wait_for_leadership(WAIT)
        finally:
            elector.stop()
        with lock("report", blocking=False) as lease:
            assert lease.held


def test_override_leader_false_keeps_this_process_a_follower() -> None:
    @override_leader("report", leader=False)
    def run() -> None:
        elector = Elector("report", **FAST)
        elector.start()
        try:
            assert not elector.wait_for_leadership(0.5)
            assert elector.leader().holder == "another-instance"
        finally:
            elector.stop()
        with pytest.raises(LeaseHeld), lock("report", blocking=False):
            pytest.fail("locked a name another instance holds")

    run()


def test_memory_backend_keeps_the_lease_contract(leader_backend: MemoryBackend) -> None:
    first, _ = leader_backend.acquire("n", "a", 30)
    assert first is not None
    assert leader_backend.acquire("n", "b", 30)[0] is None
    assert leader_backend.renew(first, 30) is not None
    assert leader_backend.force_release("n") is not None
    assert leader_backend.renew(first, 30) is None
    assert leader_backend.acquire("n", "b", 30)[0] is None  # the term runs out first
    assert leader_backend.release(first) is False
    assert [e[0] for e in leader_backend.events] == ["acquired", "forced_release"]


#: Exposition bytes of one name that has been through every metric (two histograms of 12
#: buckets; about 2.7 KB measured with 13-character names), as docs/observability.md says.
PER_NAME = 2800


def test_metrics_exposition_stays_bounded_however_many_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand names through every metric: django-leader's part of the exposition
    stays under (METRICS_NAMES + 1) x PER_NAME bytes."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from django_leader import hooks, metrics, signals
    from django_leader.lease import Lease

    metrics.install()
    monkeypatch.setattr(metrics, "_labelled", set())

    def ours() -> int:
        text = generate_latest().decode()
        return sum(
            len(line) + 1 for line in text.splitlines() if "invoice-" in line or "(other)" in line
        )

    before = ours()
    limit = 10
    now = datetime.now(timezone.utc)
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, "METRICS_NAMES": limit}):
        for i in range(1000):
            lease = Lease(f"invoice-{i:05d}", "h", 1, now, now, now, 1)
            signals.leader_elected.send(sender=None, lease=lease)
            signals.leader_lost.send(sender=None, lease=lease)
            for event in ("renew", "renew_failed", "renew_refused", "leaderless"):
                hooks.notify(event, lease.name, 0.01)
    grown = ours() - before
    assert 0 < grown <= (limit + 1) * PER_NAME, grown
