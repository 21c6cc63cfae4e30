"""``django_leader.apscheduler.run_while_leader`` against every real store, in one process:
two schedulers (two candidates) of which only the leader's runs jobs, each with the lease
as ``current_lease()``; a hand-over; an ``AsyncIOScheduler`` with coroutine jobs; the
errors a user can make. Across processes: tests/processes/test_apscheduler.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pytest
from django.db import OperationalError

pytest.importorskip("apscheduler", reason="APScheduler 3 is not installed")

from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_PAUSED, STATE_RUNNING

from django_leader import AsyncElector, Elector, current_lease
from django_leader.apscheduler import run_while_leader
from tests.support.stores import stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db
TIMING: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.6, "retry_interval": 0.2}
WAIT = 15.0
#: A whole second, so that the schedulers of the test share their scheduled times.
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Runs:
    """What the jobs saw: (scheduler label, scheduled time, current_lease()'s token)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, datetime, int | None]] = []
        self._lock = threading.Lock()

    def scheduler(self, label: str, scheduler: Any) -> Any:
        def ran(event: JobExecutionEvent) -> None:
            with self._lock:
                self.seen.append((label, event.scheduled_run_time, event.retval))

        scheduler.add_listener(ran, EVENT_JOB_EXECUTED)
        return scheduler

    def by(self, label: str) -> list[tuple[str, datetime, int | None]]:
        with self._lock:
            return [run for run in self.seen if run[0] == label]


def token_of_current_lease() -> int | None:
    lease = current_lease()
    return lease.token if lease is not None and lease.held else None


def background(runs: Runs, label: str) -> BackgroundScheduler:
    scheduler = runs.scheduler(label, BackgroundScheduler(timezone=timezone.utc))
    scheduler.add_job(token_of_current_lease, "interval", seconds=0.5, start_date=START, id="tick")
    return scheduler


def test_only_the_leaders_scheduler_runs_jobs(backend: Any, lease_name: str) -> None:
    runs = Runs()
    schedulers = {"a": background(runs, "a"), "b": background(runs, "b")}
    electors = {
        label: run_while_leader(scheduler, lease_name, identity=label, backend=backend, **TIMING)
        for label, scheduler in schedulers.items()
    }
    try:
        assert all(isinstance(elector, Elector) for elector in electors.values())
        # Whichever acquires first leads (both campaign at once).
        leading = wait_until(
            lambda: next((label for label, e in electors.items() if e.is_leader), None),
            timeout=WAIT,
            message="nobody leads",
        )
        (waiting,) = set(electors) - {leading}
        a, b = schedulers[leading], schedulers[waiting]
        first, second = electors[leading], electors[waiting]
        wait_until(
            lambda: len(runs.by(leading)) >= 3, timeout=WAIT, message="the leader ran no job"
        )
        assert b.state == STATE_PAUSED and runs.by(waiting) == []
        lease_a = first.lease
        assert lease_a is not None
        assert {token for _, _, token in runs.by(leading)} == {lease_a.token}
        with pytest.raises(RuntimeError, match="already"):
            run_while_leader(a, lease_name, backend=backend, **TIMING)

        first.stop()  # leaves the leader's scheduler paused, releases: the other leads
        assert a.state == STATE_PAUSED
        assert second.wait_for_leadership(WAIT)
        wait_until(lambda: len(runs.by(waiting)) >= 3, timeout=WAIT, message="no job ran next")
        lease_b = second.lease
        assert lease_b is not None and lease_b.token > lease_a.token
        assert b.state == STATE_RUNNING
        ran_by_a = len(runs.by(leading))
        time.sleep(1.0)
        assert len(runs.by(leading)) == ran_by_a  # paused: nothing more
        twice = [at for at, n in Counter(at for _, at, _ in runs.seen).items() if n > 1]
        assert twice == [], runs.seen
    finally:
        for scheduler in schedulers.values():
            if scheduler.running:
                scheduler.shutdown()
        for elector in electors.values():
            elector.stop()
    # shutdown() stopped the second's campaign and released its lease.
    assert not second.is_leader
    assert backend.read(lease_name) is None


def test_a_job_running_when_the_lease_is_lost_sees_it_lost(backend: Any, lease_name: str) -> None:
    started, outcome = threading.Event(), []

    def long_job() -> None:
        lease = current_lease()
        assert lease is not None
        started.set()
        outcome.append(lease.lost.wait(WAIT))

    scheduler = BackgroundScheduler(timezone=timezone.utc)
    scheduler.add_job(
        long_job, "date", run_date=datetime.now(timezone.utc), id="long", misfire_grace_time=None
    )
    elector = run_while_leader(scheduler, lease_name, backend=backend, **TIMING)
    try:
        assert started.wait(WAIT), "the job never started"
        backend.force_release(lease_name, actor="test")  # the store takes the lease away
        wait_until(lambda: outcome, timeout=WAIT, message="the job never returned")
        assert outcome == [True]
        wait_until(lambda: scheduler.state == STATE_PAUSED, timeout=WAIT, message="not paused")
    finally:
        scheduler.shutdown(wait=False)
        elector.stop()


def test_an_asyncio_scheduler_runs_coroutine_jobs_under_the_lease(
    backend: Any, lease_name: str
) -> None:
    seen: list[int | None] = []

    async def tick() -> None:
        seen.append(token_of_current_lease())

    async def main() -> None:
        scheduler = AsyncIOScheduler(timezone=timezone.utc)
        scheduler.add_job(tick, "interval", seconds=0.3, start_date=START, id="tick")
        elector = run_while_leader(scheduler, lease_name, backend=backend, **TIMING)
        assert isinstance(elector, AsyncElector)
        assert await elector.wait_for_leadership(WAIT)
        lease = elector.lease
        assert lease is not None
        for _ in range(int(WAIT / 0.1)):
            if len(seen) >= 3:
                break
            await asyncio.sleep(0.1)
        assert len(seen) >= 3 and set(seen) == {lease.token}, seen
        scheduler.shutdown()
        for _ in range(int(WAIT / 0.1)):
            if not elector.is_leader:
                break
            await asyncio.sleep(0.1)
        assert not elector.is_leader, "shutdown() did not stop the campaign"

    asyncio.run(main())
    wait_until(lambda: backend.read(lease_name) is None, timeout=WAIT, message="not released")


class FailingJobStore(MemoryJobStore):
    """A job store whose ``update_job`` fails from its ``after``-th call on, as
    django-apscheduler's ``DjangoJobStore`` does on SQLite when a listener of its own writes
    at the same time ("database is locked"): APScheduler's scheduler thread dies of it."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.updates = 0

    def update_job(self, job: Any) -> None:
        self.updates += 1
        if self.updates >= self.after:
            raise OperationalError("database is locked")
        super().update_job(job)


# The scheduler thread's death is the fault under test: its exception is expected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_leader_whose_scheduler_thread_died_gives_the_lease_up(
    backend: Any, lease_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler's thread dies (an exception of the job store): the leader would hold
    the lease and run nothing. It gives the lease up and stops campaigning; the other
    instance runs the schedule."""
    runs = Runs()
    broken = runs.scheduler("broken", BackgroundScheduler(timezone=timezone.utc))
    broken.add_jobstore(FailingJobStore(after=3), "default")
    broken.add_job(token_of_current_lease, "interval", seconds=0.5, start_date=START, id="tick")
    first = run_while_leader(broken, lease_name, identity="broken", backend=backend, **TIMING)
    schedulers = [broken]
    try:
        assert first.wait_for_leadership(WAIT)
        # Elected first, before the healthy one campaigns.
        healthy = background(runs, "healthy")
        schedulers.append(healthy)
        second = run_while_leader(
            healthy, lease_name, identity="healthy", backend=backend, **TIMING
        )
        wait_until(lambda: not first.is_leader, timeout=WAIT, message="the broken one still leads")
        assert second.wait_for_leadership(WAIT), "the healthy one was never elected"
        wait_until(lambda: len(runs.by("healthy")) >= 2, timeout=WAIT, message="no job ran next")
        assert not broken._thread.is_alive()
        assert "scheduler thread has died" in caplog.text
        # It campaigns no more: stopped, however long the healthy one leads.
        assert not first.wait_for_leadership(TIMING["ttl"])
        assert second.is_leader
    finally:
        for scheduler in schedulers:
            if scheduler.running:
                scheduler.shutdown(wait=False)
        first.stop()


def test_what_run_while_leader_refuses() -> None:
    with pytest.raises(TypeError, match="APScheduler 3 scheduler"):
        run_while_leader(object())
    with pytest.raises(RuntimeError, match="from a coroutine"):
        run_while_leader(AsyncIOScheduler())


def test_the_default_name_says_the_scheduler_and_its_job_stores() -> None:
    from django_leader.apscheduler import default_name

    scheduler = BackgroundScheduler()
    assert default_name(scheduler) == "apscheduler:BackgroundScheduler:MemoryJobStore"
    scheduler.add_jobstore(MemoryJobStore(), "other")
    assert default_name(scheduler) == "apscheduler:BackgroundScheduler:MemoryJobStore"
    assert default_name(AsyncIOScheduler()).startswith("apscheduler:AsyncIOScheduler:")
