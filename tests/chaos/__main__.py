"""``python -m tests.chaos --store STORE [--duration S] [--seed N] [--report DIR]``, or
``python -m tests.chaos --recheck WORKDIR [--report DIR]`` for the records a run kept.

Runs the chaos harness against a private instance of the store, prints the summary and,
with ``--report``, writes ``STORE.md``, ``STORE.json`` and ``STORE.png`` there. Exits 0 when
the checker found no violation, 1 when it found some, 2 when the run could not be made
(a store that cannot be started here, no leader at all).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from tests.chaos import harness, report
from tests.chaos.stores import STORES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--store", choices=sorted(STORES))
    parser.add_argument(
        "--recheck",
        type=Path,
        metavar="WORKDIR",
        help="check the records kept in WORKDIR again (no new run)",
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", type=Path, help="directory for STORE.md/.json/.png")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--renew-interval", type=float, default=0.5)
    parser.add_argument("--retry-interval", type=float, default=0.5)
    parser.add_argument("--lock-delay", type=float, help="default: the TTL")
    parser.add_argument("--electors", type=int, default=3)
    parser.add_argument("--runleaders", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="keep logs and the store here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--network",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="candidates and store in network namespaces, partitions among the faults "
        "(default: where namespaces can be made, for every store but SQLite)",
    )
    parser.add_argument(
        "--clocks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="candidates under libfaketime, wall-clock steps among the faults "
        "(default: where libfaketime is installed, for every store but SQLite)",
    )
    parser.add_argument(
        "--faults",
        default="",
        help="only these fault kinds, comma-separated ('partition': every network fault, "
        "'clock': every clock fault, 'store': the store's own faults)",
    )
    args = parser.parse_args(argv)
    if args.recheck is None and args.store is None:
        parser.error("--store is required (or --recheck WORKDIR)")
    config = harness.Config(
        store=args.store or "", duration=args.duration, seed=args.seed, ttl=args.ttl,
        renew_interval=args.renew_interval, retry_interval=args.retry_interval,
        lock_delay=args.lock_delay, electors=args.electors, runleaders=args.runleaders,
        workdir=args.workdir, keep=args.keep, network=args.network, clocks=args.clocks,
        kinds=tuple(k for k in args.faults.split(",") if k),
    )  # fmt: skip

    def say(line: str) -> None:
        print(f"chaos {args.store or args.recheck}: {line}", flush=True)

    # SIGTERM (and SIGINT, which a shell may have ignored for a background job) end the
    # run through its cleanup: every process of the run killed, the servers stopped.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        outcome = harness.recheck(args.recheck) if args.recheck else harness.run(config, log=say)
    except RuntimeError as exc:
        say(f"could not run: {exc}")
        return 2
    args.store = outcome.config.store
    summary = report.summarize(outcome)
    if args.report is not None:
        say(f"report: {report.write(outcome, args.report)}")
    if config.keep or config.workdir is not None:
        say(f"logs: {outcome.workdir}")
    brief = {k: summary[k] for k in ("faults", "violations", "violations_by_check", "recovery")}
    say(json.dumps(brief))
    for kind, entry in summary["by_kind"].items():
        r = entry["recovery"]
        say(f"  {kind:26} {entry['faults']:4} faults {entry['violations']:6} violations "
            f"{entry['late']:3} late  recovery min {report._seconds(r['min'])} median "
            f"{report._seconds(r['median'])} p99 {report._seconds(r['p99'])}")  # fmt: skip
    for example in summary["examples"]:
        say(f"  {example['t']:8.2f} s {example['check']} after {example['fault']}: "
            f"{example['message']}")  # fmt: skip
    return 0 if outcome.result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
