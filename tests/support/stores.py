"""The stores under test, and helpers to use them from tests and from the processes tests
start.

A store whose server is unreachable is skipped with the reason, unless
``DJANGO_LEADER_REQUIRE_SERVICES=1`` (set by ``.ci/run``), which turns the skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from django.conf import settings

from testproject.services import UNAVAILABLE

REQUIRE_SERVICES = os.environ.get("DJANGO_LEADER_REQUIRE_SERVICES") == "1"


#: The mark for tests that use the stores: every database set up, committed for real (the
#: backend's private connections commit), and only this project's tables flushed afterwards.
stores_db = pytest.mark.django_db(
    transaction=True,
    databases="__all__",
    available_apps=["django_leader", "testproject.demoapp"],
)


#: pytest id -> database alias of every database backend under test
DATABASE_STORES = {"sqlite": "default", "postgresql": "postgresql", "mysql": "mysql"}


#: pytest id -> cache alias of every Redis cache backend under test
CACHE_STORES = {"redis": "redis", "django-redis": "django_redis"}

#: pytest ids of the stores that are neither a database nor a cache (ZooKeeper).
OTHER_STORES = ["zookeeper"]


def require_zookeeper() -> dict[str, Any]:
    """The tests' ZooKeeper settings (``settings.ZOOKEEPER``: hosts, and a root of this test
    run's own); skip (or, in CI, fail) when it does not answer."""
    if settings.ZOOKEEPER is None:
        unavailable(UNAVAILABLE.get("zookeeper", "zookeeper: not configured"))
    return dict(settings.ZOOKEEPER)


def store_settings(backend: Any) -> dict[str, Any]:
    """The ``DJANGO_LEADER`` keys that make ``backend``'s store the settings' one."""
    from django_leader.backends.cache import CacheBackend
    from django_leader.backends.zookeeper import ZooKeeperBackend

    if isinstance(backend, ZooKeeperBackend):
        return {
            "BACKEND": "django_leader.backends.zookeeper.ZooKeeperBackend",
            "ZOOKEEPER": {"HOSTS": backend.conf.hosts, "ROOT": backend.root},
        }
    if isinstance(backend, CacheBackend):
        return {"BACKEND": "django_leader.backends.cache.CacheBackend", "CACHE": backend.alias}
    return {"BACKEND": "django_leader.backends.db.DatabaseBackend", "DATABASE": backend.alias}


def zookeeper_backend(**kwargs: Any) -> Any:
    """A ZooKeeperBackend on the tests' ZooKeeper and root (a new root is initialized:
    no lock-delay for a store never used); ``shutdown()`` it when done."""
    from django_leader.backends.zookeeper import ZooKeeperBackend

    conf = require_zookeeper()
    kwargs.setdefault("hosts", conf["HOSTS"])
    kwargs.setdefault("root", conf["ROOT"])
    store = ZooKeeperBackend(**kwargs)
    store.initialize()
    return store


def require_postgresql(reason: str | None) -> None:
    """Skip the test (in CI: fail it) unless the tests' PostgreSQL is configured and
    ``reason``, why its private servers cannot run here, is None."""
    from django.db import connections

    if reason is None and "postgresql" not in connections.settings:
        reason = "no PostgreSQL database configured"
    if reason is not None:
        unavailable(reason)


def forget_zookeeper_root(root: str) -> None:
    """Delete ``root`` and everything under it on the tests' ZooKeeper."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=require_zookeeper()["HOSTS"])
    client.start(timeout=15)
    try:
        client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()


def unavailable(reason: str) -> NoReturn:
    """Skip the test for a service it cannot reach (in CI, where every service is
    required, fail it)."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing: {reason}")
    pytest.skip(f"service unavailable: {reason}")


def require(alias: str, kind: str = "database") -> None:
    """Skip (or, in CI, fail) unless database (or cache) ``alias`` is configured."""
    if alias not in (settings.DATABASES if kind == "database" else settings.CACHES):
        unavailable(UNAVAILABLE.get(alias, f"{alias}: not configured"))


def open_store(store_id: str) -> Iterator[Any]:
    """A backend of the store ``store_id`` (a key of DATABASE_STORES or CACHE_STORES),
    skipped (or failed, in CI) when unavailable; its history flushed and closed after."""
    from django_leader.backends.base import Backend

    store: Backend
    if store_id == "zookeeper":
        store = zookeeper_backend()
        yield store
        assert store.flush_history(10), "history events still unwritten 10 s after the test"
        store.shutdown()
        return
    if store_id in DATABASE_STORES:
        from django_leader.backends.db import DatabaseBackend

        require(DATABASE_STORES[store_id])
        store = DatabaseBackend(DATABASE_STORES[store_id])
    else:
        from django_leader.backends.cache import CacheBackend

        require(CACHE_STORES[store_id], kind="cache")
        store = CacheBackend(CACHE_STORES[store_id])
    yield store
    # Before pytest-django flushes the history table: a writer still writing then would race
    # the flush ("database is locked" on SQLite).
    assert store.flush_history(10), "history events still unwritten 10 s after the test"
    store.close()


def history(backend: Any, name: str) -> list[tuple[str, str, str, int, str]]:
    """``(kind, holder, previous_holder, token, actor)`` of each event of ``name``, oldest first
    (the shipped contract suite's reading)."""
    from django_leader.testing.lease_contract import history as contract_history

    return contract_history(backend, name)


def answered(call: Any, *args: Any, timeout: float) -> Any:
    """``call(*args)``, tried again for up to ``timeout`` seconds while the store is
    unavailable (the first calls after a restart or a dropped connection meet a dead
    socket, then the backend reconnects); the last error if it never answers."""
    import time

    from django_leader import BackendUnavailable

    give_up = time.monotonic() + timeout
    while True:
        try:
            return call(*args)
        except BackendUnavailable:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.05)


def wipe(backend: Any, name: str) -> None:
    """Make the store forget everything about ``name``, as a store restart without
    persistence (Redis) or a hand-deleted row (database) would."""
    from django.db import connections

    from django_leader.backends.cache import CacheBackend
    from django_leader.backends.zookeeper import ZooKeeperBackend

    if isinstance(backend, ZooKeeperBackend):
        # ZooKeeper loses state as a whole (a wiped or restored ensemble): the name's
        # znodes and the store marker go, as with a new ensemble.
        backend.client.delete(backend._name_path(name), recursive=True)
        backend.client.delete(f"{backend.root}/store")
        return
    if isinstance(backend, CacheBackend):
        # This lease's keys only (what a restart without persistence loses for it): a
        # FLUSHDB would also pull the leases of any other run sharing this Redis.
        backend.client.delete(*backend.keys(name, ("lease", "meta", "candidates")))
    else:
        with connections[backend.alias].cursor() as cursor:
            cursor.execute("DELETE FROM django_leader_lease WHERE name = %s", [name])


ROOT = Path(__file__).resolve().parents[2]


def child_env(backend: Any, **extra: str) -> dict[str, str]:
    """The environment for a process (``manage.py ...``) that must use this test run's
    databases and the given backend (a DatabaseBackend or CacheBackend instance)."""
    import json

    from django.db import connections

    from django_leader.backends.cache import CacheBackend

    names = {alias: connections[alias].settings_dict["NAME"] for alias in settings.DATABASES}
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONPATH": str(ROOT),
        "DJANGO_LEADER_TEST_DB_NAMES": json.dumps(names),
        **extra,
    }
    from django_leader.backends.zookeeper import ZooKeeperBackend

    if isinstance(backend, ZooKeeperBackend):
        env["DJANGO_LEADER_BACKEND"] = "django_leader.backends.zookeeper.ZooKeeperBackend"
        env["DJANGO_LEADER_ZOOKEEPER_HOSTS"] = backend.conf.hosts
        env["DJANGO_LEADER_ZOOKEEPER_ROOT"] = backend.root
    elif isinstance(backend, CacheBackend):
        env["DJANGO_LEADER_BACKEND"] = "django_leader.backends.cache.CacheBackend"
        env["DJANGO_LEADER_CACHE"] = backend.alias
    else:
        env["DJANGO_LEADER_BACKEND"] = "django_leader.backends.db.DatabaseBackend"
        env["DJANGO_LEADER_DATABASE"] = backend.alias
    return env


def unreachable_redis() -> dict[str, Any]:
    """``override_settings()`` arguments for the Redis backend on a cache whose server
    does not answer (nothing listens on port 1)."""
    caches = {
        **settings.CACHES,
        "dead": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        },
    }
    conf = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.cache.CacheBackend",
        "CACHE": "dead",
    }
    return {"CACHES": caches, "DJANGO_LEADER": conf}


def allow_database(monkeypatch: pytest.MonkeyPatch, alias: str) -> None:
    """Let the running test connect to database ``alias``, added to
    ``connections.settings`` after its test case was set up (Django's test case refuses
    connections to databases it was not told of)."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    cells = BaseDatabaseWrapper.ensure_connection.__closure__ or ()
    for case in [c.cell_contents for c in cells if isinstance(c.cell_contents, type)]:
        known: Any = getattr(case, "databases", ())
        monkeypatch.setattr(case, "databases", frozenset(known) | {alias})


def kept(store: Any, prefix: str = "") -> int:
    """How much ``store`` keeps: rows of the lease, history and candidate tables whose name
    starts with ``prefix`` (a database), keys under the cache's prefix (Redis), znodes
    under the store's root (ZooKeeper). For retention's tests and bench/churn.py."""
    from django_leader.backends.db import DatabaseBackend
    from django_leader.backends.redis import RedisBackend

    if isinstance(store, DatabaseBackend):
        from django_leader.models import Lease, LeaseCandidate, LeaseEvent

        mine = {"name__startswith": prefix}
        return sum(
            model.objects.using(store.alias).filter(**mine).count()
            for model in (Lease, LeaseEvent, LeaseCandidate)
        )
    if isinstance(store, RedisBackend):
        pattern = str(store.cache.make_key("django_leader:*"))
        return sum(1 for _ in store.client.scan_iter(match=pattern, count=5000))
    found, pending = 0, [store.root]
    while pending:
        path = pending.pop()
        children = store.client.get_children(path)
        found += len(children)
        pending += [f"{path}/{child}" for child in children]
    return found
