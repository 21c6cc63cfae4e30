"""django_leader.tasks in one process, against the test run's database: the schedule's
validation, the slot grid, one term of the enqueuer and its successor on the shared slot
records, ``singleton_task``'s ``on_locked`` choices, and ``runleader --tasks``' checks.

Between real processes (enqueuers, db_workers, SIGKILL): tests/processes/test_django_tasks.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_leader import LeadershipLost, LeaseHeld, lock
from django_leader.backends.db import DatabaseBackend
from django_leader.conf import get_settings
from django_leader.tasks import Entry, load_schedule
from django_leader.tasks.schedule import Enqueuer

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
        ({"t": {"task": TICK}}, r"\['t'\]\['every'\] must be a number of seconds > 0"),
        ({"t": {"task": TICK, "every": 0}}, r"\['every'\] must be a number of seconds > 0"),
        ({"t": {"task": TICK, "every": True}}, r"\['every'\] must be a number"),
        ({"t": {"task": TICK, "every": 1, "cron": "* * * * *"}}, r"unknown key\(s\) cron"),
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
    with pytest.raises(ImproperlyConfigured, match=r"TASKS_SCHEDULE'\]\['t'\]\['every'\]"):
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


# -- singleton_task -------------------------------------------------------------------------------
def test_singleton_runs_with_its_lease_and_releases_it(
    store: DatabaseBackend, task_log: Path
) -> None:
    from testproject.demoapp import jobs

    assert jobs.report.call(5, 0) == "report 5"
    (start, end) = logged(task_log)
    assert start["ev"] == "start" and start["token"] is not None  # current_lease() was set
    assert end["ev"] == "end"
    assert store.read("report-5") is None  # released


def held(store: DatabaseBackend, name: str) -> None:
    """Hold ``name`` as another holder (a lock() of this thread would be re-entered)."""
    assert store.acquire(name, "another-worker", 30)[0] is not None


def test_singleton_skips_while_the_key_is_held(store: DatabaseBackend, task_log: Path) -> None:
    from testproject.demoapp import jobs

    held(store, "report-6")
    assert jobs.report.call(6, 0) is None
    assert jobs.report.call(7, 0) == "report 7"  # another key runs
    assert [r["key"] for r in logged(task_log)] == ["report-7", "report-7"]


def test_async_singleton_skips_while_the_key_is_held(
    store: DatabaseBackend, task_log: Path
) -> None:
    from testproject.demoapp import jobs

    held(store, "areport-6")
    assert jobs.areport.call(6, 0) is None
    assert jobs.areport.call(5, 0) == "areport 5"
    assert [r["ev"] for r in logged(task_log)] == ["start", "end"]


def test_singleton_on_locked_raise(store: DatabaseBackend) -> None:
    from testproject.demoapp import jobs

    held(store, "testproject.demoapp.jobs.exclusive")
    with pytest.raises(LeaseHeld, match="another-worker"):
        jobs.exclusive.call()


def test_singleton_on_locked_retry_enqueues_it_again_later(
    store: DatabaseBackend, task_log: Path
) -> None:
    from django_tasks_db.models import DBTaskResult

    from testproject.demoapp import jobs

    held(store, "retried-3")
    before = datetime.now(timezone.utc)
    assert jobs.retried.call(3, 0) is None
    (row,) = DBTaskResult.objects.filter(task_path="testproject.demoapp.jobs.retried")
    assert row.args_kwargs == {"args": [3, 0], "kwargs": {}}
    # retry_delay=0.2 plus at most half of it in jitter
    assert before + timedelta(seconds=0.2) <= row.run_after <= before + timedelta(seconds=5)
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
