"""``manage.py runleader NAME --tasks`` whose wall clock steps while it leads: a real
process under libfaketime (its wall clock only: ``FAKETIME_DONT_FAKE_MONOTONIC``, as an
NTP step leaves the monotonic and boot clocks alone), leases and slot records in
PostgreSQL, whose clock does not move. The same in one process, on every store, with
time-machine: tests/components/test_django_tasks.py.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from django_leader.backends.db import DatabaseBackend
from tests.processes.test_django_tasks import TIMING, WAIT, Fleet
from tests.support.stores import child_env, require
from tests.support.waiting import wait_until

pytest.importorskip("django_tasks_db", reason="django-tasks-db is not installed")

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(
        transaction=True,
        databases="__all__",
        available_apps=["django_leader", "testproject.demoapp", "django_tasks_db"],
    ),
]


@pytest.mark.skipif(
    not LIBFAKETIME.exists(), reason=f"libfaketime is not installed ({LIBFAKETIME})"
)
def test_a_leader_whose_wall_clock_steps_keeps_the_schedule(tmp_path: Path) -> None:
    """The leader's wall clock steps an hour ahead, then an hour behind, then back, while
    it enqueues a 1.5 s schedule: no slot is enqueued before PostgreSQL's clock reached it
    (a step ahead used to enqueue one an hour early), none twice, and the schedule goes on
    through every step (a step behind used to stall it for an hour) (issue 24, defect 4)."""
    from django_tasks_db.models import DBTaskResult

    require("postgresql")
    store = DatabaseBackend("postgresql")
    every = 1.5
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    tick = "testproject.demoapp.jobs.tick"
    schedule = {"tick": {"task": tick, "every": every, "slot_kwarg": "slot"}}
    env = child_env(
        store,
        DJANGO_LEADER_TASKS_SCHEDULE=json.dumps(schedule),
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_NO_CACHE="1",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        **TIMING,
    )
    fleet = Fleet(tmp_path, env)
    lease = f"tasks-clock-{os.getpid()}-{time.monotonic_ns()}"

    def slots() -> list[datetime]:
        return [
            datetime.fromisoformat(row.args_kwargs["kwargs"]["slot"])
            for row in DBTaskResult.objects.filter(task_path=tick)
        ]

    try:
        fleet.start("enqueuer", "runleader", lease, "--tasks")
        wait_until(lambda: len(slots()) >= 2, timeout=WAIT, message=fleet.output)
        for step in ("+3600", "-3600", "+0"):  # ahead, behind (two hours back), right
            offset.write_text(f"{step}\n")
            time.sleep(3 * every)
    finally:
        fleet.stop()
    store_now = store.slots().now()
    store.close()

    enqueued = slots()
    twice = [slot for slot, n in collections.Counter(enqueued).items() if n > 1]
    assert not twice, f"slots enqueued twice: {twice}\n{fleet.output()}"
    ordered = sorted(enqueued)
    early = [slot for slot in ordered if slot > store_now]
    assert not early, f"slots enqueued before the store reached them: {early}, {store_now}"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ordered)]
    # Every slot, but for one a loaded machine may hold the process up past: never a pause.
    assert max(gaps) <= 2 * every, f"the schedule paused: gaps {gaps}\n{fleet.output()}"
    assert len(ordered) >= 8, (ordered, fleet.output())
    assert (store_now - ordered[-1]).total_seconds() < 3 * every + 10, (ordered, store_now)
