"""``TASKS_SCHEDULE``'s cron entries and catch-up policies, one leader after another on the
shared slot records of real stores, over a frozen store clock: what a newly elected process
enqueues of the slots that fell due while no leader ran (``skip``, ``once``, ``all`` up to
``max_catch_up``), on an ``every`` grid and on a cron expression. A failover across a cron
slot between real processes: tests/processes/test_django_tasks.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_leader import lock
from django_leader.backends.base import Backend
from django_leader.tasks import Entry, load_schedule
from django_leader.tasks.schedule import Enqueuer
from tests.support.stores import open_store, stores_db

pytest.importorskip("croniter", reason="croniter is not installed")

pytestmark = stores_db
TICK = "testproject.demoapp.jobs.tick"
UTC = timezone.utc
T0 = datetime(2026, 11, 28, 12, 0, 30, tzinfo=UTC)


class FrozenClock:
    """The store's clock as an Enqueuer reads it, stopped at ``at``."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    def sync(self) -> datetime:
        return self.at


class Tasks:
    """Stands for the entries' task: the slots it was enqueued for."""

    def __init__(self) -> None:
        self.slots: list[datetime] = []

    def enqueue(self, *args: Any, slot: str, **kwargs: Any) -> Any:
        self.slots.append(datetime.fromisoformat(slot))
        return type("Result", (), {"id": f"r{len(self.slots)}"})()


@pytest.fixture(params=["sqlite", "redis", "zookeeper"])
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Slot records in a database, in Redis, in ZooKeeper."""
    yield from open_store(request.param)


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch) -> Tasks:
    recorded = Tasks()
    monkeypatch.setattr(Entry, "resolve", lambda entry: recorded)
    return recorded


def term(store: Backend, name: str, identity: str, spec: dict[str, Any], *at: datetime) -> None:
    """One leader's term: elected, it starts at ``at[0]`` and steps at each of ``at`` (the
    store's clock frozen there each time)."""
    entries = load_schedule({"t": {"task": TICK, "slot_kwarg": "slot", **spec}})
    with lock(name, identity=identity, backend=store) as lease:
        enqueuer = Enqueuer(lease, entries, store.slots())
        enqueuer.clock = FrozenClock(at[0])  # type: ignore[assignment]
        enqueuer.start()
        for now in at:
            enqueuer.clock = FrozenClock(now)  # type: ignore[assignment]
            enqueuer.step()


def minutes(*values: int) -> list[datetime]:
    return [datetime(2026, 11, 28, 12, m, tzinfo=UTC) for m in values]


@pytest.mark.parametrize(
    ("policy", "enqueued"),
    [
        # The latest missed slot, at once.
        ({"catch_up": "once"}, minutes(0, 3, 4)),
        # None that fell due before the term began: not even the first leader's 12:00.
        ({"catch_up": "skip"}, minutes(4)),
        # Each of them, oldest first; the latest two.
        ({"catch_up": "all"}, minutes(0, 1, 2, 3, 4)),
        ({"catch_up": "all", "max_catch_up": 2}, minutes(0, 2, 3, 4)),
        # "once" is the default.
        ({}, minutes(0, 3, 4)),
    ],
    ids=["once", "skip", "all", "all-max-2", "default"],
)
def test_slots_missed_while_no_leader_ran(
    store: Backend,
    lease_name: str,
    tasks: Tasks,
    policy: dict[str, Any],
    enqueued: list[datetime],
) -> None:
    spec = {"every": 60, **policy}
    term(store, lease_name, "first", spec, T0)  # starts at 12:00:30, then is gone
    # The next leader starts at 12:03:30 (12:01, 12:02 and 12:03 fell due meanwhile) and
    # steps at 12:04:10 too.
    later = T0 + timedelta(minutes=3)
    term(store, lease_name, "second", spec, later, later + timedelta(seconds=40))
    assert tasks.slots == enqueued


def test_cron_entries_enqueue_the_cron_times_and_catch_up_likewise(
    store: Backend, lease_name: str, tasks: Tasks, settings: Any
) -> None:
    settings.TIME_ZONE = "Europe/Paris"  # cron fields are read in TIME_ZONE: 13:05 there
    spec = {"cron": "5,20 13 * * *", "catch_up": "all"}
    first = datetime(2026, 11, 28, 12, 5, 10, tzinfo=UTC)
    term(store, lease_name, "first", spec, first, first + timedelta(minutes=1))  # 12:05 UTC
    # Gone from 12:06 to 12:25: 12:20 fell due meanwhile; the next one is tomorrow's 12:05.
    later = T0 + timedelta(minutes=25)
    term(store, lease_name, "second", spec, later, later + timedelta(hours=2))
    assert tasks.slots == minutes(5, 20)


def test_cron_slots_are_the_cron_times_in_the_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "America/New_York"
    (entry,) = load_schedule({"t": {"task": TICK, "cron": "0 9 * * 1-5"}})
    friday_evening = datetime(2026, 11, 27, 23, 0, tzinfo=UTC)
    assert entry.due(friday_evening) == datetime(2026, 11, 27, 14, 0, tzinfo=UTC)  # 9:00 EST
    assert entry.after(entry.due(friday_evening)) == datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
    assert entry.due(entry.due(friday_evening)) == entry.due(friday_evening)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"task": TICK}, "needs 'every' (seconds) or 'cron'"),
        ({"task": TICK, "every": 60, "cron": "* * * * *"}, "'every' or 'cron', not both"),
        ({"task": TICK, "cron": "61 * * * *"}, "cron expression of five fields"),
        ({"task": TICK, "cron": "* * * * * *"}, "cron expression of five fields"),
        ({"task": TICK, "every": 60, "catch_up": "later"}, "'skip', 'once', 'all'"),
        ({"task": TICK, "every": 60, "max_catch_up": 3}, "goes with 'catch_up': 'all'"),
        ({"task": TICK, "every": 60, "catch_up": "all", "max_catch_up": 0}, ">= 1"),
    ],
)
def test_bad_cron_and_catch_up_are_refused_naming_the_key(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_schedule({"t": spec})
