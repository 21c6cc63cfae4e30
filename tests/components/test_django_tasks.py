"""django_leader.tasks in one process, against the test run's database: the schedule's
validation, the slot grid, one term of the enqueuer and its successor on the shared slot
records, the leader's wall clock stepped an hour either way while it leads (time-machine,
in this process: the stores' clocks do not move), a failing enqueue tried again,
``singleton_task``'s ``on_locked`` choices, and ``runleader --tasks``' checks.

Between real processes (enqueuers, db_workers, SIGKILL): tests/processes/test_django_tasks.py.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from django_leader import Elector, LeadershipLost, Lease, LeaseHeld, lock
from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from django_leader.conf import get_settings
from django_leader.lease import clock
from django_leader.tasks import Entry, load_schedule, run_schedule
from django_leader.tasks.schedule import RETRY_AFTER, Enqueuer
from tests.support.electing import WAIT, start
from tests.support.stores import open_store
from tests.support.waiting import wait_until

pytest.importorskip("django_tasks_db", reason="django-tasks-db is not installed")

pytestmark = pytest.mark.django_db(
    transaction=True,
    databases="__all__",
    available_apps=["django_leader", "testproject.demoapp", "django_tasks_db"],
)

TICK = "testproject.demoapp.jobs.tick"


@pytest.fixture
def store() -> Iterator[DatabaseBackend]:
    backend = DatabaseBackend("default")
    yield backend
    backend.close()


@pytest.fixture
def task_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tasks.jsonl"
    monkeypatch.setenv("DJANGO_LEADER_TASKS_LOG", str(path))
    return path


def logged(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the schedule ---------------------------------------------------------------------------------
def test_load_schedule_reads_entries() -> None:
    (entry,) = load_schedule(
        {"t": {"task": TICK, "every": timedelta(minutes=2), "args": [1], "kwargs": {"a": 2}}}
    )
    assert entry == Entry("t", TICK, 120.0, (1,), {"a": 2}, None)
    assert entry.resolve().module_path == TICK


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"t": {"every": 1}}, r"\['t'\]\['task'\] must be the dotted path"),
        ({"t": {"task": TICK}}, r"\['t'\] needs 'every' \(seconds\) or 'cron'"),
        ({"t": {"task": TICK, "every": 0}}, r"\['every'\] must be a number of seconds > 0"),
        ({"t": {"task": TICK, "every": True}}, r"\['every'\] must be a number"),
        ({"t": {"task": TICK, "every": 1, "hour": 3}}, r"unknown key\(s\) hour"),
        ({"t": {"task": TICK, "every": 1, "args": "x"}}, r"\['args'\] must be a list"),
        ({"t": {"task": TICK, "every": 1, "kwargs": {"d": object()}}}, "JSON-serializable"),
        ({"t": {"task": TICK, "every": 1, "slot_kwarg": ""}}, r"\['slot_kwarg'\] must be"),
        ({"t": 5}, r"\['t'\] must be a dict"),
        (["t"], "must be a dict of entry name"),
    ],
)
def test_load_schedule_names_the_key_and_the_rule(spec: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        load_schedule(spec)


def test_a_bad_schedule_in_settings_is_refused_at_startup(settings: Any) -> None:
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "TASKS_SCHEDULE": {"t": {"task": TICK}}}
    with pytest.raises(ImproperlyConfigured, match=r"TASKS_SCHEDULE'\]\['t'\] needs 'every'"):
        get_settings()


def test_an_entry_that_names_no_task_is_refused() -> None:
    (entry,) = load_schedule({"t": {"task": "testproject.demoapp.jobs.record", "every": 1}})
    with pytest.raises(ImproperlyConfigured, match="is not a task"):
        entry.resolve()
    (entry,) = load_schedule({"t": {"task": "testproject.demoapp.jobs.nothing", "every": 1}})
    with pytest.raises(ImproperlyConfigured, match="cannot import"):
        entry.resolve()


def test_slots_are_the_same_datetimes_every_time() -> None:
    entry = Entry("t", TICK, 0.3)
    now = datetime(2026, 11, 23, 12, 0, 0, 450_000, tzinfo=timezone.utc)
    due = entry.due(now)
    assert due <= now < due + timedelta(seconds=0.3)
    assert entry.due(due) == due  # a slot is its own slot: never enqueued "again"
    assert entry.due(due + timedelta(microseconds=299_999)) == due
    assert entry.due(due + timedelta(seconds=0.3)) == due + timedelta(seconds=0.3)


# -- the enqueuer ---------------------------------------------------------------------------------
def test_a_successor_continues_after_the_last_recorded_slot(
    store: DatabaseBackend, lease_name: str
) -> None:
    from django_tasks_db.models import DBTaskResult

    entries = load_schedule({"t": {"task": TICK, "every": 3600, "slot_kwarg": "slot"}})
    with lock(lease_name, identity="first", backend=store) as first:
        enqueuer = Enqueuer(first, entries, store.slots())
        enqueuer.start()
        enqueuer.step()
        enqueuer.step()  # the same slot: nothing more
        assert DBTaskResult.objects.filter(task_path=TICK).count() == 1

    with lock(lease_name, identity="second", backend=store) as second:
        assert second.token > first.token
        successor = Enqueuer(second, entries, store.slots())
        successor.start()
        successor.step()  # within the same hour: the records say it was sent
    assert DBTaskResult.objects.filter(task_path=TICK).count() == 1
    (row,) = DBTaskResult.objects.filter(task_path=TICK)
    assert row.args_kwargs["kwargs"]["slot"] == entries[0].due(store.slots().now()).isoformat()


def test_a_deposed_leader_cannot_record_a_slot(store: DatabaseBackend, lease_name: str) -> None:
    from django_tasks_db.models import DBTaskResult

    entries = load_schedule({"t": {"task": TICK, "every": 3600}})
    with lock(lease_name, identity="first", backend=store) as first:
        enqueuer = Enqueuer(first, entries, store.slots())
        enqueuer.start()
        store.force_release(lease_name)  # an operator freed it; first does not know yet
        with pytest.raises(LeadershipLost):
            enqueuer.step()
    assert not DBTaskResult.objects.filter(task_path=TICK).exists()


# -- the leader's clock, and failures of the task backend ----------------------------------------
@pytest.fixture(params=["sqlite", "postgresql", "redis", "zookeeper"])
def slot_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A backend of each kind of slot records (database, Redis, ZooKeeper)."""
    yield from open_store(request.param)


class Recorder:
    """Stands for an entry's task (``Entry.resolve``): enqueues the real one, and records
    each enqueue's slot with the store's time read just before it (what a slot enqueued
    early would show); the first ``fail`` enqueues raise, as a task backend that is down."""

    def __init__(self, store: Backend, fail: int = 0) -> None:
        from testproject.demoapp import jobs

        self.task = jobs.tick
        self.slots = store.slots()
        self.fail = fail
        self.tries: list[float] = []  # clock() of each enqueue
        self.enqueued: list[tuple[datetime, datetime]] = []  # (slot, the store's time)
        self.steps: list[float] = []  # clock() of each Enqueuer.step()

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        self.tries.append(clock())
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the task backend is down")
        store_now = self.slots.now()
        result = self.task.enqueue(*args, **kwargs)
        self.enqueued.append((datetime.fromisoformat(kwargs["slot"]), store_now))
        return result


def lead_schedule(
    store: Backend,
    name: str,
    every: float,
    recorder: Recorder,
    electors: list[Elector],
    monkeypatch: pytest.MonkeyPatch,
) -> Elector:
    """An Elector whose work is :func:`run_schedule` of one entry, whose task is
    ``recorder`` (and whose steps it records)."""
    entries = load_schedule({"t": {"task": TICK, "every": every, "slot_kwarg": "slot"}})
    monkeypatch.setattr(Entry, "resolve", lambda entry: recorder)
    step = Enqueuer.step

    def recorded_step(enqueuer: Enqueuer) -> float:
        recorder.steps.append(clock())
        return step(enqueuer)

    monkeypatch.setattr(Enqueuer, "step", recorded_step)

    def work(lease: Lease) -> None:
        try:
            run_schedule(lease, schedule=entries, backend=store)
        finally:
            connections.close_all()  # this work thread's (a test database is dropped)

    return start(electors, Elector(name, backend=store), work)


@pytest.mark.parametrize("jump", [3600, -3600], ids=["ahead-1h", "behind-1h"])
def test_a_step_of_the_leaders_wall_clock_changes_nothing_in_the_schedule(
    slot_backend: Backend,
    lease_name: str,
    electors: list[Elector],
    monkeypatch: pytest.MonkeyPatch,
    jump: int,
) -> None:
    """The leader's wall clock steps an hour ahead (or behind) while it leads, then back:
    every slot is enqueued once, in order, none before the store's clock reached it, none
    skipped, and the schedule never stalls (issue 24, defect 4: the slots followed the
    leader's wall clock, so a step ahead enqueued a slot an hour early and then nothing for
    an hour; a step behind enqueued nothing for an hour)."""
    time_machine = pytest.importorskip("time_machine")
    every = 1.5  # > the 1 s a leader waits at most between two looks: every slot is seen
    recorder = Recorder(slot_backend)
    elector = lead_schedule(slot_backend, lease_name, every, recorder, electors, monkeypatch)
    wait_until(lambda: recorder.enqueued, timeout=WAIT, message="the schedule never started")
    # Stepped for two slots and more, then stepped back for two more (time.sleep and the
    # leader's waits run on the monotonic clock, which time-machine does not move).
    with time_machine.travel(datetime.now(timezone.utc) + timedelta(seconds=jump), tick=True):
        time.sleep(2 * every + 0.5)
    time.sleep(2 * every + 0.5)
    elector.stop(timeout=WAIT)
    store_end = slot_backend.slots().now()

    slots = [slot for slot, _ in recorder.enqueued]
    early = [(slot, now) for slot, now in recorder.enqueued if slot > now]
    assert not early, f"slots enqueued before the store's clock reached them: {early}"
    assert slots == sorted(set(slots)), f"a slot enqueued twice or out of order: {slots}"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(slots)]
    looks = [b - a for a, b in itertools.pairwise(recorder.steps)]
    if max(looks) <= every:  # (a loop held up for a whole slot by the load may skip one)
        assert all(gap == every for gap in gaps), f"slots skipped: gaps {gaps} s in {slots}"
    assert len(slots) >= 5, f"the schedule stalled: {slots}"
    entry = Entry("t", TICK, every)
    assert slots[-1] >= entry.due(store_end) - timedelta(seconds=every), (slots, store_end)


@pytest.mark.parametrize("slot_backend", ["sqlite", "postgresql"], indirect=True)
def test_a_failed_enqueue_is_tried_again_after_retry_after_and_enqueued_once(
    slot_backend: Backend,
    lease_name: str,
    electors: list[Elector],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task backend fails twice: the recorded slot is tried again RETRY_AFTER seconds
    after each failure, enqueued once, and marked sent (issue 24, defect 4: it was
    dropped)."""
    from django_tasks_db.models import DBTaskResult

    every = 3600.0
    store_clock = slot_backend.slots()
    entry = Entry("t", TICK, every)
    # Not within a minute of the next slot: the slot that fails is the one enqueued.
    wait_until(
        lambda: store_clock.now() - entry.due(store_clock.now()) < timedelta(seconds=every - 60),
        timeout=70,
        interval=1,
    )
    recorder = Recorder(slot_backend, fail=2)
    elector = lead_schedule(slot_backend, lease_name, every, recorder, electors, monkeypatch)
    wait_until(lambda: recorder.enqueued, timeout=WAIT + 3 * RETRY_AFTER, message="not enqueued")
    steps = len(recorder.steps)
    wait_until(lambda: len(recorder.steps) >= steps + 2, timeout=WAIT)  # and it looked again
    lease = elector.lease
    assert lease is not None
    record = slot_backend.slots().load(lease)[entry.key]
    elector.stop(timeout=WAIT)

    assert len(recorder.tries) == 3, recorder.tries
    first, second, third = recorder.tries
    assert second - first >= RETRY_AFTER and third - second >= RETRY_AFTER, recorder.tries
    ((slot, _),) = recorder.enqueued
    assert record.at == slot and record.sent, record
    enqueued = DBTaskResult.objects.filter(task_path=TICK)
    assert [row.args_kwargs["kwargs"]["slot"] for row in enqueued] == [slot.isoformat()]


# -- singleton_task -------------------------------------------------------------------------------
def test_singleton_runs_with_its_lease_and_releases_it(
    store: DatabaseBackend, task_log: Path
) -> None:
    from testproject.demoapp import jobs

    assert jobs.report.call(5, 0) == "report 5"
    (start, end) = logged(task_log)
    assert start["ev"] == "start" and start["token"] is not None  # current_lease() was set
    assert end["ev"] == "end"
    assert store.read("singleton:report-5") is None  # released


def held(store: DatabaseBackend, name: str) -> None:
    """Hold ``name`` as another holder (a lock() of this thread would be re-entered)."""
    assert store.acquire(name, "another-worker", 30)[0] is not None


def test_singleton_skips_while_the_key_is_held(store: DatabaseBackend, task_log: Path) -> None:
    from testproject.demoapp import jobs

    held(store, "singleton:report-6")
    assert jobs.report.call(6, 0) is None
    assert jobs.report.call(7, 0) == "report 7"  # another key runs
    assert [r["key"] for r in logged(task_log)] == ["report-7", "report-7"]


def test_async_singleton_skips_while_the_key_is_held(
    store: DatabaseBackend, task_log: Path
) -> None:
    from testproject.demoapp import jobs

    held(store, "singleton:areport-6")
    assert jobs.areport.call(6, 0) is None
    assert jobs.areport.call(5, 0) == "areport 5"
    assert [r["ev"] for r in logged(task_log)] == ["start", "end"]


def test_singleton_on_locked_raise(store: DatabaseBackend) -> None:
    from testproject.demoapp import jobs

    held(store, "singleton:testproject.demoapp.jobs.exclusive")
    with pytest.raises(LeaseHeld, match="another-worker"):
        jobs.exclusive.call()


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "local-times"])
def test_singleton_on_locked_retry_enqueues_it_again_later(
    store: DatabaseBackend, task_log: Path, settings: Any, use_tz: bool
) -> None:
    """With ``USE_TZ = False`` (and a TIME_ZONE other than UTC), ``run_after`` is Django's
    naive local time: an aware one made the database task backend raise ``ValueError``."""
    from django.utils.timezone import make_aware
    from django_tasks_db.models import DBTaskResult

    from testproject.demoapp import jobs

    if not use_tz:
        settings.USE_TZ, settings.TIME_ZONE = False, "Asia/Kathmandu"
    held(store, "singleton:retried-3")
    before = datetime.now(timezone.utc)
    assert jobs.retried.call(3, 0) is None
    (row,) = DBTaskResult.objects.filter(task_path="testproject.demoapp.jobs.retried")
    assert row.args_kwargs == {"args": [3, 0], "kwargs": {}}
    run_after = row.run_after if use_tz else make_aware(row.run_after)
    # retry_delay=0.2 plus at most half of it in jitter
    assert before + timedelta(seconds=0.2) <= run_after <= before + timedelta(seconds=5)
    assert logged(task_log) == []


def test_singleton_checks_its_key_when_declared() -> None:
    from django_leader.tasks import singleton_task

    def job(customer: int) -> None: ...

    with pytest.raises(ValueError, match="names 'client', which is not an argument"):
        singleton_task(key="r-{client}")(job)
    with pytest.raises(ValueError, match="on_locked must be one of"):
        singleton_task(on_locked="wait")(job)
    with pytest.raises(ValueError, match="retry_delay must be"):
        singleton_task(retry_delay=-1)(job)


# -- runleader --tasks ----------------------------------------------------------------------------
def test_runleader_tasks_needs_a_schedule() -> None:
    with pytest.raises(CommandError, match="TASKS_SCHEDULE'\\] has no entry"):
        call_command("runleader", "x", "--tasks")


def test_runleader_tasks_checks_each_task_before_campaigning() -> None:
    bad = {"t": {"task": "testproject.demoapp.jobs.record", "every": 1}}
    with (
        override_settings(DJANGO_LEADER={"TASKS_SCHEDULE": bad}),
        pytest.raises(CommandError, match="is not a task"),
    ):
        call_command("runleader", "x", "--tasks")


def test_runleader_takes_one_payload() -> None:
    with pytest.raises(CommandError, match=r"give exactly one payload.*--tasks"):
        call_command("runleader", "x", "--tasks", "--call", "os.getpid")
    assert os.getpid()  # (the command never ran it)
