"""Failover time: how long a name has no leader when its leader dies or steps down.

    python bench/failover.py [--rounds 5] [--ttl 3] [--renew 1] [--retry 0.5]

For every reachable store, three candidate processes campaign; the leader is SIGKILLed
(crash: the others must wait for the lease to expire) or SIGTERMed (graceful: it releases),
``--rounds`` times each, and the time from the signal to the next ``elected`` is printed.
The promise: a crash is taken over within TTL + RETRY_INTERVAL; a release within about one
RETRY_INTERVAL.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

from _setup import ROOT, migrate, setup

CANDIDATE = """
import os, signal, sys, time, django
django.setup()
from django_leader import Elector
from django_leader.backends import get_backend
elector = Elector(sys.argv[1], ttl=float(sys.argv[2]), renew_interval=float(sys.argv[3]),
                  retry_interval=float(sys.argv[4]),
                  on_elected=lambda lease: print("elected", os.getpid(), time.time(), flush=True))
signal.signal(signal.SIGTERM, lambda *a: elector.stop(timeout=0))
elector.run()
"""


class Candidate:
    def __init__(
        self,
        env: dict[str, str],
        args: list[str],
        events: list[tuple[int, float]],
        cond: threading.Condition,
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CANDIDATE, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events, self.cond = events, cond
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if parts[:1] == ["elected"]:
                with self.cond:
                    self.events.append((int(parts[1]), float(parts[2])))
                    self.cond.notify_all()


def run_store(label: str, env: dict[str, str], args: argparse.Namespace) -> None:
    name = f"bench-failover-{os.getpid()}-{label}"
    timing = [name, str(args.ttl), str(args.renew), str(args.retry)]
    events: list[tuple[int, float]] = []
    cond = threading.Condition()
    pool = [Candidate(env, timing, events, cond) for _ in range(3)]
    results: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
    try:
        for sig in (signal.SIGKILL, signal.SIGTERM):
            for _ in range(args.rounds):
                with cond:
                    cond.wait_for(lambda: events, timeout=30)
                    seen = len(events)
                    leader = events[-1][0]
                time.sleep(args.renew * 1.5)  # steady state: a renewal or two in
                signalled = time.time()
                os.kill(leader, sig)
                with cond:
                    if not cond.wait_for(
                        lambda seen=seen: len(events) > seen, timeout=args.ttl * 5
                    ):
                        raise SystemExit(f"{label}: no new leader after {sig.name}")
                    results[sig.name].append(events[-1][1] - signalled)
                victim = next(c for c in pool if c.proc.pid == leader)
                victim.proc.wait()
                pool.remove(victim)
                pool.append(Candidate(env, timing, events, cond))
    finally:
        for candidate in pool:
            candidate.proc.kill()
            candidate.proc.wait()
    for sig, gaps in results.items():
        print(
            f"{label:11s} {sig:7s} leader gap: median {statistics.median(gaps):5.2f} s  "
            f"max {max(gaps):5.2f} s  (n={len(gaps)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--renew", type=float, default=1.0)
    parser.add_argument("--retry", type=float, default=0.5)
    args = parser.parse_args()
    setup()
    from django.conf import settings

    from testproject.services import UNAVAILABLE

    base = {
        "DJANGO_LEADER_LOG_LEVEL": "WARNING",
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "PYTHONPATH": str(ROOT),
    }
    stores = []
    for alias, label in (("default", "sqlite"), ("postgresql", "postgresql"), ("mysql", "mariadb")):
        if alias in settings.DATABASES:
            migrate(alias)
            stores.append((label, {**base, "DJANGO_LEADER_DATABASE": alias}))
    if "redis" in settings.CACHES:
        stores.append(
            (
                "redis",
                {
                    **base,
                    "DJANGO_LEADER_BACKEND": "django_leader.backends.cache.CacheBackend",
                    "DJANGO_LEADER_CACHE": "redis",
                },
            )
        )
    print(
        f"failover, 3 candidates, ttl={args.ttl}s renew={args.renew}s retry={args.retry}s; "
        f"promised: crash < ttl + retry = {args.ttl + args.retry:.1f}s"
    )
    for label, env in stores:
        run_store(label, env, args)
    for reason in UNAVAILABLE.values():
        print(f"skipped: {reason}")


if __name__ == "__main__":
    main()
