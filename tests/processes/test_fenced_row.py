"""A holder paused past its lease, in a real process: with Redis or ZooKeeper, its fenced
write is refused by the fence row in the database the writes go to, once its successor
wrote there (docs/safety.md, "Fenced writes").

The holder (``tests/procs/fence_holder.py``) takes a lease in Redis or ZooKeeper and writes
through ``lease.fenced(using=alias)``; it is SIGSTOPped until its lease expired there; this
process takes the lease and writes through ``fenced(using=alias)``; the holder resumes and
tries again: refused with its own lease (the local deadline passed) and with a copy that
does not know it lost (only the database can refuse that one). Each database in turn.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_leader.backends.base import Backend
from django_leader.conf import resolve_timing
from django_leader.models import LeaseFence
from django_leader.term import acquire_once
from django_leader.testing.contract import wait_until_expired
from testproject.demoapp.models import FencedWrite
from tests.support.cluster import PATIENCE, STARTUP, Cluster, matches, open_cluster, open_store
from tests.support.stores import DATABASE_STORES, require
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

#: The holder's lease time in the store: it expires while the holder is stopped.
TTL = 1.0


@pytest.fixture(params=["redis", "zookeeper"])
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The store the holder's lease is in: Redis or ZooKeeper (not the database the writes
    go to)."""
    yield from open_store(request.param)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


@pytest.fixture(params=list(DATABASE_STORES))
def alias(request: pytest.FixtureRequest) -> str:
    """The database the fenced writes go to."""
    alias = DATABASE_STORES[request.param]
    require(alias)
    return alias


def test_a_paused_holders_fenced_write_is_refused_by_the_fence_row(
    cluster: Cluster, store: Backend, alias: str
) -> None:
    holder = cluster.spawn("holder", "fence_holder", DL_MP_TTL=str(TTL), DL_FENCE_USING=alias)
    old = cluster.wait_for(matches("acquired", "holder"), "the holder's lease", STARTUP)
    before = holder.request("write", "wrote", note="before")
    assert (before["fenced"], before["unaware"]) == ("committed", "committed"), before

    os.kill(holder.pid, signal.SIGSTOP)
    wait_until(lambda: holder.state() == "T", timeout=PATIENCE, interval=0.005)
    wait_until_expired(store, cluster.lease)
    new, _ = acquire_once(store, cluster.lease, "successor", resolve_timing(30))
    assert new is not None and new.token > old["token"]
    with new.fenced(using=alias):
        FencedWrite.objects.using(alias).create(
            writer=cluster.lease, token=new.token, note="successor"
        )
    assert holder.state() == "T"  # still stopped: it wrote nothing meanwhile
    os.kill(holder.pid, signal.SIGCONT)

    after = holder.request("write", "wrote", note="after")
    assert after["fenced"].startswith("rejected"), after  # its local deadline passed
    assert after["unaware"].startswith("rejected") and "fenced off" in after["unaware"], after
    rows = FencedWrite.objects.using(alias).filter(writer=cluster.lease).order_by("id")
    assert list(rows.values_list("token", "note")) == [
        (old["token"], "before"),
        (old["token"], "before-unaware"),
        (new.token, "successor"),
    ]
    assert LeaseFence.objects.using(alias).get(name=cluster.lease).token == new.token
    store.release(new)
