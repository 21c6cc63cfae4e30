"""Lease operations per store, beside the driver's raw round trip, measured in one run.

The ``ops`` part of ``bench/report.py``. For every reachable store, one process, one
thread, each call timed by itself, ``--n`` samples per repeat, ``--repeats`` repeats
(interleaved: every store's repeat 1, then every store's repeat 2...), so that the spread
of the repeats' medians shows how steady the machine was:

* **acquire** of a free lease and its **release** (django-leader's backend, history on);
* **renew** of a held lease;
* **lock()**: ``with lock(name): pass`` — what a caller of ``lock()`` (and so
  ``singleton_task``) pays: acquire, the renewer started, release;
* **raw renew**: the very statement ``renew`` sent, captured from it and replayed with the
  driver alone on a connection of its own — psycopg (PostgreSQL: the conditional
  ``UPDATE … RETURNING`` on the lease table itself, not a temporary table, which would
  skip the WAL), MySQLdb (MariaDB: the ``UPDATE`` and ``SELECT`` in one transaction, as
  ``renew`` runs them), redis-py (``EVALSHA`` of the backend's own renewal script, same
  keys and arguments), and kazoo (``set`` of a node with its version: ZooKeeper's
  conditional write); none on SQLite (in process, no round trip; and a statement replayed
  in a tight loop sets the same millisecond again, a write SQLite skips);
* **ping**: the driver's cheapest round trip (``SELECT 1``, ``PING``, ``exists``);
* **python-redis-lock** (the peer, on the same Redis): ``acquire``, ``extend``,
  ``release``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from _setup import migrate

#: ttl of the measured leases: longer than a whole ops part (the held lease is renewed
#: once per repeat of its store, and a repeat of every store may take a minute or more).
TTL = 600.0


def timed(call: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


@contextlib.contextmanager
def captured_sql() -> Iterator[list[tuple[str, Any]]]:
    """Every (sql, params) executed through a Django cursor while the block runs."""
    from django.db.backends import utils

    found: list[tuple[str, Any]] = []
    original = utils.CursorWrapper.execute

    def execute(self: Any, sql: str, params: Any = None) -> Any:
        found.append((sql, params))
        return original(self, sql, params)

    utils.CursorWrapper.execute = execute  # type: ignore[method-assign]
    try:
        yield found
    finally:
        utils.CursorWrapper.execute = original  # type: ignore[method-assign]


@contextlib.contextmanager
def captured_evalsha() -> Iterator[list[tuple[Any, ...]]]:
    """Every EVALSHA (its arguments, as redis-py's ``evalsha`` takes them) that the Redis
    backend sends while the block runs (``django_leader/backends/redis/call.py``)."""
    from django_leader.backends.redis import call

    found: list[tuple[Any, ...]] = []
    original = call._evalsha

    def evalsha(pool: Any, sha: str, keys: Any, args: Any) -> Any:
        found.append((sha, len(keys), *keys, *args))
        return original(pool, sha, keys, args)

    call._evalsha = evalsha
    try:
        yield found
    finally:
        call._evalsha = original


class Store:
    """One store: its django-leader backend, and raw driver calls beside it."""

    def __init__(self, label: str, backend: Any) -> None:
        self.label = label
        self.backend = backend
        self.name = f"bench-ops-{uuid.uuid4().hex[:8]}"
        self.held: Any = None
        self.raw_renew: Callable[[], Any] | None = None
        self.ping: Callable[[], Any] | None = None
        self.raw_what = ""
        #: The store's acquire and release statements replayed with the driver alone.
        self.raw_lock: Callable[[], Any] | None = None
        self.closers: list[Callable[[], Any]] = []

    def prepare(self) -> None:
        """Hold the renewed lease, and build the raw calls from what its renewal sends."""
        backend = self.backend
        self.held, _ = backend.acquire(self.name, "bench", TTL)
        assert self.held is not None, f"{self.label}: could not acquire {self.name}"
        with captured_sql() as sql, captured_evalsha() as scripts:
            assert backend.renew(self.held, TTL) is not None
        self.build_raw(sql, scripts)
        free = f"{self.name}-raw"
        lease, _ = backend.acquire(free, "bench", TTL)  # the name exists: as cycle()'s does
        assert lease is not None and backend.release(lease)
        with captured_sql() as sql:
            lease, _ = backend.acquire(free, "bench", TTL)
            assert lease is not None
            taken = len(sql)
            assert backend.release(lease)
        self.build_raw_lock(sql[:taken], sql[taken:], lease.token)

    def build_raw_lock(
        self, acquire: list[tuple[str, Any]], release: list[tuple[str, Any]], token: int
    ) -> None:
        """What ``acquire`` and ``release`` sent (``token``: the lease's), to replay."""

    def build_raw(self, sql: list[tuple[str, Any]], scripts: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def cycle(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """acquire, release, renew and lock() samples: one of each per call."""
        raise NotImplementedError

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.held is not None:
                self.backend.release(self.held)
        for close in self.closers:
            with contextlib.suppress(Exception):
                close()


class DatabaseStore(Store):
    def __init__(self, label: str, alias: str) -> None:
        from django_leader.backends.db import DatabaseBackend

        super().__init__(label, DatabaseBackend(alias))
        self.alias = alias

    def build_raw(self, sql: list[tuple[str, Any]], scripts: list[tuple[Any, ...]]) -> None:
        from django.db import connections

        statements = [(q, p) for q, p in sql if q.lstrip().upper().startswith(("UPDATE", "SEL"))]
        params = connections[self.alias].get_connection_params()
        if self.label == "postgresql":
            import psycopg

            conn = psycopg.connect(
                host=params.get("host"),
                port=params.get("port"),
                user=params.get("user"),
                password=params.get("password") or None,
                dbname=params.get("dbname"),
                autocommit=True,
                cursor_factory=psycopg.ClientCursor,  # as Django's (client-side binding)
            )
            self.closers.append(conn.close)
            cursor = conn.cursor()
            (update, args), *_ = statements

            def raw() -> None:
                cursor.execute(update, args)
                assert cursor.fetchall()

            self.raw_renew = raw
            self.ping = lambda: cursor.execute("SELECT 1").fetchall()
            self.raw_what = "psycopg: the renewal's UPDATE … RETURNING, autocommit"
            self.cursor = cursor
        elif self.label == "mariadb":
            import MySQLdb

            conn = MySQLdb.connect(
                host=params.get("host"),
                port=params.get("port", 3306),
                user=params.get("user"),
                password=params.get("password", ""),
                database=params.get("database") or params.get("db"),
                charset="utf8mb4",
            )
            self.closers.append(conn.close)
            conn.autocommit(False)
            cursor = conn.cursor()

            def raw() -> None:
                for query, args in statements:
                    cursor.execute(query, args)
                cursor.fetchall()
                conn.commit()

            def ping() -> None:
                cursor.execute("SELECT 1")
                cursor.fetchall()
                conn.commit()

            self.raw_renew, self.ping = raw, ping
            self.raw_what = "MySQLdb: the renewal's UPDATE, SELECT, COMMIT"
        else:  # sqlite
            # No raw renewal: SQLite runs in this process (no round trip), and replayed
            # in a loop the statement sets the same millisecond again and again, a write
            # SQLite skips (nothing changed, nothing committed to disk): no comparison.
            conn = sqlite3.connect(connections[self.alias].settings_dict["NAME"], timeout=30)
            self.closers.append(conn.close)
            self.ping = lambda: conn.execute("SELECT 1").fetchall()
            self.raw_what = "none (in-process library: no round trip to compare with)"

    def build_raw_lock(
        self, acquire: list[tuple[str, Any]], release: list[tuple[str, Any]], token: int
    ) -> None:
        """PostgreSQL: the acquisition's statement (it returns the new token) and the
        release's with that token, replayed with psycopg alone, each in autocommit (each is
        one statement, with its history row)."""
        if self.label != "postgresql":
            return
        cursor = self.cursor
        [(take, take_args)] = acquire
        [(give, give_args)] = release
        at = [i for i, arg in enumerate(give_args) if arg == token]

        def raw() -> None:
            cursor.execute(take, take_args)
            new = cursor.fetchone()[3]  # the lease's columns: name, holder, previous, token
            args = list(give_args)
            for i in at:
                args[i] = new
            cursor.execute(give, args)
            assert cursor.fetchall()

        self.raw_lock = raw

    def cycle(self) -> tuple[list[float], list[float], list[float], list[float]]:
        return cycle(self.backend, self.name, self.held)


def cycle(
    backend: Any, name: str, held: Any
) -> tuple[list[float], list[float], list[float], list[float]]:
    from django_leader import lock

    free = f"{name}-free"
    started = time.perf_counter()
    lease, _ = backend.acquire(free, "bench", TTL)
    acquired = time.perf_counter()
    assert lease is not None, f"{free}: not acquired"
    assert backend.release(lease)
    released = time.perf_counter()
    assert backend.renew(held, TTL) is not None
    renewed = time.perf_counter()
    with lock(f"{name}-lock", ttl=TTL, backend=backend):
        pass
    locked = time.perf_counter()
    return [acquired - started], [released - acquired], [renewed - released], [locked - renewed]


class RedisStore(Store):
    def __init__(self) -> None:
        from django_leader.backends.cache import CacheBackend

        super().__init__("redis", CacheBackend("redis"))

    def build_raw(self, sql: list[tuple[str, Any]], scripts: list[tuple[Any, ...]]) -> None:
        import redis

        kwargs = dict(self.backend.client.connection_pool.connection_kwargs)
        client = redis.Redis(connection_pool=redis.ConnectionPool(**kwargs))
        self.closers.append(client.close)
        # The last: on a server whose script cache is empty, redis-py's first EVALSHA
        # fails (NOSCRIPT) and is sent again after SCRIPT LOAD.
        args = scripts[-1]
        self.raw_renew = lambda: client.evalsha(*args)
        self.ping = client.ping
        self.raw_what = "redis-py: EVALSHA of the renewal script, same keys and arguments"
        self.client = client

    def cycle(self) -> tuple[list[float], list[float], list[float], list[float]]:
        return cycle(self.backend, self.name, self.held)

    def peer(self, n: int) -> dict[str, list[float]] | str:
        """python-redis-lock on the same server: acquire, extend, release."""
        try:
            import redis_lock
        except ImportError:
            return "python-redis-lock is not installed"
        found: dict[str, list[float]] = {"acquire": [], "extend": [], "release": []}
        name = f"bench-prl-{uuid.uuid4().hex[:8]}"
        for _ in range(n):
            one = redis_lock.Lock(self.client, name, expire=int(TTL))
            started = time.perf_counter()
            assert one.acquire(blocking=False)
            acquired = time.perf_counter()
            one.extend(expire=int(TTL))
            extended = time.perf_counter()
            one.release()
            released = time.perf_counter()
            found["acquire"].append(acquired - started)
            found["extend"].append(extended - acquired)
            found["release"].append(released - extended)
        return found


class ZooKeeperStore(Store):
    def __init__(self, hosts: str) -> None:
        from elections import ZooKeeperRoot

        self.root = ZooKeeperRoot(hosts, f"/django-leader-bench-ops-{os.getpid()}")
        super().__init__("zookeeper", self.root.backend)
        self.closers.append(self.root.remove)

    def build_raw(self, sql: list[tuple[str, Any]], scripts: list[tuple[Any, ...]]) -> None:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=self.root.hosts, timeout=10)
        client.start(timeout=10)
        self.closers.append(client.stop)
        path = f"{self.root.root}/bench-raw"
        client.create(path, b"{}", makepath=True)
        version = [client.exists(path).version]

        def raw() -> None:
            stat = client.set(path, b'{"holder": "bench", "token": 1}', version=version[0])
            version[0] = stat.version

        self.raw_renew = raw
        self.ping = lambda: client.exists(self.root.root)
        self.raw_what = "kazoo: set of a node with its version"

    def cycle(self) -> tuple[list[float], list[float], list[float], list[float]]:
        return cycle(self.backend, self.name, self.held)


def stores(wanted: list[str]) -> tuple[list[Store], list[str]]:
    """The reachable stores of ``wanted``, prepared; and why the others are not."""
    from django.conf import settings

    from testproject.services import UNAVAILABLE

    found: list[Store] = []
    missing = [f"{alias}: {reason}" for alias, reason in UNAVAILABLE.items()]
    for alias, label in (("default", "sqlite"), ("postgresql", "postgresql"), ("mysql", "mariadb")):
        if label in wanted and alias in settings.DATABASES:
            migrate(alias)
            found.append(DatabaseStore(label, alias))
    if "redis" in wanted and "redis" in settings.CACHES:
        migrate("default")  # the history of the cache backend
        found.append(RedisStore())
    zookeeper = getattr(settings, "ZOOKEEPER", None)
    if "zookeeper" in wanted and zookeeper:
        migrate("default")
        found.append(ZooKeeperStore(zookeeper["HOSTS"]))
    for store in found:
        store.prepare()
    return found, missing


KINDS = ("ping", "raw renew", "renew", "acquire", "release", "lock()", "raw acquire + release")


def measure(
    store: Store,
    results: dict[str, dict[str, list[list[float]]]],
    peer: dict[str, list[list[float]]],
    n: int,
    repeat: int,
) -> str:
    """One repeat of ``store``, added to ``results`` (and ``peer``); why the peer was not
    measured, or ""."""
    peer_missing = ""
    assert store.ping is not None
    row = results[store.label]
    row["ping"].append(timed(store.ping, n))
    if store.raw_renew is not None:
        row["raw renew"].append(timed(store.raw_renew, n))
    if store.raw_lock is not None:
        row["raw acquire + release"].append(timed(store.raw_lock, n))
    samples: list[list[float]] = [[], [], [], []]
    for _ in range(n):
        for kept, new in zip(samples, store.cycle(), strict=True):
            kept.extend(new)
    for kind, kept in zip(("acquire", "release", "renew", "lock()"), samples, strict=True):
        row[kind].append(kept)
    if isinstance(store, RedisStore):
        found_peer = store.peer(n)
        if isinstance(found_peer, str):
            peer_missing = found_peer
        else:
            for kind, values in found_peer.items():
                peer[kind].append(values)
    med = statistics.median(row["renew"][-1]) * 1000
    raw = statistics.median(row["raw renew"][-1]) * 1000 if row["raw renew"] else math.nan
    print(
        f"  ops {store.label:<10} repeat {repeat + 1}: renew {med:.3f} ms, raw {raw:.3f} ms",
        flush=True,
    )
    return peer_missing


def run(n: int, repeats: int, wanted: list[str]) -> dict[str, Any]:
    """``{"stores": {label: {kind: [[samples of repeat 1], ...]}}, "raw": {label: what},
    "peer": {...}, "missing": [...]}`` (seconds)."""
    found, missing = stores(wanted)
    results: dict[str, dict[str, list[list[float]]]] = {
        s.label: {kind: [] for kind in KINDS} for s in found
    }
    peer: dict[str, list[list[float]]] = {"acquire": [], "extend": [], "release": []}
    peer_missing = ""
    try:
        for store in found:  # warm up: connections, scripts, the first statements
            for _ in range(min(50, n)):
                store.cycle()
                assert store.ping is not None
                if store.raw_renew is not None:
                    store.raw_renew()
                store.ping()
        for repeat in range(repeats):
            for store in list(found):
                try:
                    peer_missing = measure(store, results, peer, n, repeat) or peer_missing
                except Exception as exc:  # one store's failure costs only its numbers
                    missing.append(f"{store.label}: {type(exc).__name__}: {exc}"[:300])
                    results.pop(store.label, None)
                    found.remove(store)
                    store.close()
        for store in found:
            with contextlib.suppress(Exception):
                store.backend.flush_history(60)
    finally:
        for store in found:
            store.close()
    return {
        "n": n,
        "repeats": repeats,
        "stores": results,
        "raw": {s.label: s.raw_what for s in found},
        "peer": peer_missing or peer,
        "missing": missing,
    }
