"""Retention (issue 27): ``Backend.prune`` and ``manage.py leader prune`` forget the names
nobody has used for a while, on every store, and no name's tokens go backwards.

Each store here is one of its own: the test's database (flushed after every test), a Redis
key prefix, a ZooKeeper root; ``prune`` forgets every unused name it finds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_leader.backends import get_backend
from django_leader.testing.contract import RetentionContract
from tests.support.stores import (
    DATABASE_STORES,
    forget_zookeeper_root,
    kept,
    require,
    require_zookeeper,
    stores_db,
    zookeeper_backend,
)

pytestmark = stores_db

STORES = [*DATABASE_STORES, "redis", "zookeeper"]


@pytest.fixture(params=STORES)
def own_store(request: pytest.FixtureRequest, settings: Any) -> Iterator[Any]:
    """A backend on a store of the test's own, set as ``DJANGO_LEADER``'s backend."""
    store_id = request.param
    conf = dict(settings.DJANGO_LEADER)
    store: Any
    if store_id in DATABASE_STORES:
        from django_leader.backends.db import DatabaseBackend

        alias = DATABASE_STORES[store_id]
        require(alias)
        conf.update(BACKEND="django_leader.backends.db.DatabaseBackend", DATABASE=alias)
        with override_settings(DJANGO_LEADER=conf):
            store = DatabaseBackend(alias)
            yield store
            store.close()
            get_backend().close()  # the one manage.py leader used, on this thread
    elif store_id == "redis":
        from django_leader.backends.redis import RedisBackend

        require("redis", kind="cache")
        cache = {**settings.CACHES["redis"], "KEY_PREFIX": f"retention-{uuid.uuid4().hex}"}
        conf.update(BACKEND="django_leader.backends.redis.RedisBackend", CACHE="retention")
        with override_settings(CACHES={**settings.CACHES, "retention": cache}, DJANGO_LEADER=conf):
            store = RedisBackend("retention")
            yield store
            store.flush_history(10)
            store.close()
    else:
        zk = require_zookeeper()
        root = f"{zk['ROOT']}-retention-{uuid.uuid4().hex[:8]}"
        conf.update(BACKEND="django_leader.backends.zookeeper.ZooKeeperBackend")
        conf["ZOOKEEPER"] = {**zk, "ROOT": root}
        with override_settings(DJANGO_LEADER=conf):
            store = zookeeper_backend(root=root)
            try:
                yield store
            finally:
                store.flush_history(10)
                store.shutdown()
                forget_zookeeper_root(root)


class TestRetention(RetentionContract):
    """The shipped retention contract on each store."""

    @pytest.fixture
    def backend(self, own_store: Any) -> Any:
        return own_store


def test_leader_prune_leaves_the_state_of_live_names_only(own_store: Any) -> None:
    """200 names taken and released, one held: after ``leader prune --days 0`` the store
    keeps about what it keeps for the held one, whatever the churn was; the held name's
    lease is untouched. (Before retention, ``leader prune`` deleted history only: every
    name left its row, its Redis meta hash and terms entry, its znode.)"""
    store, run = own_store, uuid.uuid4().hex[:8]
    held, _ = store.acquire(f"live-{run}", "alice", 60)
    assert held is not None
    baseline = kept(store)
    tokens = []
    for index in range(200):
        lease, _ = store.acquire(f"churn-{run}-{index}", "alice", 60)
        assert lease is not None and store.release(lease)
        tokens.append(lease.token)
    store.flush_history(10)
    assert kept(store) >= baseline + 200

    out = StringIO()
    call_command("leader", "prune", "--days", "0", stdout=out)
    assert "forgot 200 names unused for 0 days" in out.getvalue()
    assert kept(store) <= baseline + 1, out.getvalue()  # a store marker or floor row
    assert store.names() == [f"live-{run}"]
    assert store.renew(held, 60) is not None
    again, _ = store.acquire(f"churn-{run}-7", "bob", 60)
    assert again is not None and again.token > tokens[7]
