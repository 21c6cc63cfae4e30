"""APScheduler 3 on the leader only (issue 29): three instances of an app whose
``BackgroundScheduler`` runs a job every second (``tests/procs/aps_instance.py``), handed to
``django_leader.apscheduler.run_while_leader``; real processes, real stores.

The leader is SIGKILLed, then the next one stopped with SIGTERM: every scheduled time runs
at most once, inside the lease (``current_lease()`` in the job), and after each failover
the schedule goes on within TTL + RETRY_INTERVAL + one period (plus the 1 s for a loaded
machine of ``tests/support/cluster.py``'s TAKEOVER_BOUND). The same app without
``run_while_leader`` runs every time on every instance (the last test): what the
integration is for.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import STARTUP, Child, Cluster, Event, matches, open_cluster, open_store
from tests.support.scheduler_runs import (
    LEADS_FOR,
    MARKS,
    continues_within,
    in_turn,
    kill_then_stop,
    start_instances,
)

pytest.importorskip("apscheduler", reason="APScheduler 3 is not installed")

pytestmark = MARKS

#: The job's period (tests/procs/aps_instance.py).
PERIOD = 1.0


def open_apps(spec: str, tmp_path: Path) -> Iterator[tuple[str, Cluster]]:
    """(the job store of the instances, a cluster on the lease store) for ``spec``,
    ``"<job store>:<lease store>"``."""
    jobstore, store_id = spec.split(":")
    if jobstore == "django":
        pytest.importorskip("django_apscheduler", reason="django-apscheduler is not installed")
    for store in open_store(store_id):
        yield from ((jobstore, cluster) for cluster in open_cluster(store, tmp_path))


@pytest.fixture(params=["memory:redis", "django:postgresql"])
def apps(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Cluster]]:
    """A memory job store (each instance its own copy) with leases in Redis;
    django-apscheduler's DjangoJobStore (shared) with leases in PostgreSQL."""
    yield from open_apps(request.param, tmp_path)


@pytest.fixture
def unguarded_apps(tmp_path: Path) -> Iterator[tuple[str, Cluster]]:
    yield from open_apps("memory:redis", tmp_path)


def instances(cluster: Cluster, jobstore: str, *labels: str, **extra: str) -> list[Child]:
    """Start the app's instances ``labels`` (the job store migrated first, if any) and wait
    until each is ready."""
    env = {
        "DL_MP_APS_JOBSTORE": jobstore,
        "DL_MP_APS_DB": str(cluster.tmp_path / "apscheduler.sqlite3"),
        **extra,
    }
    if jobstore == "django":
        migrate = cluster.spawn("migrate", "aps_instance", DL_MP_APS_MIGRATE="1", **env)
        cluster.wait_for(lambda e: e["ev"] == "migrated", "the job store migrated", STARTUP)
        migrate.proc.wait(timeout=STARTUP)
    return start_instances(cluster, "aps_instance", *labels, **env)


def runs(cluster: Cluster) -> list[Event]:
    return cluster.select(matches("ran"))


def test_jobs_run_once_on_the_leader_across_a_kill_and_a_stop(
    apps: tuple[str, Cluster],
) -> None:
    jobstore, cluster = apps
    children = {c.label: c for c in instances(cluster, jobstore, "a", "b", "c")}
    run = kill_then_stop(cluster, children, "ran")

    done = runs(cluster)
    report = [(e["who"], e["at"], e["token"]) for e in done]
    # Every scheduled time ran once, on one instance, with the lease as current_lease().
    twice = {at: n for at, n in Counter(e["at"] for e in done).items() if n > 1}
    assert twice == {}, f"scheduled times run more than once: {twice}\n{report}"
    assert all(e["token"] is not None for e in done), report
    # Each instance ran under its own term, one term after the other.
    by_time = sorted(done, key=lambda e: e["at"])
    assert [e["token"] for e in by_time] == sorted(e["token"] for e in by_time), report
    assert in_turn(by_time, run), report
    # The schedule went on after each failover within the bound.
    assert run.after_kill["t"] - run.killed_at <= continues_within(PERIOD), report
    assert run.after_stop["t"] - run.stopped_at <= continues_within(PERIOD), report
    # While a leader held, no time was skipped: about one a second (at least 18 in all).
    assert len(done) >= 3 * LEADS_FOR, f"{report}\n{cluster.describe()}"


def test_without_run_while_leader_every_instance_runs_every_time(
    unguarded_apps: tuple[str, Cluster],
) -> None:
    """The control: the same app, its scheduler started as APScheduler's docs say."""
    jobstore, cluster = unguarded_apps
    instances(cluster, jobstore, "a", "b", "c", DL_MP_APS_UNGUARDED="1")
    time.sleep(4 * PERIOD)
    twice = {at for at, n in Counter(e["at"] for e in runs(cluster)).items() if n > 1}
    assert len(twice) >= 2, runs(cluster)
