"""The PNG plots of docs/benchmarks.md (matplotlib), from the results of ``bench/report.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAMES = {
    "sqlite": "SQLite",
    "postgresql": "PostgreSQL",
    "mariadb": "MariaDB",
    "redis": "Redis",
    "zookeeper": "ZooKeeper",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ops(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    kinds = ["ping", "raw renew", "renew", "acquire", "release", "lock()"]
    stores = [s for s in NAMES if s in data["stores"]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        xs = [i + (k - len(kinds) / 2 + 0.5) * width for i in range(len(stores))]
        found = [data["stores"][s].get(kind) for s in stores]
        medians = [f["median"] * 1000 if f else 0 for f in found]
        p99s = [f["p99"] * 1000 if f else float("nan") for f in found]
        ax.bar(xs, medians, width, label=kind)
        ax.scatter(xs, p99s, marker="_", color="black", s=60, zorder=3)
    ax.scatter([], [], marker="_", color="black", label="p99")
    ax.set_xticks(range(len(stores)), [NAMES[s] for s in stores])
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log scale): bar = median")
    ax.set_title("Lease operations, one call at a time")
    ax.legend(ncol=4, fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    _save(plt, fig, path)


def failover(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, sig, title in (
        (axes[0], "graceful", "SIGTERM", "Graceful handover (SIGTERM)"),
        (axes[1], "crash", "SIGKILL", "Crash failover (SIGKILL)"),
    ):
        labels, series = [], []
        for store in NAMES:
            if store in data[key]:
                labels.append(NAMES[store])
                series.append([g * 1000 for g in data[key][store]["gaps"]])
        for tool in ("celery-redbeat", "single-beat"):
            gaps = data["peers"].get(tool, {}).get(sig)
            if isinstance(gaps, list) and gaps:
                labels.append(tool)
                series.append([g * 1000 for g in gaps])
        if series:
            ax.boxplot(series, whis=(0, 100))
            for i, values in enumerate(series, start=1):
                ax.scatter([i] * len(values), values, s=8, alpha=0.5)
            ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right")
        if key == "graceful":
            ax.set_yscale("log")
        else:
            bound = (data["ttl"] + data["retry"]) * 1000
            ax.axhline(bound, color="red", linestyle="--", label="ttl + retry")
            ax.legend(fontsize=8)
        ax.set_ylabel("signal → next leader (ms)")
        ax.set_title(title)
        ax.grid(axis="y", which="both", alpha=0.3)
    _save(plt, fig, path)


def load(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in data["rows"]:
        store, mode, size, requests = row[0], row[1], int(row[2]), float(row[5])
        lines.setdefault((store, mode), []).append((size, max(requests, 0.5)))
    for (store, mode), points in sorted(lines.items()):
        points.sort()
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            linestyle="-" if mode == "fifo" else "--",
            label=f"{NAMES.get(store, store)} {mode}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("waiting candidates")
    ax.set_ylabel("requests to the store per handover")
    ax.set_title("Store load of one graceful handover")
    ax.legend(fontsize=8)
    ax.grid(which="both", alpha=0.3)
    _save(plt, fig, path)


def celery(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    labels, medians, p99s = [], [], []
    for store in ("redis", "postgresql"):
        found = data.get(store)
        if not isinstance(found, dict):
            continue
        for where, kinds in found.items():
            for tool, s in kinds.items():
                if tool == "plain":
                    continue
                labels.append(f"{tool}\n{NAMES[store]}, {where}")
                medians.append((s["median"] - kinds["plain"]["median"]) * 1000)
                p99s.append((s["p99"] - kinds["plain"]["p99"]) * 1000)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], medians, 0.4, label="added median")
    ax.bar([x + 0.2 for x in xs], p99s, 0.4, label="added p99")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("ms added to a no-op task")
    ax.set_title("What a unique task costs")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _save(plt, fig, path)


def scale(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    rows = [r for r in data["results"] if "failed" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    labels = [f"{NAMES[r['store']]}\n{r['leases']:,} asked\n{r['held']:,} held" for r in rows]
    xs = list(range(len(rows)))
    for ax, key, title in (
        (axes[0], "threads", "threads of the process"),
        (axes[1], "connections", "connections to the store"),
        (axes[2], "requests_per_s", "store requests per second"),
    ):
        bars = ax.bar(xs, [r[key] or 0 for r in rows])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_title(title)
        ax.set_yscale("symlog")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Leases held by one process (lock(), ttl 6 s)")
    _save(plt, fig, path)


def draw(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for key, make in (
        ("ops", ops),
        ("failover", failover),
        ("load", load),
        ("celery", celery),
        ("scale", scale),
    ):
        part = results.get(key)
        if part and "failed" not in part["data"]:
            try:
                make(part["data"], out / f"{key}.png")
            except Exception as exc:  # a plot must not lose the page
                print(f"plot {key}: {exc!r}")
