"""Replicated stores of a chaos run, with failovers as the nemesis (SPEC rule 9):

* ``redis-sentinel``: a primary, two replicas and three Sentinels
  (tests/support/redis_topology.py); the candidates use django-redis's ``SentinelClient``
  with ``REDIS_WAIT_REPLICAS = 1`` (``CHAOS_SENTINEL_WAIT=0`` in the environment: none).
  Faults: the primary killed (then back as a replica), frozen past the Sentinels'
  ``down-after`` and thawed (the split brain), a switchover, and the replicas frozen just
  before the primary is killed (the worst case: writes the promoted replica never saw).
* ``redis-cluster``: three masters with a replica each (tests/support/redis_cluster.py);
  the candidates use ``RedisClusterCache`` with ``REDIS_WAIT_REPLICAS = 1``
  (``CHAOS_CLUSTER_WAIT=0``: none). Each fault hits the master serving the lease's slot:
  killed (then back as its replica), frozen until its replica took over and thawed, failed
  over by hand (``CLUSTER FAILOVER``), and killed after its replica was frozen and cut off
  (the worst case).
* ``postgresql-pgbouncer``: ``postgresql-sync`` behind a PgBouncer in transaction pooling
  (tests/support/pgbouncer.py), which the candidates reach instead of the servers. Faults:
  the failover above, after which the pooler is pointed at the new primary (its
  configuration reloaded, as a failover tool does), and the pooler itself killed
  (SIGKILL) and started again.
* ``postgresql-standby`` / ``postgresql-sync``: a primary and a streaming standby,
  asynchronous or synchronous (tests/support/pg_topology.py); the candidates reach them
  with libpq multi-host (``target_session_attrs=read-write``). Faults: the primary killed
  and the standby promoted (the old primary comes back as the new one's standby), and the
  same with the WAL sender frozen just before (the standby misses the last commits).

Each failover is lossy for the liveness bound (the backend starts the lock-delay), and its
``ready`` is when the new primary answers, its replicas caught up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from random import Random
from typing import Any

from tests.chaos.stores import ROWS, Injected, Store, clock


class SentinelStore(Store):
    name = "redis-sentinel"
    faults = ("sentinel-kill", "sentinel-freeze", "sentinel-switchover", "sentinel-lag-kill")
    fenced = False
    networked = False

    def __init__(self, workdir: Path, ttl: float) -> None:
        from tests.support.redis_topology import SentinelTopology

        super().__init__(workdir, ttl)
        self.topology = SentinelTopology(workdir / "redis")
        self.history = workdir / "history.sqlite3"
        #: REDIS_WAIT_REPLICAS of the candidates: 1, or CHAOS_SENTINEL_WAIT of the run's
        #: environment (0 shows what a failover does without durable writes).
        self.wait_replicas = os.environ.get("CHAOS_SENTINEL_WAIT", "1")

    @classmethod
    def unavailable(cls) -> str | None:
        from tests.support.redis_topology import unavailable

        reason = unavailable()
        if reason is None:
            try:
                import django_redis  # noqa: F401
            except ImportError:
                reason = "the Python package 'django-redis' is not installed"
        return None if reason is None else f"redis-sentinel: {reason}"

    def start(self) -> None:
        self.topology.start()

    def env(self) -> dict[str, str]:
        sentinels = ",".join(f"{h}:{p}" for h, p in self.topology.sentinel_addresses)
        return {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.replicated_settings",
            "CHAOS_SENTINELS": sentinels,
            "CHAOS_SENTINEL_SERVICE": self.topology.service,
            "CHAOS_REDIS_WAIT": self.wait_replicas,
            "DATABASE_URL": f"sqlite:///{self.history}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.redis.RedisBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def _settle(self) -> None:
        """Wait until the Sentinels agree on one primary, with no failover running, and it
        has every other node back as a replica."""
        t = self.topology
        t.await_settled()
        t.await_replicas(t.primary_port(), len(t.nodes) - 1)
        t.await_settled()

    def inject(self, kind: str, rng: Random) -> Injected:
        t = self.topology
        start = clock()
        if kind == "sentinel-switchover":
            t.switchover()
        elif kind == "sentinel-freeze":
            old = t.primary()
            t.freeze(old)
            t.await_failover(old.port)
            t.thaw(old)  # back as a primary until the Sentinels demote it
        elif kind in ("sentinel-kill", "sentinel-lag-kill"):
            old = t.primary()
            replicas = [node for node in t.nodes if node is not old]
            if kind == "sentinel-lag-kill":
                for node in replicas:
                    t.freeze(node)
                time.sleep(rng.uniform(0.1, 0.5) * self.ttl)
            old.kill()
            for node in replicas:
                t.thaw(node)
            t.await_failover(old.port)
            t.restart(old)
        else:
            raise ValueError(kind)
        self._settle()
        return Injected(start, clock(), lossy=True, detail=f"primary now {t.primary_port()}")

    def stop(self) -> None:
        self.topology.stop()


class ClusterStore(Store):
    name = "redis-cluster"
    faults = ("cluster-kill", "cluster-freeze", "cluster-failover", "cluster-lag-kill")
    fenced = False
    networked = False

    def __init__(self, workdir: Path, ttl: float) -> None:
        from tests.support.redis_cluster import ClusterTopology

        super().__init__(workdir, ttl)
        self.topology = ClusterTopology(workdir / "cluster")
        self.history = workdir / "history.sqlite3"
        #: REDIS_WAIT_REPLICAS of the candidates: 1, or CHAOS_CLUSTER_WAIT of the run's
        #: environment (0 shows what a failover does without durable writes).
        self.wait_replicas = os.environ.get("CHAOS_CLUSTER_WAIT", "1")

    @classmethod
    def unavailable(cls) -> str | None:
        from tests.support.redis_cluster import unavailable

        reason = unavailable()
        return None if reason is None else f"redis-cluster: {reason}"

    def start(self) -> None:
        self.topology.start()

    def env(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.replicated_settings",
            "CHAOS_CLUSTER": ",".join(self.topology.startup_nodes),
            "CHAOS_REDIS_WAIT": self.wait_replicas,
            "DATABASE_URL": f"sqlite:///{self.history}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.redis.RedisBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def inject(self, kind: str, rng: Random) -> Injected:
        from tests.chaos.harness import LEASE

        t, key = self.topology, f"django_leader:{{{LEASE}}}:lease"
        start = clock()
        old = t.master_of(key)
        if kind == "cluster-failover":
            t.manual_failover(old, key)
        elif kind == "cluster-freeze":
            t.freeze(old)
            t.await_promoted(old, key)
            t.thaw(old)  # believes it serves the slot until the cluster tells it
        elif kind in ("cluster-kill", "cluster-lag-kill"):
            replica = t.replica_of(old)
            if kind == "cluster-lag-kill":
                t.freeze(replica)
                with contextlib.suppress(Exception):  # its link cut: nothing more arrives
                    old.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
                time.sleep(rng.uniform(0.1, 0.5) * self.ttl)
            t.kill(old)
            t.thaw(replica)
            t.await_promoted(old, key)
            t.restart(old)
        else:
            raise ValueError(kind)
        t.await_healthy()
        new = t.master_of(key)
        return Injected(start, clock(), lossy=True, detail=f"slot master now {new.port}")

    def stop(self) -> None:
        self.topology.stop()


class StandbyStore(Store):
    """PostgreSQL primary + streaming standby; :attr:`synchronous` for the sync variant."""

    name = "postgresql-standby"
    faults = ("pg-failover", "pg-lag-failover")
    networked = False
    synchronous = False
    #: An asynchronous standby promoted loses the primary's last commits, the candidates'
    #: fenced writes among them (PostgreSQL's contract, not the lease's): not a violation.
    loses_writes = True

    def __init__(self, workdir: Path, ttl: float) -> None:
        from tests.support.pg_topology import PgTopology

        super().__init__(workdir, ttl)
        self.topology = PgTopology(workdir, synchronous=self.synchronous, database="chaos")

    @classmethod
    def unavailable(cls) -> str | None:
        from tests.support.pg_topology import unavailable

        reason = unavailable()
        return None if reason is None else f"{cls.name}: {reason}"

    def start(self) -> None:
        self.topology.start()

    def env(self) -> dict[str, str]:
        t = self.topology
        return {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.replicated_settings",
            "CHAOS_PG_PORTS": f"{t.primary.port},{t.standby.port}",
            "CHAOS_PG_DATABASE": t.database,
            "DJANGO_LEADER_BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def inject(self, kind: str, rng: Random) -> Injected:
        t = self.topology
        start = clock()
        if kind == "pg-lag-failover":
            t.stall_replication()
            time.sleep(rng.uniform(0.1, 0.5) * self.ttl)
        elif kind != "pg-failover":
            raise ValueError(kind)
        t.kill_primary()
        t.promote()
        self.promoted()
        t.rebuild_old_primary()
        return Injected(start, clock(), lossy=True, detail=f"primary now {t.primary.port}")

    def promoted(self) -> None:
        """Called once the standby is promoted, before the old primary is rebuilt."""

    def rows(self) -> list[dict[str, Any]]:
        with self.topology.primary.connect(self.topology.database) as db:
            return [self._row(row) for row in db.execute(ROWS).fetchall()]

    def stop(self) -> None:
        self.topology.stop()

    def remove(self) -> None:
        shutil.rmtree(self.topology.base, ignore_errors=True)


class SyncStandbyStore(StandbyStore):
    name = "postgresql-sync"
    synchronous = True
    loses_writes = False


class PooledStore(SyncStandbyStore):
    name = "postgresql-pgbouncer"
    faults = ("pg-failover", "pgbouncer-crash")

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.bouncer: Any = None

    @classmethod
    def unavailable(cls) -> str | None:
        from tests.support.pgbouncer import unavailable

        return super().unavailable() or unavailable()

    def start(self) -> None:
        from tests.support.pgbouncer import PgBouncer

        super().start()
        self.bouncer = PgBouncer("127.0.0.1", self.topology.primary.port)
        self.bouncer.start()

    def env(self) -> dict[str, str]:
        return {**super().env(), "CHAOS_PG_BOUNCER": str(self.bouncer.port)}

    def inject(self, kind: str, rng: Random) -> Injected:
        if kind == "pgbouncer-crash":
            start = clock()
            self.bouncer.crash()
            time.sleep(rng.uniform(0.1, 0.5) * self.ttl)
            self.bouncer.start()
            return Injected(start, clock(), lossy=False, detail="pooler restarted")
        return super().inject(kind, rng)

    def promoted(self) -> None:
        # What a failover tool does next: the pooler pointed at the new primary.
        self.bouncer.retarget("127.0.0.1", self.topology.standby.port)

    def stop(self) -> None:
        if self.bouncer is not None:
            self.bouncer.stop()
        super().stop()
