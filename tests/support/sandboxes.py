"""Stores of one test's own, for child processes that hold many leases: a store that only
that test's processes use, so that the servers can count what those processes cost
(connections, queries), and so that a process that opens one connection per lease cannot
take the shared servers' connections from everything else running on this machine.

* SQLite: a database file of its own.
* PostgreSQL: a database and a login role of their own on the machine's server; the role
  has a ``CONNECTION LIMIT`` (:data:`CONNECTION_LIMIT`), so a process that opens a
  connection per lease is refused ("too many connections for role") instead of exhausting
  the server's ``max_connections``. Its connections and transactions are counted from
  ``pg_stat_activity`` and ``pg_stat_database``.
* MariaDB: a database and a user with ``MAX_USER_CONNECTIONS`` (same reason).
* Redis: a private ``redis-server`` (CLIENT LIST and INFO commandstats count only the test's
  processes).
* ZooKeeper: the machine's ensemble, under a root of its own.

The lease history of Redis and ZooKeeper goes to a SQLite file of the sandbox's own. Each
sandbox is migrated by ``manage.py migrate`` run in a process of the sandbox's environment:
nothing here touches the databases pytest-django made for the parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from testproject.services import DEFAULT_URLS, UNAVAILABLE
from tests.support.ports import free_port
from tests.support.redis_server import answers_ping
from tests.support.stores import forget_zookeeper_root, require_zookeeper, unavailable

ROOT = Path(__file__).resolve().parents[2]

#: The most connections a sandbox's PostgreSQL role or MariaDB user may hold at once.
CONNECTION_LIMIT = 12

#: Seconds to wait for a migration, a server start.
SETUP_TIMEOUT = 120.0

#: The client name of this process's connections to a private Redis (not counted).
COUNTER_NAME = "sandbox-counter"

STORE_IDS = ["sqlite", "postgresql", "mysql", "redis", "zookeeper"]


class Sandbox:
    """One store of a test's own; :attr:`env` is the environment of a process that uses it
    (``tests/procs/common.py``'s ``DL_MP_*`` and the test project's ``DJANGO_LEADER_*``)."""

    store_id: str

    def __init__(self, store_id: str, tmp_path: Path, timing: dict[str, float]) -> None:
        if store_id not in STORE_IDS:
            raise ValueError(store_id)
        self.store_id = store_id
        self.tmp_path = tmp_path
        self.tag = f"dlsess{uuid.uuid4().hex[:10]}"
        self.sqlite = str(tmp_path / f"{self.tag}.sqlite3")
        self._cleanup: list[Callable[[], None]] = []
        self.pg: dict[str, str] | None = None
        self.redis_port: int | None = None
        self._counter: Any = None
        #: Commands this process sent to the private Redis (each is one reply), one at a
        #: time (so its client keeps one connection).
        self._own = 0
        self._own_lock = threading.RLock()
        self.env: dict[str, str] = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_LEADER_TTL": str(timing["ttl"]),
            "DJANGO_LEADER_RENEW": str(timing["renew"]),
            "DJANGO_LEADER_RETRY": str(timing["retry"]),
            "DJANGO_LEADER_LOG_LEVEL": "WARNING",
        }

    def setup(self) -> None:
        """Make the store (a database and its role, a server, a root) and migrate it; what
        it made is removed by :meth:`close`, even if this fails half-way."""
        store_id = self.store_id
        names = {"default": self.sqlite}
        if store_id == "postgresql":
            self._postgresql(names)
        elif store_id == "mysql":
            self._mysql(names)
        elif store_id == "redis":
            self._redis()
        elif store_id == "zookeeper":
            self._zookeeper()
        else:
            self.env.update(
                DL_MP_STORE="database",
                DL_MP_ALIAS="default",
                DL_MP_DB_NAME=self.sqlite,
                DJANGO_LEADER_BACKEND="django_leader.backends.db.DatabaseBackend",
                DJANGO_LEADER_DATABASE="default",
            )
        if store_id in ("redis", "zookeeper"):
            # The history of a cache or ZooKeeper store goes to a database: this SQLite file.
            self.env.update(
                DL_MP_DB_ALIAS="default",
                DL_MP_DB_NAME=self.sqlite,
                DJANGO_LEADER_DATABASE="default",
            )
        self.env["DJANGO_LEADER_TEST_DB_NAMES"] = json.dumps(names)
        self._migrate("default")
        if store_id in ("postgresql", "mysql"):
            self._migrate(store_id)

    # -- set-up ---------------------------------------------------------------------------
    def _server_url(self, alias: str) -> Any:
        from urllib.parse import urlparse

        if alias not in settings.DATABASES:
            unavailable(UNAVAILABLE.get(alias, f"{alias}: not configured"))
        url = os.environ.get(f"DJANGO_LEADER_{alias.upper()}_URL", DEFAULT_URLS[alias])
        return urlparse(url)

    def _postgresql(self, names: dict[str, str]) -> None:
        url = self._server_url("postgresql")
        self.pg = {
            "host": url.hostname or "127.0.0.1",
            "port": str(url.port or 5432),
            "user": url.username or "postgres",
            "password": url.password or "",
        }
        with self.admin() as cursor:
            cursor.execute(f"CREATE ROLE {self.tag} LOGIN CONNECTION LIMIT {CONNECTION_LIMIT}")
            self._cleanup.append(self._drop_postgresql)
            cursor.execute(f"CREATE DATABASE {self.tag} OWNER {self.tag}")
        self.env.update(
            DJANGO_LEADER_POSTGRESQL_URL=(
                f"postgres://{self.tag}@{self.pg['host']}:{self.pg['port']}/{self.tag}"
            ),
            DL_MP_STORE="database",
            DL_MP_ALIAS="postgresql",
            DL_MP_DB_NAME=self.tag,
            DJANGO_LEADER_BACKEND="django_leader.backends.db.DatabaseBackend",
            DJANGO_LEADER_DATABASE="postgresql",
        )
        names["postgresql"] = self.tag

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        """A cursor of the server's administrator (autocommit), on database ``postgres``."""
        import psycopg

        assert self.pg is not None
        with (
            psycopg.connect(
                host=self.pg["host"],
                port=self.pg["port"],
                user=self.pg["user"],
                password=self.pg["password"] or None,
                dbname="postgres",
                autocommit=True,
            ) as connection,
            connection.cursor() as cursor,
        ):
            yield cursor

    def _drop_postgresql(self) -> None:
        with self.admin() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {self.tag} WITH (FORCE)")
            cursor.execute(f"DROP ROLE IF EXISTS {self.tag}")

    def _mysql(self, names: dict[str, str]) -> None:
        import MySQLdb

        url = self._server_url("mysql")
        admin = {
            "host": url.hostname or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "root",
            "password": url.password or "",
        }

        def run(*statements: str) -> None:
            connection = MySQLdb.connect(**admin)
            try:
                cursor = connection.cursor()
                for statement in statements:
                    cursor.execute(statement)
            finally:
                connection.close()

        run(
            f"CREATE USER '{self.tag}'@'%' WITH MAX_USER_CONNECTIONS {CONNECTION_LIMIT}",
            f"CREATE DATABASE {self.tag} CHARACTER SET utf8mb4",
        )
        self._cleanup.append(
            lambda: run(
                f"DROP DATABASE IF EXISTS {self.tag}", f"DROP USER IF EXISTS '{self.tag}'@'%'"
            )
        )
        run(f"GRANT ALL PRIVILEGES ON {self.tag}.* TO '{self.tag}'@'%'")
        self.env.update(
            DJANGO_LEADER_MYSQL_URL=f"mysql://{self.tag}@{admin['host']}:{admin['port']}/{self.tag}",
            DL_MP_STORE="database",
            DL_MP_ALIAS="mysql",
            DL_MP_DB_NAME=self.tag,
            DJANGO_LEADER_BACKEND="django_leader.backends.db.DatabaseBackend",
            DJANGO_LEADER_DATABASE="mysql",
        )
        names["mysql"] = self.tag

    def _redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis: redis-server is not installed")
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp_path)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

        def stop() -> None:
            proc.kill()
            proc.wait()

        self._cleanup.append(stop)
        give_up = time.monotonic() + SETUP_TIMEOUT
        while not answers_ping(port):
            if proc.poll() is not None or time.monotonic() > give_up:
                raise AssertionError(f"the private redis-server did not start (exit {proc.poll()})")
            time.sleep(0.05)
        self.redis_port = port
        self.env.update(
            REDIS_URL=f"redis://127.0.0.1:{port}/0",
            DL_MP_STORE="cache",
            DL_MP_ALIAS="redis",
            DJANGO_LEADER_BACKEND="django_leader.backends.cache.CacheBackend",
            DJANGO_LEADER_CACHE="redis",
        )

    def _zookeeper(self) -> None:
        hosts = require_zookeeper()["HOSTS"]
        root = f"/{self.tag}"
        self._cleanup.append(lambda: forget_zookeeper_root(root))
        self.env.update(
            DL_MP_STORE="zookeeper",
            DL_MP_ALIAS=hosts,
            DL_MP_ZOOKEEPER_ROOT=root,
            DJANGO_LEADER_BACKEND="django_leader.backends.zookeeper.ZooKeeperBackend",
            DJANGO_LEADER_ZOOKEEPER_HOSTS=hosts,
            DJANGO_LEADER_ZOOKEEPER_ROOT=root,
        )

    def _migrate(self, alias: str) -> None:
        env = {k: v for k, v in self.env.items() if not k.startswith("DL_MP_")}
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--database", alias, "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT,
        )
        assert done.returncode == 0, f"migrate {alias} of {self.store_id}: {done.stderr[-3000:]}"

    def close(self) -> None:
        for step in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                step()

    # -- what the server counts -----------------------------------------------------------
    def connections(self) -> int:
        """The client connections the sandbox's processes hold now, counted by the server
        (PostgreSQL and Redis only; the caller's own connection left out)."""
        if self.store_id == "postgresql":
            with self.admin() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend'",
                    [self.tag],
                )
                return int(cursor.fetchone()[0])
        if self.store_id == "redis":
            return sum(1 for c in self._ask("client_list") if c["name"] != COUNTER_NAME)
        raise NotImplementedError(self.store_id)

    def requests(self) -> int:
        """A server-side count of the sandbox's processes' round trips so far.

        Redis: the replies the server wrote to clients (``total_writes_processed`` of INFO
        stats: one per request, or per pipelined batch of requests, that a client sent and
        waited for), less those to this process's own commands (:meth:`connections`, this
        one). Not INFO commandstats, which counts each command a script runs too: one
        EVALSHA that renews many leases is one round trip.

        PostgreSQL: the transactions of the sandbox's database (``xact_commit +
        xact_rollback`` of ``pg_stat_database``): a statement outside a transaction is
        one, a transaction of several statements counts once — so, if anything, fewer
        than its round trips. PostgreSQL publishes a backend's counts when it goes idle,
        at most once a second, and within 10 s for a backend that stays idle
        (``PGSTAT_IDLE_INTERVAL``)."""
        if self.store_id == "postgresql":
            with self.admin() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                    [self.tag],
                )
                return int(cursor.fetchone()[0])
        if self.store_id == "redis":
            with self._own_lock:
                # INFO counts the replies written before its own.
                own = self._own
                writes = int(self._ask("info", "stats")["total_writes_processed"])
            return writes - own
        raise NotImplementedError(self.store_id)

    def _ask(self, command: str, *args: Any) -> Any:
        """A command on this process's client of the private Redis, counted as its own."""
        with self._own_lock:  # one at a time: the client keeps one connection
            self._own += 1
            return getattr(self.redis(), command)(*args)

    def redis(self) -> Any:
        """This process's client of the private Redis: its connections are named
        :data:`COUNTER_NAME`, and not counted."""
        import redis

        assert self.redis_port is not None
        if self._counter is None:
            self._counter = redis.Redis(
                host="127.0.0.1", port=self.redis_port, socket_timeout=10, client_name=COUNTER_NAME
            )
            self._cleanup.append(self._counter.close)
        return self._counter


def open_sandbox(store_id: str, tmp_path: Path, timing: dict[str, float]) -> Iterator[Sandbox]:
    """A sandbox of ``store_id`` (skipped, or in CI failed, when its server is unavailable),
    removed after. For a fixture."""
    sandbox = Sandbox(store_id, tmp_path, timing)
    try:
        sandbox.setup()
        yield sandbox
    finally:
        sandbox.close()
