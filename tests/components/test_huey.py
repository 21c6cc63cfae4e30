"""``django_leader.huey.run_while_leader`` against every real store, in one process: the
schedulers of two consumers (two candidates, two ``Huey`` objects on one storage) of which
only the leader's enqueues periodic tasks, each slot once, across a hand-over; the errors a
user can make. Across processes, with ``manage.py run_huey``: tests/processes/test_huey.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytest.importorskip("huey", reason="huey is not installed")

from huey import MemoryHuey

from django_leader.huey import _slot, run_while_leader
from tests.support.stores import stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db
TIMING: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.6, "retry_interval": 0.2}
WAIT = 15.0
T0 = dt.datetime(2026, 11, 28, 12, 0, 0)  # naive UTC, as huey's timestamps are


def consumer_huey(name: str, storage: Any = None) -> MemoryHuey:
    """A ``Huey`` as one consumer process has it: its periodic task ``tick`` due every
    other second; ``storage`` shared with the other consumers."""
    huey = MemoryHuey(name, utc=True)
    if storage is not None:
        huey.storage = storage

    @huey.periodic_task(lambda timestamp: timestamp.second % 2 == 0, name="tick")
    def tick() -> None:
        pass

    return huey


def scheduler_of(huey: MemoryHuey) -> Any:
    """The scheduler ``huey``'s consumer runs, initialized (campaigning) as in its thread."""
    scheduler = huey.create_consumer(workers=1)._create_scheduler()
    scheduler.initialize()
    return scheduler


def enqueued(huey: MemoryHuey) -> list[tuple[str, dt.datetime]]:
    return [(task.name, task.eta) for task in huey.pending()]


def test_only_the_leader_enqueues_periodic_tasks_each_slot_once(
    backend: Any, lease_name: str
) -> None:
    a = consumer_huey(lease_name)
    b = consumer_huey(lease_name, storage=a.storage)
    run_while_leader(a, lease_name, interval=1, identity="a", backend=backend, **TIMING)
    run_while_leader(b, lease_name, interval=1, identity="b", backend=backend, **TIMING)
    schedulers = {"a": scheduler_of(a), "b": scheduler_of(b)}
    try:
        leader = wait_until(
            lambda: next((k for k, s in schedulers.items() if s._gate.leads), None),
            timeout=WAIT,
            message="no consumer was elected",
        )
        follower = "b" if leader == "a" else "a"
        # Each check of a slot, by both consumers, twice: one task per slot due.
        for second in range(4):
            for label in (leader, follower, leader, follower):
                schedulers[label].enqueue_periodic_tasks(T0 + dt.timedelta(seconds=second))
        slots = [T0, T0 + dt.timedelta(seconds=2)]
        assert enqueued(a) == [("tick", at) for at in slots]
        # The leader's consumer stops: the lease is released, the other one leads...
        schedulers[leader].shutdown()
        wait_until(lambda: schedulers[follower]._gate.leads, timeout=WAIT, message="no takeover")
        # ... and skips the slot its predecessor enqueued, not the next.
        for second in (2, 3, 4):
            schedulers[follower].enqueue_periodic_tasks(T0 + dt.timedelta(seconds=second))
        assert enqueued(a) == [("tick", at) for at in [*slots, T0 + dt.timedelta(seconds=4)]]
    finally:
        for scheduler in schedulers.values():
            scheduler.shutdown()


def test_checks_of_a_consumer_that_does_not_lead_enqueue_nothing(
    backend: Any, lease_name: str, caplog: Any
) -> None:
    from django_leader import lock

    huey = consumer_huey(lease_name)
    run_while_leader(huey, lease_name, interval=1, backend=backend, **TIMING)
    with lock(lease_name, backend=backend, identity="someone-else", ttl=30):
        scheduler = scheduler_of(huey)
        try:
            with caplog.at_level("INFO", logger="django_leader"):
                for second in range(4):
                    scheduler.enqueue_periodic_tasks(T0 + dt.timedelta(seconds=second))
        finally:
            scheduler.shutdown()
    assert enqueued(huey) == []
    checks = [r for r in caplog.records if r.name == "django_leader.huey"]
    assert [r for r in checks if r.levelname != "DEBUG"] == []  # no line per check


def test_slots_are_checks_rounded_down_to_the_interval() -> None:
    utc = dt.timezone.utc
    at = dt.datetime(2026, 11, 28, 12, 34, 56, 789)  # huey with utc=True: naive UTC
    assert _slot(at, 60, utc=True) == dt.datetime(2026, 11, 28, 12, 34, tzinfo=utc)
    assert _slot(at, 1, utc=True) == dt.datetime(2026, 11, 28, 12, 34, 56, tzinfo=utc)
    assert _slot(at, 300, utc=True) == dt.datetime(2026, 11, 28, 12, 30, tzinfo=utc)
    # huey with utc=False: naive local times; the slot is the same instant.
    local = at.replace(tzinfo=utc).astimezone().replace(tzinfo=None)
    assert _slot(local, 1, utc=False) == dt.datetime(2026, 11, 28, 12, 34, 56, tzinfo=utc)


def test_bad_input_is_refused_at_the_call() -> None:
    huey = consumer_huey("bad-input")
    with pytest.raises(TypeError, match=r"huey\.Huey"):
        run_while_leader(object())
    with pytest.raises(ValueError, match="interval"):
        run_while_leader(huey, interval=0)
    with pytest.raises(ValueError):
        run_while_leader(huey, ttl=-1)
    run_while_leader(huey, ttl=30)
    with pytest.raises(RuntimeError, match="already"):
        run_while_leader(huey)


def test_the_default_name_is_the_hueys() -> None:
    huey = consumer_huey("reports")
    run_while_leader(huey)
    assert huey._django_leader.name == "huey:reports"
