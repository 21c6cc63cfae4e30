"""The report of a chaos run: ``<store>.md`` (faults by kind, violations, recovery times),
``<store>.json`` (the same, for machines) and ``<store>.png`` (who led when)."""

from __future__ import annotations

import json
import platform
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.chaos import checker
from tests.chaos.harness import FAULTS, Outcome


def network_kinds() -> set[str]:
    """The names of the network faults (partitions, losses, delays)."""
    return {kind.name for kind in FAULTS if kind.network}


def clock_kinds() -> set[str]:
    """The names of the clock faults: each a wall-clock step (or slew), and ``clock-back``,
    the step back to the real time that ends each."""
    return {kind.name for kind in FAULTS if kind.clock} | {"clock-back"}


#: Violations quoted in full in the Markdown report (all are counted).
QUOTED = 15


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summarize(outcome: Outcome) -> dict[str, Any]:
    result, config = outcome.result, outcome.config
    kinds: dict[str, dict[str, Any]] = {}
    times: dict[str, list[float]] = defaultdict(list)
    for recovery in result.recoveries:
        entry = kinds.setdefault(recovery.kind, {"faults": 0, "violations": 0, "late": 0})
        entry["faults"] += 1
        entry["bound"] = round(max(entry.get("bound", 0.0), recovery.bound), 2)
        entry["late"] += 0 if recovery.ok else 1
        if recovery.seconds is not None:
            times[recovery.kind].append(recovery.seconds)
    by_fault: Counter[tuple[str, str]] = Counter()
    for violation in result.violations:
        kind = violation.fault or "(before any fault)"
        kinds.setdefault(kind, {"faults": 0, "violations": 0, "late": 0})["violations"] += 1
        by_fault[(kind, violation.check)] += 1
    for kind, entry in kinds.items():
        entry["recovery"] = checker.summary(times[kind])
    every = [s for r in result.recoveries if r.seconds is not None for s in [r.seconds]]
    return {
        "store": config.store,
        "seed": config.seed,
        "duration": config.duration,
        "elapsed": round(outcome.ended - outcome.started, 1),
        "timing": {
            "ttl": config.ttl,
            "renew_interval": config.renew_interval,
            "retry_interval": config.retry_interval,
            "lock_delay": config.params.lock_delay,
            "grace": config.params.grace,
        },
        "candidates": {"electors": config.electors, "runleaders": config.runleaders},
        "faults": len(result.recoveries),
        "network": bool(config.network),
        "partitions": sum(1 for r in result.recoveries if r.kind in network_kinds()),
        "clocks": bool(config.clocks),
        "clock_steps": sum(1 for r in result.recoveries if r.kind in clock_kinds()),
        "acts": result.acts,
        "terms": result.terms,
        "fenced_writes": result.rows,
        "violations": len(result.violations),
        "violations_by_check": result.by_check(),
        "violations_by_fault": [
            {"fault": kind, "check": check, "count": count}
            for (kind, check), count in sorted(by_fault.items())
        ],
        "by_kind": dict(sorted(kinds.items())),
        "recovery": checker.summary(every),
        "examples": [
            {
                "check": v.check,
                "fault": v.fault,
                "t": round(v.t - outcome.started, 3),
                "message": v.message,
            }
            for v in _examples(result.violations)
        ],
        "notes": outcome.notes,
        "machine": f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
    }


def _examples(violations: list[checker.Violation]) -> list[checker.Violation]:
    """The first violation of each (check, fault) pair, then the next ones, up to QUOTED."""
    first: dict[tuple[str, str | None], checker.Violation] = {}
    for violation in violations:
        first.setdefault((violation.check, violation.fault), violation)
    chosen = sorted(first.values(), key=lambda v: v.t)[:QUOTED]
    return chosen


def markdown(summary: dict[str, Any], png: str | None) -> str:
    t = summary["timing"]
    lines = [
        f"# Chaos run: {summary['store']}",
        "",
        f"`python -m tests.chaos --store {summary['store']} --duration "
        f"{summary['duration']:.0f} --seed {summary['seed']}"
        f"{' --network' if summary.get('network') else ''}` — {summary['faults']} faults "
        f"({summary.get('partitions', 0)} of them network faults, "
        f"{summary.get('clock_steps', 0)} wall-clock steps of a candidate) in "
        f"{summary['elapsed']:.0f} s; {summary['candidates']['electors']} Elector and "
        f"{summary['candidates']['runleaders']} runleader candidates; TTL {t['ttl']} s, renew "
        f"{t['renew_interval']} s, retry {t['retry_interval']} s, lock-delay {t['lock_delay']} s "
        f"(after a fault that loses store state). {summary['acts']} acts, {summary['terms']} "
        f"terms, {summary['fenced_writes']} fenced writes. {summary['machine']}.",
        "",
        f"**Violations: {summary['violations']}**"
        + (" — the run passes." if summary["violations"] == 0 else "."),
        "",
        "## Faults by kind",
        "",
        "Recovery: seconds from the store answering again after the fault until a leader "
        "acts (0 when the leader kept acting). Bound: TTL + RETRY_INTERVAL + 1 s, plus the "
        "lock-delay after a fault that loses store state, plus the slack of a network fault "
        '(docs/chaos.md, "Partitions"); the greatest bound of each kind is shown.',
        "",
        "| Fault | Injected | Violations after it | Late recoveries | Recovery min | median "
        "| p99 | Bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, entry in summary["by_kind"].items():
        r = entry["recovery"]
        lines.append(
            f"| {kind} | {entry['faults']} | {entry['violations']} | {entry['late']} | "
            f"{_seconds(r['min'])} | {_seconds(r['median'])} | {_seconds(r['p99'])} | "
            f"{_seconds(entry.get('bound'))} |"
        )
    r = summary["recovery"]
    lines += [
        f"| **all** | {summary['faults']} | {summary['violations']} | "
        f"{sum(e['late'] for e in summary['by_kind'].values())} | {_seconds(r['min'])} | "
        f"{_seconds(r['median'])} | {_seconds(r['p99'])} | |",
        "",
        "## Violations by check",
        "",
        "| Check | Violations |",
        "|---|---:|",
        *[f"| {check} | {count} |" for check, count in summary["violations_by_check"].items()],
        "",
    ]
    if summary["violations_by_fault"]:
        lines += [
            "Attributed to the last fault injected before each:",
            "",
            "| Fault | Check | Violations |",
            "|---|---|---:|",
            *[f"| {v['fault']} | {v['check']} | {v['count']} |"
              for v in summary["violations_by_fault"]],
            "",
            "First of each kind (seconds since the nemesis began):",
            "",
            *[f"- {e['t']:.2f} s, {e['check']} after {e['fault']}: {e['message']}"
              for e in summary["examples"]],
            "",
        ]  # fmt: skip
    if summary["notes"]:
        lines += ["Notes:", "", *[f"- {note}" for note in summary["notes"]], ""]
    if png:
        lines += ["## Who led when", "", f"![Who led when, {summary['store']}]({png})", ""]
    return "\n".join(lines)


def plot(outcome: Outcome, path: Path) -> bool:
    """A PNG of who acted when (one row per candidate slot, one colour per token), the
    faults and the violations; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    origin = outcome.started
    intervals = outcome.result.intervals
    config = outcome.config
    slots = [f"e{i}" for i in range(config.electors)] + [f"r{i}" for i in range(config.runleaders)]
    row = {slot: index for index, slot in enumerate(slots)}
    colours = plt.get_cmap("tab20")
    figure, axes = plt.subplots(figsize=(16, 1.2 + 0.45 * max(1, len(slots))))
    # One colour per token, by rank (tokens may be huge); the same colour twice is a
    # repeated token. Wide bars carry the token's last digits.
    rank = {token: index for index, token in enumerate(sorted({i[1] for i in intervals}))}
    span = max(1.0, outcome.ended - origin)
    for who, token, begin, end in intervals:
        y = row[who.split("-")[0]]
        axes.broken_barh([(begin - origin, max(end - begin, 0.05))], (y - 0.4, 0.8),
                         color=colours(rank[token] % 20))  # fmt: skip
        if end - begin > span / 40:
            axes.text((begin + end) / 2 - origin, y, f"…{token % 1000:03d}", ha="center",
                      va="center", fontsize=6)  # fmt: skip
    kinds = sorted({f["kind"] for f in outcome.faults})
    marks = plt.get_cmap("tab10")
    for fault in outcome.faults:  # a network fault: shaded while it lasted
        if "healed" in fault:
            axes.axvspan(fault["t"] - origin, fault["healed"] - origin, color="0.85", zorder=0)
    for index, kind in enumerate(kinds):
        xs = [f["t"] - origin for f in outcome.faults if f["kind"] == kind]
        axes.vlines(xs, -0.5, len(slots) - 0.5, colors=[marks(index % 10)], linewidth=0.6,
                    alpha=0.7, label=kind)  # fmt: skip
    bad = [v.t - origin for v in outcome.result.violations]
    if bad:
        axes.plot(bad, [len(slots) - 0.5] * len(bad), "rx", markersize=5, label="violation")
    axes.set_yticks(range(len(slots)))
    axes.set_yticklabels([("Elector " if s.startswith("e") else "runleader ") + s[1:]
                          for s in slots])  # fmt: skip
    axes.set_xlabel("seconds since the nemesis began (colour and label: fencing token)")
    axes.set_xlim(0, span)
    axes.set_title(f"{outcome.config.store}: who led when, {len(outcome.faults)} faults, "
                   f"{len(outcome.result.violations)} violations")  # fmt: skip
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write(outcome: Outcome, directory: Path) -> Path:
    """Write ``<store>.md``, ``<store>.json`` and ``<store>.png`` into ``directory``;
    return the Markdown file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    store = outcome.config.store
    summary = summarize(outcome)
    png = directory / f"{store}.png"
    drawn = plot(outcome, png)
    if not drawn:
        summary["notes"].append("no plot: matplotlib is not installed")
    (directory / f"{store}.json").write_text(json.dumps(summary, indent=2) + "\n")
    target = directory / f"{store}.md"
    target.write_text(markdown(summary, png.name if drawn else None))
    return target
