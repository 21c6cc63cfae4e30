"""Clusters of real OS processes (``tests/procs/``) working on one store, for the tests
that start them: each child is a separate Python process that sets Django up on the very test
databases the test uses, works through ``DatabaseBackend(alias)`` or
``CacheBackend(cache_alias)`` and reports what it does as JSON lines on stdout (see
``tests/procs/common.py``). A :class:`Cluster` starts them, merges their reports into one
log in arrival order, and waits on it; the helpers below check leadership terms against each
other and against the store.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_leader.backends.base import Backend
from django_leader.backends.cache import CacheBackend
from django_leader.backends.db import DatabaseBackend
from django_leader.backends.zookeeper import ZooKeeperBackend
from django_leader.models import LeaseEvent
from tests.support import procfs
from tests.support.stores import CACHE_STORES, DATABASE_STORES, require, zookeeper_backend

ROOT = Path(__file__).resolve().parents[2]

TTL = 2.0
RENEW = 0.5
RETRY = 0.3
#: Liveness (docs/safety.md): a crashed holder's lease is taken within TTL + RETRY_INTERVAL
#: (plus 1 s for the new leader to report it on a loaded machine).
TAKEOVER_BOUND = TTL + RETRY + 1.0
#: Starting a child (Python + Django) and getting its first report.
STARTUP = 30.0
#: Any other wait for a child's report.
PATIENCE = 10.0

Event = dict[str, Any]
Predicate = Callable[[Event], bool]


def matches(ev: str, who: str | None = None, **fields: Any) -> Predicate:
    """A predicate for events of kind ``ev`` (from child ``who``) with these field values."""

    def predicate(event: Event) -> bool:
        return (
            event["ev"] == ev
            and (who is None or event["who"] == who)
            and all(event.get(key) == value for key, value in fields.items())
        )

    return predicate


def spawn(module: str, env: dict[str, str], stderr: Path | None = None) -> subprocess.Popen[str]:
    """Start ``python -m tests.procs.<module>`` in the project's root with ``env``: commands
    and reports as JSON lines on its stdin and stdout (text, line-buffered); its stderr to
    the file ``stderr``, else this process's."""
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("wb")) if stderr is not None else None
        return subprocess.Popen(
            [sys.executable, "-m", f"tests.procs.{module}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
        )


class Child:
    """One child process and the thread that reads its reports."""

    def __init__(self, cluster: Cluster, label: str, module: str, env: dict[str, str]) -> None:
        self.cluster = cluster
        self.label = label
        self.stderr_path = cluster.tmp_path / f"{label}.stderr"
        self.proc = spawn(module, env, self.stderr_path)
        self.pid = self.proc.pid
        #: The identity it campaigns as (``DL_MP_IDENTITY``).
        self.identity = env.get("DL_MP_IDENTITY", "")
        self.reader = threading.Thread(target=self._read, name=f"read-{label}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"ev": "noise", "line": line.rstrip("\n"), "t": time.time()}
            self.cluster._add(self.label, event)
        self.cluster._add(self.label, {"ev": "eof", "t": time.time()})

    def send(self, cmd: str, **fields: Any) -> int:
        """Send a command; returns the event-log position to wait for its reply after."""
        position = self.cluster.position()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        return position

    def request(self, cmd: str, reply: str, timeout: float = PATIENCE, **fields: Any) -> Event:
        after = self.send(cmd, **fields)
        return self.cluster.wait_for(
            matches(reply, self.label), f"{self.label}: {reply}", timeout, after=after
        )

    def state(self) -> str:
        """The process state letter from /proc (``T`` when stopped)."""
        return procfs.state(f"/proc/{self.pid}/stat")

    def kill(self) -> None:
        """SIGKILL (which also ends a stopped process) and reap."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=PATIENCE)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.reader.join(timeout=PATIENCE)

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """The children of one test, and the merged log of their reports in arrival order."""

    def __init__(self, store: Backend, tmp_path: Path) -> None:
        self.store = store
        self.is_cache = isinstance(store, CacheBackend)
        self.is_zookeeper = isinstance(store, ZooKeeperBackend)
        #: ``DL_MP_STORE``: how the children build the backend (tests/procs/common.py).
        self.kind = "cache" if self.is_cache else "zookeeper" if self.is_zookeeper else "database"
        #: Whether ``lease.fenced()`` fences database writes: every store (a database by
        #: its lease row, Redis and ZooKeeper by the fence row, docs/safety.md).
        self.fences = True
        #: Whether a name's first fencing token is seeded from the store's clock (a large
        #: number, not 1): Redis and ZooKeeper.
        self.clock_tokens = self.kind != "database"
        #: Whether history is written asynchronously, by a thread of the process that
        #: noticed the event (Redis, ZooKeeper), rather than in the lease's transaction.
        self.async_history = self.kind != "database"
        #: The store's alias: a database alias, a cache alias for Redis, the connection
        #: string (``hosts``) for ZooKeeper.
        self.alias: str = (
            store.conf.hosts  # type: ignore[attr-defined]
            if self.is_zookeeper
            else store.alias  # type: ignore[attr-defined]
        )
        #: Where rows go: fenced writes, and the history (for Redis and ZooKeeper, written
        #: asynchronously).
        assert store.history_database is not None, "these tests read the lease history"
        self.db_alias = self.alias if self.kind == "database" else store.history_database
        assert store.history_database == self.db_alias, (store, store.history_database)
        self.tmp_path = tmp_path
        # The test database pytest-django created for that alias (a file for SQLite).
        self.db_name = str(connections[self.db_alias].settings_dict["NAME"])
        self.lease = f"mp-{uuid.uuid4().hex[:10]}"
        self.children: dict[str, Child] = {}
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def spawn(self, label: str, module: str, **extra: str) -> Child:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="testproject.settings",
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            PYTHONUNBUFFERED="1",
            DL_MP_STORE=self.kind,
            DL_MP_ALIAS=self.alias,
            DL_MP_DB_ALIAS=self.db_alias,
            DL_MP_DB_NAME=self.db_name,
            # Every other database alias on its test database too (see tests/conftest.py).
            DJANGO_LEADER_TEST_DB_NAMES=json.dumps(
                {
                    alias: str(connections[alias].settings_dict["NAME"])
                    for alias in settings.DATABASES
                }
            ),
            DL_MP_IDENTITY=f"{label}-{uuid.uuid4().hex[:6]}",
            DL_MP_LEASE=self.lease,
            **extra,
        )
        if self.async_history:
            # CacheBackend and ZooKeeperBackend write their history to
            # DJANGO_LEADER["DATABASE"]: the same as here.
            env["DJANGO_LEADER_DATABASE"] = self.db_alias
        if self.is_zookeeper:
            # The children's ZooKeeperBackend: this ensemble and root (the settings' too,
            # for anything else in the child that asks for the ZooKeeper backend).
            root = self.store.root  # type: ignore[attr-defined]
            env.update(
                DL_MP_ZOOKEEPER_ROOT=root,
                DJANGO_LEADER_ZOOKEEPER_HOSTS=self.alias,
                DJANGO_LEADER_ZOOKEEPER_ROOT=root,
            )
        child = Child(self, label, module, env)
        self.children[label] = child
        return child

    def spawn_candidate(
        self,
        label: str,
        *,
        ttl: float = TTL,
        renew: float = RENEW,
        retry: float = RETRY,
        **extra: str,
    ) -> Child:
        """Start an Elector candidate (``tests/procs/candidate.py``) with this timing and
        the ``DL_MP_*`` variables in ``extra``; not waited for (see :meth:`wait_ready`)."""
        timing = {
            "DL_MP_TTL": str(ttl),
            "DL_MP_RENEW": str(renew),
            "DL_MP_RETRY": str(retry),
            # The same timing in the settings, which bound each store call of the backend.
            "DJANGO_LEADER_TTL": str(ttl),
            "DJANGO_LEADER_RENEW": str(renew),
            "DJANGO_LEADER_RETRY": str(retry),
        }
        return self.spawn(label, "candidate", **timing, **extra)

    def wait_ready(self, children: list[Child]) -> None:
        """Wait until each of ``children`` reports ``ready``."""
        for child in children:
            self.wait_for(matches("ready", child.label), f"{child.label} ready", STARTUP)

    def candidates(
        self,
        *labels: str,
        ttl: float = TTL,
        renew: float = RENEW,
        retry: float = RETRY,
        **extra: str,
    ) -> list[Child]:
        """Start Elector candidates (all at once) and wait until each campaigns."""
        children = [
            self.spawn_candidate(label, ttl=ttl, renew=renew, retry=retry, **extra)
            for label in labels
        ]
        self.wait_ready(children)
        return children

    def _add(self, label: str, event: Event) -> None:
        with self._cond:
            event["who"] = label
            self.events.append(event)
            self._cond.notify_all()

    def position(self) -> int:
        with self._cond:
            return len(self.events)

    def select(self, predicate: Predicate) -> list[Event]:
        with self._cond:
            return [event for event in self.events if predicate(event)]

    def wait_for(
        self, predicate: Predicate, what: str, timeout: float = PATIENCE, after: int = 0
    ) -> Event:
        """The first event from position ``after`` on that satisfies ``predicate``."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[after:]:
                    if event["ev"] == "fatal":
                        pytest.fail(f"{event['who']} failed: {event}\n{self.describe()}")
                    if predicate(event):
                        return event
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    pytest.fail(f"no {what} within {timeout:.1f}s\n{self.describe()}")
                self._cond.wait(remaining)

    def describe(self) -> str:
        """The recent reports and each child's log, for failure messages."""
        with self._cond:
            recent = self.events[-60:]
        lines = ["events:"] + [f"  {json.dumps(event, default=str)}" for event in recent]
        for child in self.children.values():
            lines.append(f"{child.label} (pid {child.pid}, exit {child.proc.poll()}) stderr:")
            lines.append(child.stderr_tail())
        lines.extend(file_locks(self.db_name))
        return "\n".join(lines)

    def kill_all(self) -> None:
        for child in self.children.values():
            child.kill()

    def history(self, name: str, *flush: Child) -> list[tuple[str, str, int]]:
        """``(kind, holder, token)`` of every history event of ``name``, oldest first.

        On Redis and ZooKeeper, each process writes its history asynchronously: the
        children in ``flush`` (and the parent) write theirs before the database is read. A
        database store writes it in the lease's own transaction, so the row order is the
        order of events; the asynchronous writers can insert rows out of order, so there the
        events are ordered by their time on the store's server (then id).
        """
        for child in flush:
            assert child.request("flush", "flushed")["ok"], f"{child.label}: history not flushed"
        assert self.store.flush_history(PATIENCE), "the parent's history not flushed"
        order = ("at", "id") if self.async_history else ("id",)
        return list(
            LeaseEvent.objects.using(self.db_alias)
            .filter(name=name)
            .order_by(*order)
            .values_list("kind", "holder", "token")
        )

    def forget(self) -> None:
        """Remove this test's keys from Redis (a lease's meta key never expires), or its
        names' znodes from ZooKeeper (a name's record is persistent)."""
        if self.is_zookeeper:
            store: Any = self.store
            for name in store.names():
                if name.startswith(self.lease):
                    store.client.delete(store._name_path(name), recursive=True)
        if self.is_cache:
            client = self.store.client  # type: ignore[attr-defined]
            keys = list(client.scan_iter(match=f"*django_leader:{{{self.lease}*", count=500))
            if keys:
                client.delete(*keys)


#: pytest id -> (kind, alias) of every store under test: each database, Redis through both
#: cache clients, and ZooKeeper (the tests' ensemble and root: tests/support/stores.py).
STORES = {
    **{key: ("database", alias) for key, alias in DATABASE_STORES.items()},
    **{key: ("cache", alias) for key, alias in CACHE_STORES.items()},
    "zookeeper": ("zookeeper", ""),
}


def open_store(store_id: str, **zookeeper: Any) -> Iterator[Backend]:
    """The parent's own view of store ``store_id`` (a key of :data:`STORES`; the children
    build the same backend), skipped (or failed, in CI) when unavailable. For a fixture.
    ``zookeeper``: ZooKeeperBackend arguments (``hosts`` of a private server...)."""
    kind, alias = STORES[store_id]
    if kind == "zookeeper":
        store = zookeeper_backend(**zookeeper)
        yield store
        store.flush_history(PATIENCE)
        store.shutdown()
        return
    require(alias, kind=kind)
    backend: Backend = DatabaseBackend(alias) if kind == "database" else CacheBackend(alias)
    yield backend
    backend.flush_history(PATIENCE)  # before pytest-django flushes the history table
    backend.close()


def open_cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on ``store``, its children killed and its Redis keys removed after. For a
    fixture."""
    group = Cluster(store, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()  # before pytest-django flushes the tables the children use
        group.forget()


# -- leadership terms --------------------------------------------------------------------
@dataclass
class Term:
    """When a process believed it led, with one token: a conservative interval.

    ``start`` is the store's ``acquired_at`` (before the process could know it won);
    ``end`` the earlier of the instant ``lease.lost`` was reported and the local deadline at
    that moment (``lease.held`` is false from either on), or the instant the process was
    killed. Both stamps are upper bounds of the true end.
    """

    who: str
    token: int
    start: float
    end: float = math.inf


def leadership_terms(events: list[Event], killed: dict[str, float]) -> list[Term]:
    terms: dict[tuple[str, int], Term] = {}
    for event in events:
        if event["ev"] == "elected":
            key = (event["who"], event["token"])
            assert key not in terms, f"elected twice with one token: {event}"
            terms[key] = Term(event["who"], event["token"], event["acquired_at"])
    for event in events:
        if event["ev"] == "lost":
            term = terms[(event["who"], event["token"])]
            term.end = min(event["t"], event["deadline_wall"])
    for term in terms.values():
        if term.who in killed:
            term.end = min(term.end, killed[term.who])
    return sorted(terms.values(), key=lambda term: term.start)


def assert_no_overlap(cluster: Cluster, killed: dict[str, float] | None = None) -> list[Term]:
    """No two processes believed they led at the same instant; tokens grow with time."""
    terms = leadership_terms(cluster.select(lambda event: True), killed or {})
    assert terms, "nobody was ever elected"
    for before, after in itertools.pairwise(terms):
        assert before.end < after.start, (
            f"overlapping leadership: {before} and {after}\n{cluster.describe()}"
        )
        assert after.token > before.token, f"token went back: {before} then {after}"
    return terms


def report(request: pytest.FixtureRequest, **measured: float) -> None:
    """Make the measured times visible (``-rP``) and keep them in the JUnit properties."""
    for key, value in measured.items():
        request.node.user_properties.append((key, round(value, 3)))
    print(f"{request.node.name}: " + ", ".join(f"{k}={v:.3f}s" for k, v in measured.items()))


def leader_among(cluster: Cluster, children: list[Child], store: Backend) -> Child:
    """Ask everyone: exactly one of ``children`` leads, and the store and all agree on it."""
    replies = {child.label: child.request("status", "status") for child in children}
    leaders = [label for label, reply in replies.items() if reply["is_leader"]]
    assert len(leaders) == 1, f"leaders: {leaders}\n{replies}"
    leader = cluster.children[leaders[0]]
    current = store.read(cluster.lease)
    assert current is not None, "the store says nobody leads"
    assert current.token == replies[leader.label]["token"], (current, replies)
    assert current.holder.startswith(f"{leader.label}-"), (current, replies)
    for reply in replies.values():
        assert (reply["store_holder"], reply["store_token"]) == (current.holder, current.token)
    return leader


def wait_renewals(cluster: Cluster, who: str, token: int, count: int) -> Event:
    """Wait until ``who`` has renewed lease ``token`` ``count`` times; the last renewal."""
    for _ in range(count):
        after = cluster.position()
        event = cluster.wait_for(
            matches("deadline", who, token=token), f"a renewal by {who}", PATIENCE, after=after
        )
    return event


def file_locks(path: str) -> list[str]:
    """Who holds POSIX locks on the file ``path`` (a SQLite database's locks), from
    /proc/locks: a writer stopped with its lock keeps everyone else out."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks") as table:
            held = [line.strip() for line in table if f":{inode} " in line]
    except OSError:
        return []
    return [f"locks on {path} (/proc/locks):", *(f"  {line}" for line in held)] if held else []
