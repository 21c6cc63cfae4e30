"""``django_leader.rq.run_while_leader`` against every real lease store, RQ's queue in the
suite's Redis: two cron schedulers (two candidates) of which only the leader enqueues, each
due time once; a new leader continues from the last recorded slot; a stop request (RQ's
SIGTERM handler) waits until the job of a recorded slot is enqueued; the errors a user can
make. Across processes: tests/processes/test_rq.py."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("rq", reason="RQ is not installed")

from django.conf import settings
from redis import Redis
from rq import Queue
from rq.cron import CronJob, CronScheduler
from rq.exceptions import StopRequested

from django_leader.rq import FOLLOWER_POLL, run_while_leader
from tests.support.stores import stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db
TIMING: dict[str, Any] = {"ttl": 3.0, "renew_interval": 0.6, "retry_interval": 0.2}
WAIT = 15.0


def job() -> None:
    """The cron job (nothing runs it: the tests count what is enqueued)."""


@pytest.fixture
def queue() -> Iterator[Queue]:
    """A queue of its own in the suite's Redis, emptied after."""
    location = settings.CACHES["redis"]["LOCATION"]
    connection = Redis.from_url(location if isinstance(location, str) else location[0])
    queue = Queue(f"cron-{uuid.uuid4().hex[:10]}", connection=connection)
    yield queue
    queue.empty()


def scheduler(queue: Queue) -> CronScheduler:
    """A process's cron scheduler: ``job`` every minute on ``queue``."""
    cron = CronScheduler(connection=queue.connection)
    cron.register(job, queue.name, interval=60)
    return cron


def leads(cron: CronScheduler) -> bool:
    """Whether ``cron`` enqueues (its elector's work has opened the gate)."""
    return bool(cron._django_leader_gate.slots.leads)  # type: ignore[attr-defined]


def test_only_the_leader_enqueues_and_a_new_one_continues_the_schedule(
    backend: Any, lease_name: str, queue: Queue
) -> None:
    crons = {label: scheduler(queue) for label in ("a", "b")}
    electors = {
        label: run_while_leader(cron, lease_name, identity=label, backend=backend, **TIMING)
        for label, cron in crons.items()
    }
    try:
        leader = wait_until(
            lambda: next((k for k, cron in crons.items() if leads(cron)), None),
            timeout=WAIT,
            message="no scheduler was elected",
        )
        follower = "b" if leader == "a" else "a"
        assert crons[follower].enqueue_jobs() == []
        # A follower looks at its lease once a second, even with a job overdue in its own
        # schedule (RQ's own answer is then 0 s: a loop that never sleeps).
        crons[follower].get_jobs()[0].set_enqueue_time(
            datetime.now(timezone.utc) - timedelta(hours=1)
        )
        assert crons[follower].calculate_sleep_interval() == FOLLOWER_POLL
        # The job never ran: due now, on the leader only, once.
        assert len(crons[leader].enqueue_jobs()) == 1
        assert crons[leader].enqueue_jobs() == []
        assert queue.count == 1
        # The leader steps down; the other one continues from the recorded slot: the job is
        # due a minute after it, not at once (its own schedule never ran it).
        electors[leader].stop()
        wait_until(lambda: leads(crons[follower]), timeout=WAIT, message="no takeover")
        assert crons[follower].enqueue_jobs() == []
        assert queue.count == 1
        (cron_job,) = crons[follower].get_jobs()
        assert cron_job.latest_enqueue_time == crons[leader].get_jobs()[0].latest_enqueue_time
        assert cron_job.next_enqueue_time == cron_job.latest_enqueue_time + timedelta(minutes=1)
    finally:
        for elector in electors.values():
            elector.stop()


def test_a_process_elected_between_its_enqueue_and_its_sleep_does_not_sleep_a_minute(
    backend: Any, lease_name: str, queue: Queue
) -> None:
    """CI failure (stop 40, tests/processes/test_rq.py): RQ's loop enqueues, then asks how
    long to sleep. A follower elected in between answered with RQ's own rule, and an
    interval job it never ran has no next time: 60 s, the schedule stopped for a minute.
    Now 0 until its jobs follow the records, and RQ's answer after that."""
    crons = {label: scheduler(queue) for label in ("a", "b")}
    electors = {
        "a": run_while_leader(crons["a"], lease_name, identity="a", backend=backend, **TIMING)
    }
    try:
        wait_until(lambda: leads(crons["a"]), timeout=WAIT, message="a was never elected")
        assert len(crons["a"].enqueue_jobs()) == 1
        electors["b"] = run_while_leader(
            crons["b"], lease_name, identity="b", backend=backend, **TIMING
        )
        assert crons["b"].enqueue_jobs() == []  # b's loop, following
        electors["a"].stop()
        wait_until(lambda: leads(crons["b"]), timeout=WAIT, message="no takeover")
        assert crons["b"].calculate_sleep_interval() == 0  # then its loop goes on at once
        assert crons["b"].enqueue_jobs() == []  # aligned: due a minute after a's slot
        sleep = crons["b"].calculate_sleep_interval()
        assert 50 < sleep <= 60, sleep  # RQ's own answer now: that job's next time
        assert queue.count == 1
    finally:
        for elector in electors.values():
            elector.stop()


def test_a_stop_request_waits_until_the_job_of_a_recorded_slot_is_enqueued(
    backend: Any, lease_name: str, queue: Queue, monkeypatch: Any
) -> None:
    cron = scheduler(queue)
    elector = run_while_leader(cron, lease_name, backend=backend, **TIMING)
    enqueue = CronJob.enqueue

    def enqueue_with_a_sigterm_in_the_middle(self: CronJob, connection: Any) -> Any:
        cron._request_stop(signal.SIGTERM, None)  # as RQ's handler would be called
        return enqueue(self, connection)

    monkeypatch.setattr(CronJob, "enqueue", enqueue_with_a_sigterm_in_the_middle)
    try:
        wait_until(lambda: leads(cron), timeout=WAIT, message="not elected")
        with pytest.raises(StopRequested):
            cron.enqueue_jobs()
        assert queue.count == 1  # enqueued, then stopped
    finally:
        elector.stop()


def test_bad_input_is_refused_at_the_call(queue: Queue) -> None:
    with pytest.raises(TypeError, match="CronScheduler"):
        run_while_leader(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        run_while_leader(scheduler(queue), ttl=-1)
    cron = scheduler(queue)
    elector = run_while_leader(cron, ttl=30)
    try:
        assert elector.name == "rq-cron"
        with pytest.raises(RuntimeError, match="already"):
            run_while_leader(cron)
    finally:
        elector.stop()
