"""``make bench``: every benchmark in one run, written to docs/benchmarks.md with its plots.

    python bench/report.py [--parts ops,failover,celery,load,scale] [--quick]
        [--stores sqlite,postgresql,mariadb,redis,zookeeper] [--n 1000] [--repeats 3]
        [--trials 20] [--sizes 10,100,500] [--scale 1000,10000]

Parts (in this order; ``all`` = every one):

* ``ops`` — acquire / release / renew / ``lock()`` per store beside the driver's raw round
  trip of the same renewal statement, and python-redis-lock (``bench/latency.py``);
* ``failover`` — graceful handover (SIGTERM) and crash failover (SIGKILL), ``--trials``
  each per store, and celery-redbeat and single-beat on the same Redis
  (``bench/elections.py``'s trials);
* ``celery`` — what ``singleton_task`` adds to a task, on Redis and PostgreSQL, beside
  celery-singleton on Redis (``bench/celery_overhead.py``);
* ``load`` — store requests per graceful handover with 10/100/500 waiting candidates, on
  private servers (``bench/elections.py``'s load part);
* ``scale`` — 1,000 and 10,000 leases held by one process (``bench/scale.py``).

Each part's results go to docs/benchmarks/results.json (summaries, not samples), merged
with those of the parts not run this time; docs/benchmarks.md and the plots in
docs/benchmarks/ are then written from that file, each part with its own date and the
machine's load while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _setup import ROOT, setup

PARTS = ("ops", "throughput", "failover", "celery", "load", "scale")
STORES = ("sqlite", "postgresql", "mariadb", "redis", "zookeeper")
DOCS = ROOT / "docs"
OUT = DOCS / "benchmarks"
RESULTS = OUT / "results.json"
PAGE = DOCS / "benchmarks.md"
#: Fewer samples than this: the p99 is the largest sample or near it (flagged).
P99_SAMPLES = 100
#: A load average above this (2 cores) while a part ran: flagged as a loaded machine.
BUSY_LOAD = 1.5


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * q + 0.999999) - 1))]


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p99": pct(samples, 0.99),
        "max": max(samples),
        "min": min(samples),
    }


class LoadWatch:
    """Samples the 1-minute load average every 5 s while a part runs."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(5):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])
        return {"start": self.samples[0], "max": max(self.samples), "end": self.samples[-1]}


# -- the parts ------------------------------------------------------------------------------
def part_ops(args: argparse.Namespace) -> dict[str, Any]:
    import latency

    found = latency.run(args.n, args.repeats, args.stores)
    stores: dict[str, Any] = {}
    for label, kinds in found["stores"].items():
        stores[label] = {}
        for kind, repeats in kinds.items():
            if not repeats:
                continue
            every = [value for repeat in repeats for value in repeat]
            stores[label][kind] = {
                **summary(every),
                "repeat_medians": [statistics.median(r) for r in repeats],
            }
    peer = found["peer"]
    if isinstance(peer, dict) and all(peer.values()):
        peer = {
            kind: {
                **summary([v for r in repeats for v in r]),
                "repeat_medians": [statistics.median(r) for r in repeats],
            }
            for kind, repeats in peer.items()
        }
    return {
        "n": found["n"],
        "repeats": found["repeats"],
        "stores": stores,
        "raw": found["raw"],
        "peer": peer,
        "missing": found["missing"],
    }


def part_failover(args: argparse.Namespace) -> dict[str, Any]:
    """Graceful handovers store after store (milliseconds: nothing else runs); then the
    crash failovers of every store and the peers' trials, side by side (seconds: the
    waiting is for a lease to expire, and the CPU is mostly idle)."""
    import elections
    from django.conf import settings

    roots: list[Any] = []
    try:
        envs = elections.store_envs(args.stores, roots)
        envs = {k: v for k, v in envs.items() if k in args.stores}
        wakeups = {"postgresql": True, "redis": True, "zookeeper": True}
        graceful: dict[str, Any] = {}
        crash: dict[str, Any] = {}
        peers: dict[str, Any] = {}
        errors: list[str] = []

        def handovers(store: str, sig: signal.Signals) -> elections.Series:
            """``args.trials`` trials of ``sig`` to the leader of three race candidates."""
            return elections.handover_series(
                elections.Log(),
                store,
                envs[store],
                "race",
                wakeups.get(store, False),
                sig,
                args.trials,
                False,
            )

        for store in STORES:
            if store not in envs:
                continue
            try:
                series = handovers(store, signal.SIGTERM)
            except Exception as exc:
                errors.append(f"graceful {store}: {exc}")
                continue
            graceful[store] = {
                "gaps": series.gaps,
                "wakeups": series.wakeups,
                "woken": series.woken,
            }
            print(f"  failover {elections.summary_row(series)}", flush=True)

        def crash_one(store: str) -> None:
            try:
                series = handovers(store, signal.SIGKILL)
            except Exception as exc:
                errors.append(f"crash {store}: {exc}")
                return
            crash[store] = {"gaps": series.gaps, "wakeups": series.wakeups}
            print(
                f"  failover {elections.summary_row(series, elections.TTL + elections.RETRY)}",
                flush=True,
            )

        def peer_one(tool: str, sig: signal.Signals) -> None:
            try:
                found = elections.peer_series(
                    elections.Log(), tool, args.trials, settings.CELERY_BROKER_URL, sig
                )
            except (FileNotFoundError, RuntimeError) as exc:
                peers.setdefault(tool, {})[sig.name] = f"not measured: {exc}"[:300]
                print(f"  failover {tool} {sig.name}: not measured: {exc}", flush=True)
                return
            peers.setdefault(tool, {})[sig.name] = found.gaps
            print(f"  failover {elections.peer_row(found)} {sig.name}", flush=True)

        jobs: list[Callable[[], None]] = [
            lambda store=store: crash_one(store) for store in STORES if store in envs
        ]
        if "redis" in envs:
            for tool in ("celery-redbeat", "single-beat"):
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    jobs.append(lambda tool=tool, sig=sig: peer_one(tool, sig))
        threads = [threading.Thread(target=job) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for root in roots:
            root.remove()
    return {
        "ttl": elections.TTL,
        "renew": elections.RENEW,
        "retry": elections.RETRY,
        "graceful": graceful,
        "crash": crash,
        "peers": peers,
        "errors": errors,
    }


def part_celery(args: argparse.Namespace) -> dict[str, Any]:
    import celery_overhead
    from _setup import migrate
    from django.conf import settings
    from django.test.utils import override_settings

    import testproject.celery  # noqa: F401  (the current app)

    found: dict[str, Any] = {}
    for store, conf in celery_overhead.STORES.items():
        if store not in args.stores:
            continue
        if store == "redis" and "redis" not in settings.CACHES:
            found[store] = "not reachable"
            continue
        if store == "postgresql":
            if "postgresql" not in settings.DATABASES:
                found[store] = "not reachable"
                continue
            migrate("postgresql")
        with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, **conf}):
            plain, single = celery_overhead.in_process(args.n)
        worker = celery_overhead.through_worker(store, args.roundtrips, peer=store == "redis")
        found[store] = {
            "in process": {"plain": summary(plain), "singleton_task": summary(single)},
            "through a worker": {
                ("singleton_task" if k == "singleton" else k): summary(v) for k, v in worker.items()
            },
        }
        print(f"  celery {store}: {json.dumps(found[store])[:300]}", flush=True)
    try:
        import celery_singleton  # noqa: F401
    except ImportError:
        found["celery-singleton"] = "not installed"
    return found


def part_load(args: argparse.Namespace) -> dict[str, Any]:
    import elections

    wanted = [s for s in ("postgresql", "redis", "zookeeper") if s in args.stores]
    loads = elections.run_load(elections.Log(), args.sizes, wanted, ["race", "fifo"])
    rows = []
    for load in sorted(loads, key=lambda r: (r.store, r.mode, r.size)):
        cells = elections.load_row(load).strip("|").split("|")
        rows.append([cell.strip() for cell in cells])
    return {
        "rounds": elections.LOAD_ROUNDS,
        "window": elections.LOAD_WINDOW,
        "header": elections.LOAD_HEADER,
        "rows": rows,
    }


def part_throughput(args: argparse.Namespace) -> dict[str, Any]:
    import throughput

    stores = [s for s in ("redis", "postgresql") if s in args.stores]
    return throughput.run(args.threads, args.seconds, args.repeats, stores)


def part_scale(args: argparse.Namespace) -> dict[str, Any]:
    import scale

    return scale.run(args.scale, [s for s in ("postgresql", "redis") if s in args.stores])


RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "ops": part_ops,
    "throughput": part_throughput,
    "failover": part_failover,
    "celery": part_celery,
    "load": part_load,
    "scale": part_scale,
}


# -- the machine ------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import django
    from django.conf import settings
    from django.db import connections

    cpu, memory, system = "", "", platform.platform()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                system = f"{line.split('=', 1)[1].strip(chr(34))}, Linux {platform.release()}"
    except OSError:
        pass
    packages = {}
    for package in (
        "psycopg",
        "mysqlclient",
        "redis",
        "kazoo",
        "celery",
        "celery-redbeat",
        "single-beat",
        "python-redis-lock",
        "celery-singleton",
        "matplotlib",
    ):
        try:
            packages[package] = version(package)
        except PackageNotFoundError:
            packages[package] = "not installed"
    servers: dict[str, str] = {}
    import sqlite3

    servers["SQLite"] = sqlite3.sqlite_version
    for alias, label, query in (
        ("postgresql", "PostgreSQL", "SHOW server_version"),
        ("mysql", "MariaDB", "SELECT VERSION()"),
    ):
        if alias in settings.DATABASES:
            try:
                with connections[alias].cursor() as cursor:
                    cursor.execute(query)
                    servers[label] = str(cursor.fetchone()[0]).split()[0]
            except Exception as exc:
                servers[label] = f"unknown ({type(exc).__name__})"
    try:
        from django.core.cache import caches

        from django_leader.backends.redis import redis_client

        servers["Redis"] = redis_client(caches["redis"]).info("server")["redis_version"]
    except Exception:
        pass
    zookeeper = getattr(settings, "ZOOKEEPER", None)
    if zookeeper:
        try:
            from testproject.services import four_letter_word

            host, _, port = zookeeper["HOSTS"].split(",")[0].rpartition(":")
            srvr = four_letter_word(host, int(port), "srvr")
            servers["ZooKeeper"] = srvr.split()[2].split("-")[0].rstrip(",")
        except Exception:
            pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory": memory,
        "os": system,
        "python": platform.python_version(),
        "django": django.get_version(),
        "packages": packages,
        "servers": servers,
    }


# -- the run ----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="all", help="comma or space separated, or all")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--n", type=int, default=1000, help="ops: samples per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ops: repeats")
    parser.add_argument("--trials", type=int, default=20, help="failover: trials per case")
    parser.add_argument("--roundtrips", type=int, default=300, help="celery: worker calls")
    parser.add_argument("--sizes", default="10,100,500", help="load: waiting candidates")
    parser.add_argument("--scale", default="1000,10000", help="scale: leases held")
    parser.add_argument("--threads", default="1,8", help="throughput: threads")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput: per case")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few samples")
    parser.add_argument("--no-write", action="store_true", help="do not write the page")
    args = parser.parse_args()
    words = args.parts.replace(",", " ").split()
    parts = list(PARTS) if "all" in words or not words else [p for p in PARTS if p in words]
    unknown = [w for w in words if w not in (*PARTS, "all")]
    if unknown:
        parser.error(f"unknown parts {unknown}: choose among {', '.join(PARTS)} or all")
    args.stores = [s for s in args.stores.split(",") if s]
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.threads = [int(s) for s in args.threads.split(",") if s]
    args.scale = [int(s) for s in args.scale.split(",") if s]
    if args.quick:
        args.n, args.repeats, args.trials, args.roundtrips = 100, 2, 3, 30
        args.sizes, args.scale = [10], [100]
    os.environ.setdefault("DJANGO_LEADER_LOG_LEVEL", "WARNING")
    began = time.time()
    setup()
    import render

    results: dict[str, Any] = {}
    if RESULTS.exists():
        results = json.loads(RESULTS.read_text())
    results["environment"] = environment()
    print(f"bench: parts {', '.join(parts)}; {json.dumps(results['environment'])}", flush=True)
    failed: list[str] = []
    for part in parts:
        print(f"== {part}", flush=True)
        watch = LoadWatch()
        started = time.time()
        try:
            data = RUNNERS[part](args)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            failed.append(part)
            data = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
        results[part] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "seconds": time.time() - started,
            "load": watch.stop(),
            "quick": args.quick,
            "data": data,
        }
        print(f"== {part}: {results[part]['seconds']:.0f} s", flush=True)
    results["run"] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
        "parts": parts,
        "seconds": time.time() - began,
    }
    if not args.no_write:
        OUT.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        render.write(results, PAGE, OUT)
        print(f"wrote {PAGE.relative_to(ROOT)} and {OUT.relative_to(ROOT)}/*.png")
    print(f"(the run took {time.time() - began:.0f} s)")
    if failed:
        sys.exit(f"parts that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
