"""A replicated PostgreSQL of the tests: a primary and a streaming standby, private clusters
(``initdb``, ``pg_basebackup``, ``pg_ctl``) on free loopback ports, run as the user
``postgres`` when we are root. Never the machine's shared server.

Faults: :meth:`PgTopology.stall_replication` (the primary's WAL sender frozen with
SIGSTOP: commits on an asynchronous primary go on, the standby misses them),
:meth:`kill_primary` (SIGKILL of every process of the primary) and :meth:`promote` (the
standby takes over, on a new timeline), what Patroni and its peers do on a failover.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tests.chaos.stores import PostgreSQLStore, _as_user, _run, free_port, server_dir

TIMEOUT = 60.0


def unavailable() -> str | None:
    """Why a topology cannot run here, or None."""
    return PostgreSQLStore.unavailable()


class Cluster:
    """One PostgreSQL data directory and its server."""

    def __init__(self, base: Path, name: str) -> None:
        self.port = free_port()
        self.data = base / name
        self.log = base / f"{name}.log"
        self.base = base

    def pg(self, tool: str, *args: str) -> None:
        _run([*_as_user("postgres"), f"{PostgreSQLStore.bindir()}/{tool}", *args], cwd="/")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
        self.pg("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w",
                "-t", "60", "start")  # fmt: skip

    def connect(self, database: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname=database, connect_timeout=2, autocommit=True,
                               options="-c statement_timeout=30000")  # fmt: skip

    def query(self, sql: str, database: str = "postgres") -> list[tuple[Any, ...]]:
        with self.connect(database) as db:
            found = db.execute(sql)
            return found.fetchall() if found.description else []

    def pids(self) -> list[int]:
        """The postmaster and every process it started."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
        return [postmaster, *children]

    def kill(self) -> None:
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        give_up = time.monotonic() + TIMEOUT
        while any(os.path.exists(f"/proc/{pid}") for pid in pids):
            if time.monotonic() > give_up:
                raise RuntimeError("the primary's processes did not die")
            time.sleep(0.05)
        (self.data / "postmaster.pid").unlink(missing_ok=True)


class PgTopology:
    """A primary and one streaming standby; ``synchronous``: commits wait for it."""

    def __init__(
        self, workdir: Path, *, synchronous: bool = False, database: str = "leases"
    ) -> None:
        self.base = server_dir("pgrepl", "postgres")
        self.primary = Cluster(self.base, "primary")
        self.standby = Cluster(self.base, "standby")
        self.synchronous = synchronous
        self.database = database
        self._stalled: int | None = None

    def start(self) -> None:
        self.primary.pg("initdb", "-D", str(self.primary.data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync")  # fmt: skip
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.write("fsync = off\nwal_level = replica\nmax_wal_senders = 5\n"
                       "hot_standby = on\nwal_log_hints = on\nmax_connections = 100\n")  # fmt: skip
        self.primary.start()
        self.primary.query(f"CREATE DATABASE {self.database}")
        self.standby.pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
                        "-U", "postgres", "-D", str(self.standby.data), "-R", "-X", "stream",
                        "-c", "fast")  # fmt: skip
        self.standby.start()
        self.await_streaming()
        self._synchronous_commit()

    def _synchronous_commit(self) -> None:
        """Make the primary's commits wait for the standby (if :attr:`synchronous`); only
        once it streams, else every commit waits. Again after each failover: the promoted
        standby has its own configuration."""
        if self.synchronous:
            self.primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.query("SELECT pg_reload_conf()")

    def await_streaming(self) -> None:
        give_up = time.monotonic() + TIMEOUT
        while not self.primary.query("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"):
            if time.monotonic() > give_up:
                raise RuntimeError("the standby never streamed")
            time.sleep(0.05)

    def settings(self, base: dict[str, Any]) -> dict[str, Any]:
        """Django's settings of a database on this topology: libpq multi-host, whichever
        server is the primary (``target_session_attrs=read-write``)."""
        return {
            **base,
            "HOST": "127.0.0.1,127.0.0.1",
            "PORT": f"{self.primary.port},{self.standby.port}",
            "NAME": self.database,
            "USER": "postgres",
            "PASSWORD": "",
            "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 2},
            "TEST": {**base.get("TEST", {}), "NAME": self.database},
        }

    # -- faults -----------------------------------------------------------------------------
    def stall_replication(self) -> None:
        """Freeze the primary's WAL sender: the standby hears of nothing committed after."""
        [(pid,)] = self.primary.query("SELECT pid FROM pg_stat_replication")
        os.kill(int(pid), signal.SIGSTOP)
        self._stalled = int(pid)

    def kill_primary(self) -> None:
        self.primary.kill()

    def promote(self) -> None:
        self.standby.pg("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        give_up = time.monotonic() + TIMEOUT
        while self.standby.query("SELECT pg_is_in_recovery()") != [(False,)]:
            if time.monotonic() > give_up:
                raise RuntimeError("the standby was not promoted")
            time.sleep(0.05)

    def rebuild_old_primary(self) -> None:
        """After :meth:`promote`: the killed primary made again, from a base backup of the
        new one, as its standby; the roles swap."""
        old, new = self.primary, self.standby
        shutil.rmtree(old.data, ignore_errors=True)
        old.pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(new.port), "-U", "postgres",
               "-D", str(old.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        old.start()
        self.primary, self.standby = new, old
        self.await_streaming()
        self._synchronous_commit()

    def stop(self) -> None:
        for cluster in (self.primary, self.standby):
            cluster.kill()
        shutil.rmtree(self.base, ignore_errors=True)
