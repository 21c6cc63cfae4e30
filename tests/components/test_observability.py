"""Health views, Prometheus metrics and the testing helpers (issue 7)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.test import Client, RequestFactory

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
    assert body["holder"] == "alice" and body["token"] == lease.token
    backend.release(lease)
    assert get().status_code == 503
    assert views.has_leader(factory.post(url), lease_name).status_code == 405


def test_has_leader_503_when_store_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_leader import views
    from django_leader.exceptions import BackendUnavailable

    class Down(NoWrites):
        def read(self, name: str) -> Any:
            raise BackendUnavailable("down")

    monkeypatch.setattr(views, "get_backend", lambda: Down(MemoryBackend()))
    response = Client().get("/leader/health/x/")
    assert response.status_code == 503 and response.json()["error"] == "down"


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


def test_metrics_show_is_leader_flip(leader_backend: MemoryBackend) -> None:
    pytest.importorskip("prometheus_client")

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
