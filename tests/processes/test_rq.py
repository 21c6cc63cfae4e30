"""RQ's cron jobs enqueued by the elected process only (issue 29): three instances of an
app whose RQ ``CronScheduler`` repeats a job every second (``tests/procs/rq_instance.py``),
handed to ``django_leader.rq.run_while_leader``; real processes, real Redis, leases in
PostgreSQL.

The leader is SIGKILLed, then the next one stopped with SIGTERM: every due time is enqueued
once, by the leader, each at least an interval after the one before (a new leader continues
the schedule from the last recorded slot); after each failover the schedule goes on within
TTL + RETRY_INTERVAL + one interval (plus the 1 s for a loaded machine of
``tests/support/cluster.py``'s TAKEOVER_BOUND); what Redis holds is what was reported
(and perhaps the SIGKILLed leader's last job, enqueued just before the kill). The
same app without ``run_while_leader`` enqueues every time on every instance (the last
test): what the integration is for.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    Child,
    Cluster,
    matches,
    open_cluster,
    open_store,
)
from tests.support.scheduler_runs import (
    LEADS_FOR,
    MARKS,
    continues_within,
    in_turn,
    kill_then_stop,
    redis_url,
    start_instances,
    terminate,
)

pytest.importorskip("rq", reason="RQ is not installed")

pytestmark = MARKS

#: The job's interval (tests/procs/rq_instance.py).
INTERVAL = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Leases in PostgreSQL; the test's queue, its jobs and its cron history removed after."""
    from redis import Redis
    from rq import Queue

    for store in open_store("postgresql"):
        for group in open_cluster(store, tmp_path):
            yield group
            connection = Redis.from_url(redis_url())
            Queue(group.lease, connection=connection).empty()
            connection.delete(f"rq:cron_job:{group.lease}:jobs")


def instances(cluster: Cluster, *labels: str, **extra: str) -> list[Child]:
    return start_instances(cluster, "rq_instance", *labels, DL_MP_RQ_URL=redis_url(), **extra)


def gaps(due: Iterable[float]) -> list[float]:
    """Seconds between two due times (timestamps) enqueued one after the other."""
    return [round(b - a, 3) for a, b in itertools.pairwise(sorted(due))]


def test_cron_jobs_are_enqueued_once_by_the_leader_across_a_kill_and_a_stop(
    cluster: Cluster,
) -> None:
    from redis import Redis
    from rq import Queue

    children = {c.label: c for c in instances(cluster, "a", "b", "c")}
    run = kill_then_stop(cluster, children, "enqueued")
    terminate(children[run.after_stop["who"]])  # so that the queue holds all it will

    enqueued = sorted(cluster.select(matches("enqueued")), key=lambda e: e["at"])
    report = "\n".join(f"{e['who']} {e['at']:.3f} {e['job']}" for e in enqueued)
    # Redis holds what was reported, and at most one job more: the SIGKILL may land between
    # the killed leader's last enqueue and its report (a job enqueued after that leader's
    # last report, before the kill). Nothing else: no job enqueued twice unseen.
    queue = Queue(cluster.lease, connection=Redis.from_url(redis_url()))
    jobs = {job.id: job for job in queue.get_jobs()}
    listing = "\n".join(f"{job.enqueued_at} {key}" for key, job in sorted(jobs.items()))
    failure = f"{report}\nin the queue:\n{listing}"
    assert {e["job"] for e in enqueued} <= set(jobs), failure
    unreported = [jobs[key] for key in set(jobs) - {e["job"] for e in enqueued}]
    killed_last = max(e["t"] for e in enqueued if e["who"] == run.first["who"])
    assert len(unreported) <= 1, failure
    for job in unreported:
        assert job.enqueued_at is not None, failure
        assert killed_last < job.enqueued_at.timestamp() < run.killed_at, failure
    # One due time after the other, an interval apart at least (10 % for the first run,
    # whose due time is the instant it was enqueued): no time enqueued twice.
    due = [*(e["at"] for e in enqueued), *(job.enqueued_at.timestamp() for job in unreported)]
    assert min(gaps(due)) >= 0.9 * INTERVAL, f"{gaps(due)}\n{failure}"
    # The leaders enqueued one after the other.
    assert in_turn(enqueued, run), report
    # The schedule went on after each failover within the bound.
    assert run.after_kill["t"] - run.killed_at <= continues_within(INTERVAL), report
    assert run.after_stop["t"] - run.stopped_at <= continues_within(INTERVAL), report
    # While a leader held, no time was skipped: about one a second (at least 18 in all).
    assert len(enqueued) >= 3 * LEADS_FOR, f"{report}\n{cluster.describe()}"


def test_without_run_while_leader_every_instance_enqueues_every_time(cluster: Cluster) -> None:
    """The control: the same app, started as ``rq cron`` starts its scheduler."""
    instances(cluster, "a", "b", "c", DL_MP_RQ_UNGUARDED="1")
    time.sleep(4 * INTERVAL)
    due = [event["at"] for event in cluster.select(matches("enqueued"))]
    close = [gap for gap in gaps(due) if gap < 0.9 * INTERVAL]
    assert len(close) >= 4, gaps(due)
