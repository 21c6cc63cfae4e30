"""The process of the ``scale`` part of ``bench/report.py``: it holds N leases at once.

    python bench/scale_holder.py N --ttl 6 --hold 12 [--thread-cap 2500] [--acquire-for 90]
        [--prefix scale]

One ``contextlib.ExitStack`` of ``django_leader.lock(f"{prefix}-{i}", ttl=TTL)``, i < N, in
the main thread, on the store of its environment (``bench.settings``, as the bench
starts it). Then it holds them ``--hold`` seconds and exits without releasing them (the
store is a private one, thrown away after the run; N releases would only add time).

Lines on stdout, one JSON object each:

* ``{"event": "progress", "held": i, "threads": t, "at": seconds}`` every 250 leases;
* ``{"event": "stopped", "held": i, "why": "..."}`` if it could not take them all: an
  error of the store (e.g. PostgreSQL's "too many clients"), more than ``--thread-cap``
  threads in the process (a cap that keeps a thread-per-lease design from taking the
  machine down), or ``--acquire-for`` seconds spent acquiring;
* ``{"event": "held", "held": i, "took": seconds}`` when it holds what it could take;
* ``{"event": "tick", ...}`` every second of the hold: threads (all, and those named
  ``leader-*``), renewals so far, leases lost so far;
* ``{"event": "done", ...}``: the renewal latencies seen by the ``renew`` hook
  (``django_leader.hooks``) during the hold, renewals failed / refused, leases lost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def threads() -> tuple[int, int]:
    every = threading.enumerate()
    return len(every), sum(t.name.startswith("leader-") for t in every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--ttl", type=float, default=6.0)
    parser.add_argument("--hold", type=float, default=12.0)
    parser.add_argument("--thread-cap", type=int, default=2500)
    parser.add_argument("--acquire-for", type=float, default=90.0)
    parser.add_argument("--prefix", default="scale")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django_leader import hooks, lock

    renewals: list[float] = []
    counts = {"renew_failed": 0, "renew_refused": 0}
    holding = threading.Event()

    def observe(event: str, name: str, value: float) -> None:
        if event == "renew":
            if holding.is_set():
                renewals.append(value)
        elif event in counts:
            counts[event] += 1

    hooks.add_observer(observe)
    leases: list[Any] = []
    stack = contextlib.ExitStack()
    started = time.monotonic()
    emit(event="started", pid=os.getpid())
    for i in range(args.n):
        if i and i % 250 == 0:
            emit(event="progress", held=i, threads=threads()[0], at=time.monotonic() - started)
        if threading.active_count() > args.thread_cap:
            emit(event="stopped", held=i, why=f"more than {args.thread_cap} threads (the cap)")
            break
        if time.monotonic() - started > args.acquire_for:
            emit(event="stopped", held=i, why=f"{args.acquire_for:g} s spent acquiring")
            break
        try:
            one = lock(f"{args.prefix}-{i}", ttl=args.ttl, blocking=False)
            leases.append(stack.enter_context(one))
        except Exception as exc:
            emit(event="stopped", held=i, why=f"{type(exc).__name__}: {exc}"[:300])
            break
    emit(event="held", held=len(leases), took=time.monotonic() - started)
    holding.set()
    hold_started = time.monotonic()
    while time.monotonic() - hold_started < args.hold:
        time.sleep(1.0)
        total, leader = threads()
        emit(
            event="tick",
            threads=total,
            leader_threads=leader,
            renewals=len(renewals),
            lost=sum(not lease.held for lease in leases),
            at=time.monotonic() - hold_started,
        )
    samples = sorted(renewals)
    emit(
        event="done",
        held=len(leases),
        lost=sum(not lease.held for lease in leases),
        renewals=len(samples),
        renew_median=statistics.median(samples) if samples else None,
        renew_p99=samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else None,
        renew_max=samples[-1] if samples else None,
        **counts,
    )
    os._exit(0)  # without releasing: see the module's docstring


if __name__ == "__main__":
    main()
