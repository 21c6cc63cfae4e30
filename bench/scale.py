"""Many leases held by one process: the ``scale`` part of ``bench/report.py``.

For PostgreSQL and Redis, each a private server started for the part (its counters count
only this part's clients, and nothing a thread-per-lease design does to it can reach the
machine's shared servers): one process (``bench/scale_holder.py``) takes N leases with
``lock(ttl=6)`` (renewed every 2 s) and holds them; while it holds them the bench counts,
on the server's side:

* **connections** of that process: rows of ``pg_stat_activity`` on the private
  database, ``CLIENT LIST`` on the private Redis (the bench's own connection left out;
  the largest of three samples);
* **store requests per second**: statements counted by ``pg_stat_statements`` (``BEGIN``
  and ``COMMIT`` included), commands sent by clients from ``INFO commandstats``
  (``EVALSHA``, ``PUBLISH``...; the commands the scripts run inside are counted apart), over
  :data:`WINDOW` seconds, after one renewal interval of settling;

and the process reports its threads (all, and those named ``leader-*``), the renewal
latency seen by the ``renew`` hook and how many leases it lost. The private PostgreSQL
allows :data:`PG_CONNECTIONS` connections, a stock server's ``max_connections``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _setup import ROOT
from elections import CLIENT_COMMANDS, PrivatePostgres, PrivateRedis, base_env

HOLDER = str(Path(__file__).resolve().with_name("scale_holder.py"))
TTL = 6.0
#: Seconds after "held" before counting (one renewal interval: ttl / 3), and counted.
SETTLE, WINDOW = 3.0, 9.0
PG_CONNECTIONS = 100
#: Threads beyond which the holder stops taking leases (see scale_holder.py).
THREAD_CAP = 2500
ACQUIRE_FOR = 90.0


class Holder:
    def __init__(self, n: int, env: dict[str, str], hold: float) -> None:
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                HOLDER,
                str(n),
                "--ttl",
                str(TTL),
                "--hold",
                str(hold),
                "--thread-cap",
                str(THREAD_CAP),
                "--acquire-for",
                str(ACQUIRE_FOR),
                "--prefix",
                f"scale-{uuid.uuid4().hex[:6]}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                with self.cond:
                    self.events.append(event)
                    self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors = [*self.errors[-20:], line.rstrip()]

    def wait(self, kind: str, timeout: float) -> dict[str, Any] | None:
        give_up = time.monotonic() + timeout
        with self.cond:
            while True:
                for event in self.events:
                    if event.get("event") == kind:
                        return event
                remaining = give_up - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._pending()):
                    return None
                self.cond.wait(min(remaining, 0.5))

    def _pending(self) -> bool:
        return False

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == kind), None)

    def os_threads(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait()


class PgMonitor:
    """One connection to the private PostgreSQL, opened before the holder starts (which
    may take every other one), that reads its counters."""

    def __init__(self, store: PrivatePostgres) -> None:
        self.db = store.store.connect()

    def requests(self) -> float:
        rows = self.db.execute(
            "SELECT query, calls FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = %s",
            ["chaos"],
        ).fetchall()
        return float(sum(calls for query, calls in rows if "pg_stat" not in query))

    def connections(self) -> int:
        (count,) = self.db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            ["chaos"],
        ).fetchone()
        return int(count)

    def close(self) -> None:
        self.db.close()


def redis_counts(store: PrivateRedis) -> tuple[float, float]:
    """(commands clients sent, commands run in all) so far, the bench's own left out."""
    stats = store.store.client().info("commandstats")
    sent = run = 0.0
    for key, value in stats.items():
        command = key.removeprefix("cmdstat_")
        if command in ("info", "client"):
            continue
        run += value["calls"]
        if command in CLIENT_COMMANDS:
            sent += value["calls"]
    return sent, run


def redis_connections(store: PrivateRedis) -> int:
    return len(store.store.client().client_list()) - 1  # itself


def measure(label: str, store: Any, n: int) -> dict[str, Any]:
    """One holder of ``n`` leases on ``store``; what it cost."""
    env = {**base_env(), **store.env()}
    hold = SETTLE + WINDOW + 2.0
    monitor = PgMonitor(store) if label == "postgresql" else None
    holder = Holder(n, env, hold)
    result: dict[str, Any] = {"store": label, "leases": n}
    try:
        held = holder.wait("held", ACQUIRE_FOR + 60)
        if held is None:
            result["failed"] = "no answer: " + " | ".join(holder.errors[-3:])
            return result
        stopped = holder.first("stopped")
        result["held"] = held["held"]
        result["acquire_s"] = held["took"]
        if stopped is not None:
            result["stopped"] = stopped["why"]
        time.sleep(SETTLE)
        connections: list[int] = []
        threads: list[int] = []
        if label == "postgresql":
            assert monitor is not None
            before, started = monitor.requests(), time.monotonic()
        else:
            (before, before_run), started = redis_counts(store), time.monotonic()
        for _ in range(3):
            time.sleep(WINDOW / 3)
            connections.append(
                monitor.connections() if monitor is not None else redis_connections(store)
            )
            found = holder.os_threads()
            if found is not None:
                threads.append(found)
        span = time.monotonic() - started
        if monitor is not None:
            result["requests_per_s"] = (monitor.requests() - before) / span
        else:
            after, after_run = redis_counts(store)
            result["requests_per_s"] = (after - before) / span
            result["commands_run_per_s"] = (after_run - before_run) / span
        result["connections"] = max(connections)
        result["os_threads"] = max(threads) if threads else None
        done = holder.wait("done", hold + 30)
        if done is None:
            result["failed"] = "the holder did not finish: " + " | ".join(holder.errors[-3:])
            return result
        ticks = [e for e in holder.events if e.get("event") == "tick"]
        result["threads"] = max(e["threads"] for e in ticks) if ticks else None
        result["leader_threads"] = max(e["leader_threads"] for e in ticks) if ticks else None
        for key in ("lost", "renewals", "renew_median", "renew_p99", "renew_max"):
            result[key] = done[key]
        result["renew_failed"] = done["renew_failed"]
        result["renew_refused"] = done["renew_refused"]
        result["renewal_interval_s"] = TTL / 3
        return result
    finally:
        holder.kill()
        if monitor is not None:
            monitor.close()


def run(sizes: list[int], wanted: list[str]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    results: list[dict[str, Any]] = []
    missing: list[str] = []
    makers = {
        "postgresql": lambda: PrivatePostgres(workdir / "pg", PG_CONNECTIONS),
        "redis": lambda: PrivateRedis(workdir),
    }
    try:
        for label, make in makers.items():
            if label not in wanted:
                continue
            try:
                store = make()
            except Exception as exc:
                missing.append(f"{label}: no private server: {exc}")
                continue
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
                    cwd=ROOT,
                    env={**base_env(), **store.env()},
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    missing.append(f"{label}: migrate failed: {done.stderr[-500:]}")
                    continue
                store.warm_up()
                for n in sizes:
                    result = measure(label, store, n)
                    results.append(result)
                    print(f"  scale {label} {n}: {result}", flush=True)
            finally:
                store.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "ttl": TTL,
        "window_s": WINDOW,
        "pg_max_connections": PG_CONNECTIONS,
        "thread_cap": THREAD_CAP,
        "results": results,
        "missing": missing,
    }
