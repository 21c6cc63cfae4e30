"""lock(): acquisition, refusal, timeouts, reentrancy, background renewal, loss."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from django_leader import LeadershipLost, LeaseHeld, lock
from tests.conftest import history, stores_db
from tests.faults import FaultyBackend

pytestmark = stores_db
WAIT = 10.0


def test_lock_holds_and_releases(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend) as lease:
        assert lease.held and lease.holder and lease.token >= 1
        assert backend.read(lease_name).token == lease.token
    assert not lease.held
    assert backend.read(lease_name) is None
    assert [event[0] for event in history(backend, lease_name)] == ["acquired", "released"]


def test_non_blocking_lock_of_held_lease_raises(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "someone-else", 30)
    with (
        pytest.raises(LeaseHeld, match="someone-else"),
        lock(lease_name, backend=backend, blocking=False),
    ):
        pytest.fail("entered a lock held elsewhere")


def test_blocking_lock_times_out(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "someone-else", 30)
    started = time.monotonic()
    with pytest.raises(LeaseHeld), lock(lease_name, backend=backend, timeout=0.5):
        pytest.fail("entered a lock held elsewhere")
    assert 0.5 <= time.monotonic() - started < WAIT


def test_blocking_lock_waits_for_release(backend: Any, lease_name: str) -> None:
    other, _ = backend.acquire(lease_name, "someone-else", 30)
    threading.Timer(0.3, _release_in_thread, args=(backend, other)).start()
    with lock(lease_name, backend=backend, timeout=WAIT) as lease:
        assert lease.token == other.token + 1


def _release_in_thread(backend: Any, lease: Any) -> None:
    try:
        backend.release(lease)
    finally:
        backend.close()


def test_lock_excludes_other_threads(backend: Any, lease_name: str) -> None:
    inside = threading.Event()
    leave = threading.Event()
    outcome: list[Any] = []

    def holder() -> None:
        with lock(lease_name, ttl=30, backend=backend):
            inside.set()
            leave.wait(WAIT)
        backend.close()

    def contender() -> None:
        try:
            with lock(lease_name, backend=backend, blocking=False):
                outcome.append("entered")
        except LeaseHeld:
            outcome.append("refused")
        finally:
            backend.close()

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(WAIT)
    c = threading.Thread(target=contender)
    c.start()
    c.join()
    leave.set()
    t.join()
    assert outcome == ["refused"]


def test_reentrant_within_a_thread(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend) as outer:
        with lock(lease_name, backend=backend, blocking=False) as inner:
            assert inner is outer
        # The inner exit did not release.
        assert backend.read(lease_name).token == outer.token
        assert outer.held
    assert backend.read(lease_name) is None


def test_renews_in_background(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=2.0, backend=backend) as lease:
        first_expiry = lease.expires_at
        time.sleep(4.0)  # twice the TTL: only renewals keep it
        assert lease.held
        assert lease.expires_at > first_expiry
        assert backend.read(lease_name).token == lease.token


def test_lost_lock_is_visible_in_block(backend: Any, lease_name: str) -> None:
    faulty = FaultyBackend(backend)
    with lock(lease_name, ttl=1.0, backend=faulty) as lease:
        faulty.hang_renew.set()
        assert lease.lost.wait(WAIT)
        with pytest.raises(LeadershipLost):
            lease.check()
        faulty.unblock.set()
    assert not lease.held


def test_lock_released_when_block_raises(backend: Any, lease_name: str) -> None:
    with pytest.raises(ZeroDivisionError), lock(lease_name, ttl=30, backend=backend):
        1 / 0  # noqa: B018
    assert backend.read(lease_name) is None


def test_one_lock_object_used_by_several_threads(backend: Any, lease_name: str) -> None:
    """Each thread's hold is its own: one thread's exit never stops another's renewals
    nor closes its connection."""
    shared = lock(lease_name, ttl=1.0, timeout=30, backend=backend)
    tokens: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with shared as lease:
                tokens.append(lease.token)
                time.sleep(1.5)  # past the TTL: only this thread's renewer keeps it
                lease.check()
                assert backend.read(lease_name).token == lease.token
        except BaseException as exc:
            errors.append(exc)
        finally:
            backend.close()  # this thread's own store connection, as with Django's

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(tokens) == 2 and tokens == sorted(set(tokens))  # one after the other
    assert backend.read(lease_name) is None
