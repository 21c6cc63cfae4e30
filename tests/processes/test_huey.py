"""huey's periodic tasks enqueued by the elected consumer only (issue 29): three instances of
a Django app running ``manage.py run_huey`` on one Redis huey (``tests/procs/huey_instance.py``,
a periodic task due at every check, checked every second), with
``django_leader.huey.run_while_leader``; real processes, real Redis, leases in Redis.

The leader is SIGKILLed, then the next one stopped with SIGTERM: every slot is enqueued at
most once, by the leader, and run at most once; after each failover the schedule goes on
within TTL + RETRY_INTERVAL + one period (plus the 1 s for a loaded machine of
``tests/support/cluster.py``'s TAKEOVER_BOUND). The same app without ``run_while_leader``
enqueues every check on every instance (the last test): what the integration is for.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
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
)

pytest.importorskip("huey", reason="huey is not installed")

pytestmark = MARKS

#: Seconds between two checks of the periodic tasks (tests/procs/huey_instance.py).
PERIOD = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Leases in Redis; huey's keys of this test's name removed after."""
    from huey import RedisHuey

    for store in open_store("redis"):
        for group in open_cluster(store, tmp_path):
            yield group
            RedisHuey(group.lease, url=redis_url()).storage.flush_all()


def instances(cluster: Cluster, *labels: str, **extra: str) -> list[Child]:
    return start_instances(cluster, "huey_instance", *labels, DL_MP_HUEY_URL=redis_url(), **extra)


def test_periodic_tasks_are_enqueued_once_by_the_leader_across_a_kill_and_a_stop(
    cluster: Cluster,
) -> None:
    children = {c.label: c for c in instances(cluster, "a", "b", "c")}
    run = kill_then_stop(cluster, children, "enqueued")

    enqueued = cluster.select(matches("enqueued"))
    ran = cluster.select(matches("ran"))
    report = "\n".join(f"{e['ev']} {e['who']} {e['at']}" for e in [*enqueued, *ran])
    # Every slot enqueued once, run at most once (a run on the killed worker may be lost).
    twice = {at: n for at, n in Counter(e["at"] for e in enqueued).items() if n > 1}
    assert twice == {}, f"slots enqueued more than once: {twice}\n{report}"
    twice = {at: n for at, n in Counter(e["at"] for e in ran).items() if n > 1}
    assert twice == {}, f"slots run more than once: {twice}\n{report}"
    assert {e["at"] for e in ran} <= {e["at"] for e in enqueued}, report
    # The leaders enqueued one after the other, each its own stretch of slots.
    assert in_turn(sorted(enqueued, key=lambda e: e["at"]), run), report
    # The schedule went on after each failover within the bound.
    assert run.after_kill["t"] - run.killed_at <= continues_within(PERIOD), report
    assert run.after_stop["t"] - run.stopped_at <= continues_within(PERIOD), report
    # While a leader held, no slot was skipped: about one a second (at least 18 in all).
    assert len(enqueued) >= 3 * LEADS_FOR, f"{report}\n{cluster.describe()}"


def test_without_run_while_leader_every_consumer_enqueues_every_check(cluster: Cluster) -> None:
    """The control: the same app, as huey's docs set it up."""
    instances(cluster, "a", "b", "c", DL_MP_HUEY_UNGUARDED="1")
    time.sleep(4 * PERIOD)
    runs = Counter(e["at"] for e in cluster.select(matches("ran")))
    assert len([at for at, n in runs.items() if n > 1]) >= 2, runs
