"""Real ``celery worker`` and ``celery beat`` processes for the process tests
(and ``bench/celery_*.py``).

Each process is ``celery -A testproject …`` started in a session of its own (so that a
worker's pool processes can be killed with it), logging to a file, with an environment that
points it at this test run's databases (``DJANGO_LEADER_TEST_DB_NAMES``), a lease backend,
a queue and a record file (``DJANGO_LEADER_CELERY_RECORD``: what the tasks of
``testproject/demoapp/tasks.py`` did, one JSON object per line).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent.parent
CELERY = str(Path(sys.executable).with_name("celery"))

#: Starting a worker or a beat (Python, Django, Celery) on a loaded 2-core machine.
STARTUP = 60.0


class CeleryProcess:
    """One ``celery`` process (a worker with its pool, or a beat) and its log file."""

    def __init__(self, label: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.label = label
        self.argv = argv
        self.log_path = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=log.parent,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self.started = time.time()

    def __repr__(self) -> str:
        return f"<{self.label} pid {self.pid} exit {self.proc.poll()}>"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_log(self, pattern: str, timeout: float, what: str = "") -> re.Match[str]:
        """The first match of ``pattern`` in the log, waiting up to ``timeout`` seconds."""
        regex = re.compile(pattern, re.MULTILINE)

        def logged() -> re.Match[str] | None:
            found = regex.search(self.log())
            if not found and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.label} exited ({self.proc.returncode}) before logging "
                    f"{what or pattern!r}:\n{self.tail()}"
                )
            return found

        return wait_until(
            logged,
            timeout=timeout,
            message=lambda: f"{self.label}: no {what or pattern!r}:\n{self.tail()}",
        )

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log(), re.MULTILINE))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        """Signal the process and every process it started (a worker's pool)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> float:
        """SIGKILL the whole process group (a host dying); returns the time it was sent."""
        at = time.time()
        self.signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return at

    def terminate(self) -> float:
        """SIGTERM the main process only (as ``docker stop`` does); returns when sent."""
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        return at

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL the group if it is not gone within ``timeout``."""
        if self.alive:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class Processes:
    """The celery processes of one test (or module), sharing a base environment and a
    record file; :meth:`close` stops them all."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.record_path = directory / "records.jsonl"
        self.env = {
            **env,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONUNBUFFERED": "1",
            "DJANGO_LEADER_CELERY_RECORD": str(self.record_path),
        }
        self.processes: list[CeleryProcess] = []

    def start(self, label: str, args: list[str], **env: str) -> CeleryProcess:
        process = CeleryProcess(
            label,
            [CELERY, "-A", "testproject", *args],
            {**self.env, **env},
            self.directory / f"{label}.log",
        )
        self.processes.append(process)
        return process

    def worker(
        self, label: str, queue: str, concurrency: int = 4, pool: str = "prefork", **env: str
    ) -> CeleryProcess:
        """A worker consuming ``queue``, started and ready."""
        process = self.start(
            label,
            [
                "worker",
                "-P",
                pool,
                "-c",
                str(concurrency),
                "-Q",
                queue,
                "-n",
                f"{label}-{os.getpid()}@%h",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
            DJANGO_LEADER_CELERY_QUEUE=queue,
            **env,
        )
        process.wait_log(r"\bready\.", STARTUP, "ready")
        return process

    def beat(self, label: str, *args: str, **env: str) -> CeleryProcess:
        """A beat with LeaderScheduler (not waited for)."""
        return self.start(
            label,
            [
                "beat",
                "-S",
                "django_leader.celery:LeaderScheduler",
                "-s",
                str(self.directory / f"{label}-schedule"),
                "-l",
                "INFO",
                *args,
            ],
            **env,
        )

    def records(self, predicate: Callable[[dict[str, Any]], bool] | None = None) -> list[dict]:
        try:
            lines = self.record_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines if line.strip()]
        return [event for event in events if predicate is None or predicate(event)]

    def wait_records(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        count: int,
        timeout: float,
        what: str,
    ) -> list[dict]:
        def enough() -> list[dict] | None:
            found = self.records(predicate)
            return found if len(found) >= count else None

        return wait_until(
            enough,
            timeout=timeout,
            message=lambda: f"{len(self.records(predicate))} of {count} {what}\n{self.describe()}",
        )

    def describe(self, processes: Iterable[CeleryProcess] | None = None) -> str:
        parts = []
        for process in processes or self.processes:
            parts.append(f"--- {process!r} log:\n{process.tail(25)}")
        return "\n".join(parts)

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop()


# -- killing a process's database connections (a real fault, on the server's side) ---------
def tcp_ports(pid: int) -> set[int]:
    """The local ports of the TCP sockets process ``pid`` has open (from ``/proc``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def kill_connections(settings_dict: dict[str, Any], pid: int) -> list[int]:
    """End every connection process ``pid`` has to the database of ``settings_dict``, from
    the server's side: ``pg_terminate_backend`` on PostgreSQL, ``KILL`` on MariaDB/MySQL
    (as a restart, a failover or an idle timeout would). Returns the server-side ids ended.

    The connections are found by their client port (the process's TCP sockets), among the
    sessions on the test database only: no other process's session is touched."""
    ports = tcp_ports(pid)
    engine = settings_dict["ENGINE"]
    host = settings_dict.get("HOST") or "127.0.0.1"
    name = settings_dict["NAME"]
    if "postgresql" in engine:
        import psycopg

        with psycopg.connect(
            host=host,
            port=int(settings_dict.get("PORT") or 5432),
            user=settings_dict.get("USER") or "postgres",
            password=settings_dict.get("PASSWORD") or None,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND client_port = ANY(%s)",
                [name, sorted(ports)],
            ).fetchall()
            ended = [row[0] for row in rows]
            for backend_pid in ended:
                conn.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
        return ended
    if "mysql" in engine:
        import MySQLdb

        conn = MySQLdb.connect(
            host=host,
            port=int(settings_dict.get("PORT") or 3306),
            user=settings_dict.get("USER") or "root",
            password=settings_dict.get("PASSWORD") or "",
        )
        try:
            cursor = conn.cursor()
            cursor.execute(
                "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE DB = %s", [name]
            )
            ended = [
                int(row[0])
                for row in cursor.fetchall()
                if ":" in row[1] and int(row[1].rsplit(":", 1)[1]) in ports
            ]
            for thread_id in ended:
                with contextlib.suppress(MySQLdb.OperationalError):  # ended in between
                    cursor.execute(f"KILL {thread_id}")
        finally:
            conn.close()
        return ended
    raise ValueError(f"no way to kill connections of {engine}")
