"""docs/benchmarks.md and its plots, from docs/benchmarks/results.json (``bench/report.py``).

python bench/render.py        # again from the saved results, without measuring
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STORE_NAMES = {
    "sqlite": "SQLite",
    "postgresql": "PostgreSQL",
    "mariadb": "MariaDB",
    "redis": "Redis",
    "zookeeper": "ZooKeeper",
}
ORDER = list(STORE_NAMES)
P99_SAMPLES = 100
BUSY_LOAD = 1.5
#: Repeats whose medians differ by more than this fraction of the median: flagged.
SPREAD = 0.25


def ms(seconds: float | None, digits: int = 2) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.{digits}f} ms"


def gap(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * q + 0.999999) - 1))]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def p99_cell(n: int, value: float, fmt: Any = ms) -> str:
    return fmt(value) + (" †" if n < P99_SAMPLES else "")


def part_header(part: dict[str, Any]) -> str:
    load = part["load"]
    busy = load["max"] > BUSY_LOAD
    text = (
        f"*Measured {part['date']}, {part['seconds']:.0f} s; load average (1 min) "
        f"{load['start']:.2f} at the start, {load['max']:.2f} at most, {load['end']:.2f} at "
        "the end"
    )
    if part.get("quick"):
        text += "; a **quick** smoke run (few samples): not for reading"
    text += ".*"
    if busy:
        text += (
            f"\n\n**Noisy:** the load average went above {BUSY_LOAD:g} on {2} cores while this "
            "part ran (other work on the machine, or the part's own processes): the tails "
            "(p99, max) are the machine's as much as the store's."
        )
    return text + "\n"


# -- the page ----------------------------------------------------------------------------------
INTRO = """\
# Benchmarks

`make bench` measures django-leader against every store it can reach on this machine and,
in the same run, the tools that do the same jobs (celery-redbeat, single-beat,
python-redis-lock, celery-singleton, installed from PyPI into `.venv-bench`, a virtualenv of
the bench's own), then writes this page and the plots in `docs/benchmarks/`. The numbers
below are that run's, unedited.

```console
make bench                            # every part, about 12 minutes
make bench BENCH="ops scale"          # some parts; the others keep their last results
make bench BENCH_ARGS="--stores redis,postgresql --trials 30"
.venv-bench/bin/python bench/render.py   # this page again from docs/benchmarks/results.json
```

The parts are `ops`, `failover`, `celery`, `load` and `scale` (`bench/report.py --help`);
each keeps its results in `docs/benchmarks/results.json` with its date and the machine's
load while it ran. Every process of the bench runs with the test project's settings and
`DEBUG = False` (`bench/settings.py`). It is not part of CI: the numbers need a machine at
rest. Marks: **†** a p99 from fewer than 100 samples (it is the largest sample or close to
it); **noisy** where the machine was loaded or the repeats disagree.
"""


def environment_section(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    run = results.get("run", {})
    packages = env.get("packages", {})
    servers = env.get("servers", {})
    peers = ", ".join(
        f"{p} {packages.get(p, '?')}"
        for p in ("celery-redbeat", "single-beat", "python-redis-lock", "celery-singleton")
    )
    drivers = ", ".join(
        f"{p} {packages.get(p, '?')}"
        for p in ("psycopg", "mysqlclient", "redis", "kazoo", "celery")
    )
    lines = [
        "## The machine and the versions\n",
        f"- Last run: {run.get('date', '?')}, parts {', '.join(run.get('parts', []))}, "
        f"{run.get('seconds', 0):.0f} s.",
        f"- {env.get('cpus')} CPUs ({env.get('cpu')}), {env.get('memory')} of memory; "
        f"{env.get('os')}.",
        f"- Python {env.get('python')}, Django {env.get('django')}; {drivers}.",
        "- Servers, on the same machine over TCP on 127.0.0.1: "
        + ", ".join(f"{k} {v}" for k, v in servers.items())
        + ". The `load` and `scale` parts start private PostgreSQL (`fsync` off), Redis and "
        "ZooKeeper servers of their own from the same installations.",
        f"- Peers: {peers}.",
        "- The machine is shared: other work (test suites) may run beside the bench; each "
        "part says how loaded it was.",
    ]
    return "\n".join(lines) + "\n"


def opening(part: dict[str, Any], *titles: str) -> tuple[dict[str, Any], list[str], str]:
    """A section's start: the part's data, its titles and header; and the whole section
    ("Failed: …") if the part failed, else ""."""
    data = part["data"]
    out = [*titles, part_header(part)]
    failed = "\n".join([*out, f"Failed: {data['failed']}\n"]) if "failed" in data else ""
    return data, out, failed


#: The ops kind of the acquisition's and the release's statements replayed (PostgreSQL).
RAW_LOCK = "raw acquire + release"


def ops_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(part, "## Lease operations: `bench/latency.py`\n")
    if failed:
        return failed
    out.append(
        f"One process, one thread, each call timed alone; {data['n']} samples per repeat, "
        f"{data['repeats']} repeats interleaved across the stores (median and p99 over all "
        f"{data['n'] * data['repeats']}; the medians of the repeats in brackets: how steady "
        "the machine was). **raw renew** is the statement django-leader's `renew` sent, "
        "captured from it and replayed with the driver alone on a connection of its own:\n"
    )
    for label in ORDER:
        if label in data["raw"]:
            out.append(f"- {STORE_NAMES[label]}: {data['raw'][label]};")
    out.append(
        "- **ping** is the driver's cheapest round trip (`SELECT 1`, `PING`, `exists`); "
        "**acquire** takes a free lease and **release** gives it back (history on: one "
        "history row each); **renew** renews a held one; **lock()** is "
        "`with lock(name): pass` (acquire, the renewer started and stopped, release): what "
        "`lock()` and `singleton_task` pay.\n"
    )
    rows = []
    noisy = []
    for label in ORDER:
        kinds = data["stores"].get(label)
        if not kinds:
            continue
        raw = kinds["raw renew"]["median"] if "raw renew" in kinds else None
        for kind in ("ping", "raw renew", "renew", "acquire", "release", "lock()", RAW_LOCK):
            if kind not in kinds:
                continue
            s = kinds[kind]
            reps = s["repeat_medians"]
            spread = (max(reps) - min(reps)) / s["median"] if s["median"] else 0
            if spread > SPREAD:
                noisy.append(f"{STORE_NAMES[label]} {kind}")
            ratio = f"{s['median'] / raw:.2f}x" if kind not in ("ping", RAW_LOCK) and raw else ""
            rows.append(
                [
                    STORE_NAMES[label],
                    f"**{kind}**" if kind in ("renew", "raw renew") else kind,
                    ms(s["median"], 3),
                    p99_cell(s["n"], s["p99"], lambda v: ms(v, 3)),
                    "["
                    + ", ".join(f"{r * 1000:.3f}" for r in reps)
                    + "]"
                    + (" noisy" if spread > SPREAD else ""),
                    ratio,
                ]
            )
    peer = data.get("peer")
    if isinstance(peer, dict):
        for kind in ("acquire", "extend", "release"):
            s = peer[kind]
            reps = s["repeat_medians"]
            rows.append(
                [
                    "Redis, python-redis-lock",
                    kind,
                    ms(s["median"], 3),
                    p99_cell(s["n"], s["p99"], lambda v: ms(v, 3)),
                    "[" + ", ".join(f"{r * 1000:.3f}" for r in reps) + "]",
                    f"{s['median'] / data['stores']['redis']['raw renew']['median']:.2f}x"
                    if "redis" in data["stores"]
                    else "",
                ]
            )
    out.append(
        table(["store", "operation", "median", "p99", "repeat medians (ms)", "/ raw renew"], rows)
    )
    pg = data["stores"].get("postgresql", {})
    if RAW_LOCK in pg and "lock()" in pg:
        out.append(
            f"PostgreSQL: `lock()` {ms(pg['lock()']['median'], 3)} against the acquisition's "
            f"and the release's statements replayed with psycopg alone (autocommit, the token "
            f"the acquisition returned put in the release), {ms(pg[RAW_LOCK]['median'], 3)}: "
            f"**{pg['lock()']['median'] / pg[RAW_LOCK]['median']:.2f}x**.\n"
        )
    if isinstance(peer, str):
        out.append(f"python-redis-lock: not measured ({peer}).\n")
    if noisy:
        out.append(
            f"**Noisy** (repeat medians more than {SPREAD:.0%} apart): {', '.join(noisy)}.\n"
        )
    if data.get("missing"):
        out.append("Not measured: " + "; ".join(data["missing"]) + ".\n")
    out.append("![Lease operations per store](benchmarks/ops.png)\n")
    return "\n".join(out)


def failover_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(
        part, "## Elections: `bench/elections.py`\n", "### Crash failover and graceful handover\n"
    )
    if failed:
        return failed
    ttl, renew, retry = data["ttl"], data["renew"], data["retry"]
    out.append(
        f"Three candidate processes of one name (`bench/election_candidate.py`, one "
        f"`Elector` each, `race` mode), `LEASE_TTL` {ttl:g} s, `RENEW_INTERVAL` {renew:g} s, "
        f"`RETRY_INTERVAL` {retry:g} s. **Graceful**: the leader gets `SIGTERM` "
        "(`Elector.stop()`: it releases the lease and the store wakes the others: "
        "LISTEN/NOTIFY on PostgreSQL, pub/sub on Redis, watches on ZooKeeper; SQLite and "
        "MariaDB cannot push, their followers poll every `RETRY_INTERVAL`); the time from the "
        "signal to the next leader's `on_elected`. **Crash**: `SIGKILL`; the others wait for "
        f"the lease to expire (promise: ≤ `LEASE_TTL` + `RETRY_INTERVAL` = {ttl + retry:g} s). "
        "Before each signal a random part of the polling (renewal) period passes. The "
        "graceful trials ran one store after the other; the crash trials of every store and "
        "the peers' trials ran side by side (they wait seconds for leases to expire; their "
        "processes start and stop around each other, which adds tens of milliseconds of "
        "jitter at most to gaps of seconds).\n"
    )
    out.append(
        "The peers, in the same run on the same Redis, three processes each: celery-redbeat "
        f"(`celery beat -S redbeat.RedBeatScheduler --max-interval {retry:g}`, lock timeout "
        f"{ttl:g} s) and single-beat (`single-beat sleep 3600`, `LOCK_TIME` 3 s, the "
        f"shortest its whole-second settings allow beside a heartbeat of "
        f"{retry:g} s); `SIGTERM` to the holder's main process, `SIGKILL` to its process "
        'group; the time is when the bench read the next process\'s "acquired lock" line '
        "(neither logs a finer time).\n"
    )
    rows = []
    cases = (("graceful (SIGTERM)", data["graceful"]), ("crash (SIGKILL)", data["crash"]))
    for kind, found in cases:
        for label in ORDER:
            if label not in found:
                continue
            gaps = found[label]["gaps"]
            within = ""
            if kind.startswith("crash"):
                within = f"{sum(g <= ttl + retry for g in gaps)} of {len(gaps)}"
            rows.append(
                [
                    kind,
                    f"django-leader, {STORE_NAMES[label]}"
                    + ("" if found[label]["wakeups"] else " (polling)"),
                    str(len(gaps)),
                    gap(statistics.median(gaps)),
                    p99_cell(len(gaps), pct(gaps, 0.99), gap),
                    gap(max(gaps)),
                    within,
                ]
            )
        sig = "SIGTERM" if kind.startswith("graceful") else "SIGKILL"
        for tool in ("celery-redbeat", "single-beat"):
            gaps = data["peers"].get(tool, {}).get(sig)
            if isinstance(gaps, list) and gaps:
                within = ""
                if sig == "SIGKILL":
                    within = f"{sum(g <= ttl + retry for g in gaps)} of {len(gaps)}"
                rows.append(
                    [
                        kind,
                        f"{tool}, Redis",
                        str(len(gaps)),
                        gap(statistics.median(gaps)),
                        p99_cell(len(gaps), pct(gaps, 0.99), gap),
                        gap(max(gaps)),
                        within,
                    ]
                )
            elif gaps:
                rows.append([kind, f"{tool}, Redis", "0", str(gaps), "", "", ""])
    out.append(
        table(
            ["signal", "who", "trials", "median", "p99", "max", f"within {ttl + retry:g} s"],
            rows,
        )
    )
    if data.get("errors"):
        out.append("Not measured: " + "; ".join(data["errors"]) + ".\n")
    out.append("![Failover and handover](benchmarks/failover.png)\n")
    return "\n".join(out)


def load_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(part, "### Store load per handover\n")
    if failed:
        return failed
    out.append(
        "What the store counts around one graceful handover with 10, 100 and 500 waiting "
        "candidates (Electors as threads, 100 per process, each with its own connection), "
        "`race` and `fifo`, on private servers started for the part (PostgreSQL with "
        "`pg_stat_statements`, Redis `INFO commandstats`, ZooKeeper `mntr`): "
        f"{data['rounds']} handovers each, counted for {data['window']:g} s from the stop of "
        "the leading Elector, the idle rate (measured over 3 s, once the candidates' joining "
        "has quietened: at most 5 requests a second) subtracted; `LEASE_TTL` 120 s so that "
        'the idle traffic stays out of the windows. "requests" are what the clients sent (on Redis '
        "the `EVALSHA`, `PUBLISH` and connection commands; the other commands ran inside "
        'the scripts), "commands run" what the store executed; "woken" and "acquire '
        'attempts" come from the candidates\' trace; "idle requests/s" what the clients '
        'sent while nothing happened, and "requests to join" while the candidates added '
        "for that row (10, then 90, then 400) joined the queue.\n"
    )
    out.append(table(data["header"], data["rows"]))
    out.append("![Store load per handover](benchmarks/load.png)\n")
    return "\n".join(out)


def celery_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(part, "## `singleton_task` overhead: `bench/celery_overhead.py`\n")
    if failed:
        return failed
    out.append(
        "A no-op `shared_task` against the same no-op made a `singleton_task` "
        "(`testproject/demoapp/tasks.py`), and on Redis the no-op made unique by "
        "celery-singleton (`bench/peer_tasks.py`; its lock is taken by `apply_async` in the "
        "caller and released by the worker after the task, each call with an argument of "
        "its own so that none finds the previous call's lock still held). **In process**: "
        "`task.apply()` (the Celery tracer, no broker: the lock's acquire, renewer and "
        "release alone). **Through a worker**: `apply_async().get()` one at a time through "
        "Redis (broker and results) and a prefork worker with one process: what a caller "
        "sees. The calls of the tasks compared are taken in turn (one of each, then again), "
        "so that a change of the machine's load weighs on each alike. The overhead is "
        "the difference of the medians (and of the p99s).\n"
    )
    rows = []
    for store in ("redis", "postgresql"):
        found = data.get(store)
        if not isinstance(found, dict):
            if found:
                rows.append([STORE_NAMES[store], str(found), "", "", "", ""])
            continue
        for where, kinds in found.items():
            plain = kinds["plain"]
            for tool, s in kinds.items():
                if tool == "plain":
                    continue
                rows.append(
                    [
                        STORE_NAMES[store],
                        where,
                        tool,
                        f"{ms(plain['median'], 3)} / {ms(plain['p99'], 3)}",
                        f"{ms(s['median'], 3)} / {ms(s['p99'], 3)}",
                        f"**{(s['median'] - plain['median']) * 1000:+.3f} ms** / "
                        f"{(s['p99'] - plain['p99']) * 1000:+.3f} ms",
                    ]
                )
    out.append(
        table(
            [
                "lease store",
                "measured",
                "tool",
                "plain task: median / p99",
                "unique task: median / p99",
                "added: median / p99",
            ],
            rows,
        )
    )
    if isinstance(data.get("celery-singleton"), str):
        out.append(f"celery-singleton: {data['celery-singleton']}.\n")
    out.append("![singleton_task overhead](benchmarks/celery.png)\n")
    return "\n".join(out)


def throughput_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(part, "## Locks per second in one process: `bench/throughput.py`\n")
    if failed:
        return failed
    out.append(
        "Each thread takes and gives back a lock of its own name as fast as it can "
        f"({data['seconds']:g} s per case, {data['repeats']} repeats interleaved across the "
        "cases; the median of the repeats, each repeat in brackets). python-redis-lock runs "
        "on the same Redis in the same run; **PING** / the driver's round trip is the "
        "ceiling of one Python process's client here (a lock takes two round trips). "
        "**ratio**: to the python-redis-lock row of the same threads.\n"
    )
    medians = data["medians"]
    rows = []
    for case, by_threads in data["rates"].items():
        for threads, values in by_threads.items():
            peer = medians.get("redis python-redis-lock", {}).get(threads)
            auto = medians.get("redis python-redis-lock auto_renewal", {}).get(threads)
            ratio = ""
            if case.startswith("redis lock()") and peer and auto:
                mine = medians[case][threads]
                ratio = f"{mine / peer:.2f}x plain, {mine / auto:.2f}x auto"
            rows.append(
                [
                    case,
                    threads,
                    f"{medians[case][threads]:,.0f}/s",
                    "[" + ", ".join(f"{v:,.0f}" for v in values) + "]",
                    str(data["connections"].get(case, {}).get(threads, "")),
                    ratio,
                ]
            )
    out.append(table(["case", "threads", "locks/s", "repeats", "connections", "ratio"], rows))
    for reason in data.get("missing", []):
        out.append(f"Not measured: {reason}\n")
    return "\n".join(out)


def scale_section(part: dict[str, Any]) -> str:
    data, out, failed = opening(part, "## Many leases in one process: `bench/scale.py`\n")
    if failed:
        return failed
    renew_every = data["ttl"] / 3
    out.append(
        'One process (`bench/scale_holder.py`) enters `lock(f"scale-…-{i}", '
        f"ttl={data['ttl']:g})` for i < N in one `contextlib.ExitStack` (renewed every "
        f"{renew_every:g} s) and holds them all; private PostgreSQL (`max_connections` "
        f"{data['pg_max_connections']}, a stock server's) and Redis servers, started for "
        "the part, so that their counters see that process alone and nothing it does reaches "
        "the shared servers. Connections are counted by the server (`pg_stat_activity`, "
        f"`CLIENT LIST`), requests over {data['window_s']:g} s of holding (statements of "
        "`pg_stat_statements`, `BEGIN`/`COMMIT` included; commands sent by clients from "
        "`INFO commandstats`), threads by the process (all, and those named `leader-*`), "
        "renewal latency by the `renew` hook (`django_leader.hooks`). The holder stops "
        f"taking leases at the first store error, past {data['thread_cap']:,} threads (so "
        "that a thread-per-lease design cannot take the machine down) or after 90 s.\n"
    )
    rows = []
    for r in data["results"]:
        if "failed" in r:
            failed = f"failed: {r['failed']}"
            rows.append([STORE_NAMES[r["store"]], f"{r['leases']:,}", failed] + [""] * 8)
            continue
        held = f"{r['held']:,}"
        if r.get("stopped"):
            why = r["stopped"]
            if "FATAL:" in why:  # the server's words, without the connection string
                why = "PostgreSQL: " + " ".join(why.split("FATAL:", 1)[1].split())
            held += f" (then stopped: {why})"
        intervals = r["requests_per_s"] * renew_every
        rows.append(
            [
                STORE_NAMES[r["store"]],
                f"{r['leases']:,}",
                held,
                f"{r['acquire_s']:.1f} s",
                f"{r['threads']} ({r['leader_threads']})",
                str(r["connections"]),
                f"{r['requests_per_s']:.0f} ({intervals:.0f})",
                ms(r["renew_median"]),
                ms(r["renew_p99"]),
                f"{r['renewals']:,}",
                f"**{r['lost']}**",
            ]
        )
    out.append(
        table(
            [
                "store",
                "leases asked",
                "held",
                "to acquire",
                "threads (leader-*)",
                "connections",
                f"requests/s (per {renew_every:g} s interval)",
                "renew median",
                "renew p99",
                "renewals seen",
                "lost",
            ],
            rows,
        )
    )
    if data.get("missing"):
        out.append("Not measured: " + "; ".join(data["missing"]) + ".\n")
    out.append("![Many leases in one process](benchmarks/scale.png)\n")
    return "\n".join(out)


OTHERS = """\
## Other benchmarks

Not part of `make bench` (run them with `.venv-bench/bin/python bench/<script>.py --help`):

- `bench/elections.py` — the elections bench in full: graceful handover in `race` and
  `fifo` mode, with the store's wake-ups and without them (polling), where the time of a
  handover goes (from the candidates' trace), crash failover, the peers, and the store
  load part that `make bench` runs (`--parts`, `--stores`, `--profile`).
- `bench/celery_handover.py` — a highly available `celery beat`: LeaderScheduler against
  celery-redbeat and single-beat, slots missed or sent twice across `SIGKILL`, `SIGTERM`
  and `SIGSTOP` of the sending beat ([Celery](celery.md)).
- `bench/admin_changelist.py` — the admin's history list with 1,000,000 events
  ([admin](admin.md)).
- `bench/churn.py` — a churn of 100,000 lease names through `lock()`, then `leader
  prune`: what each store keeps before and after, and the metrics exposition's size
  ([commands](commands.md#what-a-churn-of-names-leaves)).
- `bench/ops.py` and `bench/failover.py` — the first, simpler versions of the `ops` and
  `failover` parts.
"""


def write(results: dict[str, Any], page: Path, out: Path) -> None:
    sections = [INTRO, environment_section(results)]
    for key, make in (
        ("ops", ops_section),
        ("throughput", throughput_section),
        ("failover", failover_section),
        ("load", load_section),
        ("celery", celery_section),
        ("scale", scale_section),
    ):
        if key in results:
            sections.append(make(results[key]))
    sections.append(OTHERS)
    page.write_text("\n".join(sections))
    import plots

    plots.draw(results, out)


def main() -> None:
    out = ROOT / "docs" / "benchmarks"
    results = json.loads((out / "results.json").read_text())
    write(results, ROOT / "docs" / "benchmarks.md", out)
    print("wrote docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()
