"""The handover gap of a highly available celery beat: django-leader's LeaderScheduler
against celery-redbeat and single-beat, on this machine, in one run.

    python bench/celery_handover.py [--repeat 3] [--tools leader,redbeat,single-beat]

For each tool and each way of stopping the sending beat (``SIGKILL`` of its whole process
group, as when a host dies; ``SIGTERM`` of its main process, as ``docker stop`` does;
``SIGSTOP`` of its group for 6 s, longer than the lease, then ``SIGCONT``, as a long pause
or a frozen VM does), and
``--repeat`` times: two beats (A, then B) with a 1-second periodic task, a ``celery worker``
that records when each execution ran and which process sent it (the message's ``origin``);
once both run and A sends, A is stopped, and the record is read:

* **gap** — from the last execution sent by A to the first sent by B (1 s = no slot lost);
* **takeover** — from the signal to B's first execution;
* **missed** — slots that fell due in the gap and were never sent;
* **dup** — pairs of executions less than half an interval apart (a slot sent twice);
* **senders** — processes that sent after the signal (more than 1: two beats at once);
* **old beat alive** — whether the stopped beat still runs at the end (after a pause, it
  should be a follower again, not dead).

Every tool gets the same lease/lock timing: 3 s lifetime, renewed every second, followers
retrying at least every second (LeaderScheduler: TTL 3, RENEW 1, RETRY 0.5; redbeat:
``redbeat_lock_timeout=3``, ``--max-interval 1``; single-beat: ``LOCK_TIME=3``,
``HEARTBEAT_INTERVAL=1``). redbeat and single-beat wrap Celery's PersistentScheduler or
keep their own state, as documented; LeaderScheduler wraps PersistentScheduler, leases and
slot records in Redis. Needs Redis at the test project's broker URL, and
``pip install celery-redbeat single-beat``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _setup import ROOT, setup

EVERY = 1.0
TOOLS = ("leader", "redbeat", "single-beat")
MODES = ("SIGKILL", "SIGTERM", "SIGSTOP")
#: How long a SIGSTOPped beat stays paused (longer than the 3 s lease).
PAUSE = 6.0
#: How long the beats run after the signal.
AFTER = 12.0


@dataclass
class Outcome:
    tool: str
    mode: str
    gap: float
    takeover: float
    missed: int
    duplicates: int
    senders: int
    survived: bool


def origin_pid(event: dict[str, Any]) -> int | None:
    origin = event.get("origin") or ""
    head = origin.split("@", 1)[0]
    return int(head[3:]) if head.startswith("gen") and head[3:].isdigit() else None


def beat_argv(tool: str, directory: Path, label: str) -> list[str]:
    from tests.celeryprocs import CELERY

    base = [CELERY, "-A", "testproject", "beat", "-l", "INFO"]
    if tool == "leader":
        return [*base, "-S", "django_leader.celery:LeaderScheduler", "-s", str(directory / label)]
    if tool == "redbeat":
        return [*base, "-S", "redbeat.RedBeatScheduler", "--max-interval", "1"]
    single = str(Path(sys.executable).with_name("single-beat"))
    return [single, *base, "-S", "celery.beat:PersistentScheduler", "-s", str(directory / label)]


def beat_env(tool: str, run: str, broker: str) -> dict[str, str]:
    if tool == "leader":
        return {
            "DJANGO_LEADER_CELERY_BEAT_LEASE": f"bench-{run}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.cache.CacheBackend",
            "DJANGO_LEADER_CACHE": "redis",
            "DJANGO_LEADER_TTL": "3",
            "DJANGO_LEADER_RENEW": "1",
            "DJANGO_LEADER_RETRY": "0.5",
        }
    if tool == "redbeat":
        return {
            "DJANGO_LEADER_REDBEAT_LOCK_TIMEOUT": "3",
            "DJANGO_LEADER_REDBEAT_PREFIX": f"redbeat-{run}",
        }
    return {
        "SINGLE_BEAT_REDIS_SERVER": broker,
        "SINGLE_BEAT_IDENTIFIER": f"bench-{run}",
        "SINGLE_BEAT_LOCK_TIME": "3",
        "SINGLE_BEAT_INITIAL_LOCK_TIME": "6",
        "SINGLE_BEAT_HEARTBEAT_INTERVAL": "1",
        "SINGLE_BEAT_LOG_LEVEL": "info",
    }


class Run:
    """One handover: beats A and B of one tool, A stopped with one signal."""

    def __init__(self, procs: Any, queue: str, tool: str, mode: str) -> None:
        from django.conf import settings

        self.procs, self.tool, self.mode = procs, tool, mode
        self.run = uuid.uuid4().hex[:8]
        self.entry = f"handover-{self.run}"
        self.env = {
            **procs.env,
            "DJANGO_LEADER_CELERY_BEAT_EVERY": str(EVERY),
            "DJANGO_LEADER_CELERY_BEAT_ENTRY": self.entry,
            "DJANGO_LEADER_CELERY_QUEUE": queue,
            **beat_env(tool, self.run, settings.CELERY_BROKER_URL),
        }
        self.groups: dict[int, str] = {}  # sender pid -> beat label (resolved while alive)
        self.labels: dict[int, str] = {}  # process group -> beat label

    def beat(self, label: str) -> Any:
        from tests.celeryprocs import CeleryProcess

        process = CeleryProcess(
            label,
            beat_argv(self.tool, self.procs.directory, f"{label}-{self.run}"),
            self.env,
            self.procs.directory / f"{self.tool}-{label}-{self.run}.log",
        )
        self.procs.processes.append(process)
        return process

    def executions(self) -> list[dict[str, Any]]:
        events = self.procs.records(
            lambda e: (
                e["ev"] == "slot"
                and e.get("periodic_task_name") in (None, self.entry)
                and (e.get("django_leader_entry") in (None, self.entry))
            )
        )
        mine = [e for e in events if self._is_mine(e)]
        for event in mine:
            pid = origin_pid(event)
            if pid is not None and pid not in self.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    self.groups[pid] = self.labels.get(group, "?")
        return sorted(mine, key=lambda e: e["t"])

    def _is_mine(self, event: dict[str, Any]) -> bool:
        # The periodic task records who sent it; only this run's beats send this entry
        # (redbeat and single-beat add no entry header: match by sender).
        if event.get("django_leader_entry") == self.entry:
            return True
        pid = origin_pid(event)
        if pid is None:
            return False
        if pid in self.groups:
            return self.groups[pid] in self.labels.values()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            return os.getpgid(pid) in self.labels
        return False

    def wait(self, predicate: Any, timeout: float, what: str) -> list[dict[str, Any]]:
        give_up = time.monotonic() + timeout
        while True:
            events = self.executions()
            if predicate(events):
                return events
            if time.monotonic() > give_up:
                raise RuntimeError(
                    f"{self.tool}: no {what} within {timeout:.0f}s\n" + self.procs.describe()
                )
            time.sleep(0.2)

    def measure(self) -> Outcome:
        a = self.beat("A")
        self.labels[a.pid] = "A"
        self.wait(lambda events: len(events) >= 2, 60, "executions sent by A")
        b = self.beat("B")
        self.labels[b.pid] = "B"
        time.sleep(4.0)  # B is up (a follower: nothing to wait for in its output)
        events = self.wait(lambda events: len(events) >= 6, 30, "steady executions")
        senders = {self.groups.get(origin_pid(e) or -1) for e in events[-3:]}
        if senders != {"A"}:
            raise RuntimeError(f"{self.tool}: expected A to send, saw {senders}")
        if self.mode == "SIGKILL":
            stopped_at = a.kill()
        elif self.mode == "SIGTERM":
            stopped_at = a.terminate()
        else:  # paused (a long GC, a frozen VM), then resumed: it must not send again
            stopped_at = time.time()
            a.signal_group(signal.SIGSTOP)
            time.sleep(PAUSE)
            a.signal_group(signal.SIGCONT)
        time.sleep(AFTER)
        events = self.executions()
        survived = a.alive
        b.stop()
        a.stop()
        before = [e for e in events if e["t"] < stopped_at]
        after = [e for e in events if e["t"] >= stopped_at]
        new = [e for e in after if self.groups.get(origin_pid(e) or -1) == "B"]
        if not new:
            raise RuntimeError(f"{self.tool} {self.mode}: B never sent\n" + self.procs.describe())
        last_old = max(e["t"] for e in before if self.groups.get(origin_pid(e) or -1) == "A")
        first_new = new[0]["t"]
        gap = first_new - last_old
        times = [e["t"] for e in events]
        duplicates = sum(1 for x, y in itertools.pairwise(times) if y - x < EVERY / 2)
        return Outcome(
            tool=self.tool,
            mode=self.mode,
            gap=gap,
            takeover=first_new - stopped_at,
            missed=max(0, round(gap / EVERY) - 1),
            duplicates=duplicates,
            senders=len({self.groups.get(origin_pid(e) or -1) for e in after}),
            survived=survived,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_LEADER_LOG_LEVEL", "INFO")
    setup()
    import testproject.celery  # noqa: F401
    from tests.celeryprocs import Processes

    tools = [tool for tool in args.tools.split(",") if tool]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as directory:
        procs = Processes(Path(directory), dict(os.environ))
        queue = f"bench-handover-{uuid.uuid4().hex[:8]}"
        try:
            procs.worker("worker", queue, concurrency=2)
            for _ in range(args.repeat):
                for tool in tools:
                    for mode in MODES:
                        outcome = Run(procs, queue, tool, mode).measure()
                        outcomes.append(outcome)
                        print(
                            f"{tool:<12} {mode:<8} gap {outcome.gap:6.2f}s  takeover "
                            f"{outcome.takeover:6.2f}s  missed {outcome.missed}  dup "
                            f"{outcome.duplicates}  senders after {outcome.senders}  "
                            f"old beat alive {outcome.survived}",
                            flush=True,
                        )
        finally:
            procs.close()
    print(
        f"\nmedian of {args.repeat} (python {sys.version.split()[0]}, {ROOT}); missed, dup: "
        f"sums over the {args.repeat} runs; old beat alive: runs in which it was:"
    )
    print(
        f"{'tool':<12} {'signal':<8} {'gap':>7} {'takeover':>9} {'missed':>7} {'dup':>4}"
        f" {'max senders':>12} {'old beat alive':>15}"
    )
    for tool in tools:
        for mode in MODES:
            mine = [o for o in outcomes if o.tool == tool and o.mode == mode]
            print(
                f"{tool:<12} {mode:<8} {statistics.median(o.gap for o in mine):6.2f}s "
                f"{statistics.median(o.takeover for o in mine):8.2f}s "
                f"{sum(o.missed for o in mine):7d} {sum(o.duplicates for o in mine):4d} "
                f"{max(o.senders for o in mine):12d} "
                f"{sum(o.survived for o in mine):>9d} of {len(mine)}"
            )


if __name__ == "__main__":
    main()
