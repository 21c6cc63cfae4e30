"""The checker of a chaos run: pure Python over the records the run logged.

Every record is a dict with ``ev`` (its kind) and ``t``, seconds on one system-wide
monotonic clock (``CLOCK_BOOTTIME``, the same in every process of the machine). The kinds:

``elected``       ``who`` began a term with ``token`` (an Elector's ``on_elected``; the
                  first line of a runleader payload, whose ``who`` is its runleader).
``act``           ``who`` acted as the leader with ``token``: it checked that it still leads
                  somewhere between ``t`` and ``t1`` (``t1`` defaults to ``t``).
``stepped_down``  ``who`` stopped leading (informative only).
``loop_blocked``  ``who`` (token ``token``) blocked its own event loop for ``seconds`` on
                  purpose: if it acts again with that token right after, it led all along,
                  and the pause is no time without a leader.
``row``           a fenced write as the database committed it: ``id`` (commit order: the
                  writes are serialized by the lease row lock), ``token``, ``who``, and
                  ``t``, when it was made inside ``lease.fenced()``.
``fault``         the nemesis injected ``kind`` at ``t``; the store answered again at
                  ``ready`` (``t`` for faults that leave the store up); ``lossy`` when the
                  store may have lost state (Redis flushed, restarted without persistence
                  or from an older snapshot), which allows the lock-delay; ``slack``,
                  seconds the fault's kind adds to the liveness bound (a partition's,
                  documented in docs/chaos.md; 0 by default).
``write``, ``write_error``
                  a fenced write by ``who`` with ``token`` committed (as the row ``id``,
                  made at ``t``) / failed with an error
                  other than ``LeadershipLost`` (a dead connection, a timeout).
``task_sent``, ``task_started``, ``task_done``
                  a singleton task ``task`` (its id) with lock ``key`` was sent, an
                  execution began / ended (``ok``: it completed). An execution that never
                  reports ``task_done`` ends at its ``end`` field, if any, else at its start.

What is checked (each failure is a :class:`Violation` named after its check):

``overlap``        no two holders act at once: no act with a token lower than one that
                   already acted, measured conservatively (the lower token's ``t`` after
                   the higher token's ``t1``).
``token-repeat``   a token is never given to two holders.
``token-back``     terms begin with ever greater tokens.
``fence-order``    fenced writes commit in token order.
``stale-write``    no fenced write is made with a token lower than one that already acted.
``fenced-result``  what a fenced write returned is what the store committed: the ``id``
                   that a ``write`` record reports is a row with that writer and time
                   (``Model.objects.create()`` inside ``fenced()`` got its own primary key).
``fenced-stuck``   a leader's fenced writes do not keep failing for longer than
                   TTL + RETRY_INTERVAL + grace after the store answers: a leader that
                   holds the lease but can do nothing must recover or step down.
``liveness``       after each fault a leader acts within TTL + RETRY_INTERVAL + lock-delay
                   (lossy faults only) + grace + the fault's ``slack``, counted from when
                   the store answers (``ready``).
``task-lost``      every singleton task sent completes at least once.
``task-overlap``   no two executions with one key run at once.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: The checks, in the order a report lists them.
CHECKS = (
    "overlap",
    "token-repeat",
    "token-back",
    "fence-order",
    "stale-write",
    "fenced-result",
    "fenced-stuck",
    "liveness",
    "task-lost",
    "task-overlap",
)


@dataclass(frozen=True)
class Params:
    """The timing the run used, which bounds the time to recover."""

    ttl: float
    retry_interval: float
    #: Seconds no candidate may acquire after the store lost state.
    lock_delay: float
    #: Slack on top of TTL + RETRY_INTERVAL + lock-delay (process start-up, scheduling).
    grace: float = 1.0
    #: A pause between two acts longer than this is a time without a leader.
    gap: float = 0.3
    #: The store may lose writes it acknowledged (an asynchronous standby promoted): a
    #: fenced write missing afterwards is then not a violation (its order still is).
    loses_writes: bool = False

    def bound(self, lossy: bool) -> float:
        """Seconds a leader may take to act again after a fault, once the store answers."""
        return self.ttl + self.retry_interval + (self.lock_delay if lossy else 0.0) + self.grace


@dataclass(frozen=True)
class Violation:
    check: str
    t: float
    message: str
    #: The kind of the last fault injected before ``t`` (None before the first).
    fault: str | None = None


@dataclass(frozen=True)
class Recovery:
    """How long after one fault a leader acted again."""

    kind: str
    t: float
    ready: float
    #: Seconds from ``ready`` until a leader acted; None when the run ended first.
    seconds: float | None
    bound: float

    @property
    def ok(self) -> bool:
        return self.seconds is None or self.seconds <= self.bound


@dataclass
class Result:
    violations: list[Violation] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    #: ``(who, token, start, end)`` of each stretch of acting, for the plot.
    intervals: list[tuple[str, int, float, float]] = field(default_factory=list)
    acts: int = 0
    terms: int = 0
    rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_check(self) -> dict[str, int]:
        counts = dict.fromkeys(CHECKS, 0)
        for violation in self.violations:
            counts[violation.check] = counts.get(violation.check, 0) + 1
        return counts


def check(records: Iterable[dict[str, Any]], params: Params) -> Result:
    """Check one run's records (in any order); the result lists every violation."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    end = 0.0
    for record in records:
        by_kind[record["ev"]].append(record)
        end = max(end, float(record.get("t1", record["t"])), float(record.get("ready", 0.0)))
    faults = sorted(by_kind["fault"], key=lambda r: r["t"])
    fault_times = [float(f["t"]) for f in faults]

    def fault_at(t: float) -> str | None:
        index = bisect.bisect_right(fault_times, t) - 1
        return None if index < 0 else str(faults[index]["kind"])

    found: list[tuple[str, float, str]] = []
    acts = sorted(by_kind["act"], key=lambda r: r["t"])
    result = Result(acts=len(acts), terms=len(by_kind["elected"]), rows=len(by_kind["row"]))
    overlaps = _overlaps(acts)
    found += overlaps
    found += _tokens(by_kind["elected"])
    found += _fenced(by_kind["row"], acts)
    if by_kind["row"]:  # the store's rows were read
        found += _results(by_kind["write"], by_kind["row"], params.loses_writes)
    readies = sorted(float(f.get("ready", f["t"])) for f in faults)
    found += _stuck(by_kind["write"] + by_kind["write_error"], readies, params.bound(False))
    found += _tasks(by_kind["task_sent"], by_kind["task_started"], by_kind["task_done"])
    # Acts out of token order are violations, not leadership: they do not end a time
    # without a leader.
    stale = {id(act) for act in overlaps.acts}
    leading = [a for a in acts if id(a) not in stale]
    leading += _bridges(by_kind["loop_blocked"], leading, params.gap)
    leading.sort(key=lambda r: r["t"])
    result.recoveries = _recoveries(leading, faults, params, end)
    for recovery in result.recoveries:
        if not recovery.ok:
            found.append((
                "liveness", recovery.t,
                f"after {recovery.kind} no leader acted for {recovery.seconds:.2f} s after "
                f"the store answered (bound {recovery.bound:.2f} s)",
            ))  # fmt: skip
    # Each violation is charged to the last fault before it; the acts of a holder that acts
    # on out of token order, to the last fault before its first such act.
    first_stale: dict[str, float] = {}
    for name, t, message in sorted(found, key=_t):
        if name == "overlap":
            first_stale.setdefault(message.split(" after ")[0], t)
    result.violations = [
        Violation(name, t, message, fault_at(
            first_stale.get(message.split(" after ")[0], t) if name == "overlap" else t))
        for name, t, message in sorted(found, key=_t)
    ]  # fmt: skip
    result.intervals = _intervals(acts, params.gap)
    return result


def _t(item: tuple[str, float, str]) -> float:
    return item[1]


def _term(act: dict[str, Any]) -> tuple[Any, Any]:
    return act.get("who"), act.get("token")


def _end(record: dict[str, Any]) -> float:
    return float(record.get("t1", record["t"]))


class _Found(list[tuple[str, float, str]]):
    """Violations, and the acts that made them."""

    acts: list[dict[str, Any]]


def _overlaps(acts: list[dict[str, Any]]) -> _Found:
    """Acts by a token lower than one that had certainly acted before."""
    by_end = sorted(acts, key=_end)
    found = _Found()
    found.acts = []
    seen = 0  # acts of by_end whose end is before the current act's start
    highest: dict[str, Any] | None = None
    for act in acts:
        while seen < len(by_end) and _end(by_end[seen]) < act["t"]:
            candidate = by_end[seen]
            if highest is None or candidate["token"] > highest["token"]:
                highest = candidate
            seen += 1
        if highest is not None and act["token"] < highest["token"]:
            found.acts.append(act)
            found.append((
                "overlap", float(act["t"]),
                f"{act['who']} acted with token {act['token']} after {highest['who']} had "
                f"acted with token {highest['token']} (at {_end(highest):.3f})",
            ))  # fmt: skip
    return found


def _tokens(elected: list[dict[str, Any]]) -> list[tuple[str, float, str]]:
    found = []
    holders: dict[int, str] = {}
    highest: dict[str, Any] | None = None
    for term in sorted(elected, key=lambda r: r["t"]):
        token, who = term["token"], term["who"]
        if token in holders and holders[token] != who:
            found.append((
                "token-repeat", float(term["t"]),
                f"token {token} given to {who}, already given to {holders[token]}",
            ))  # fmt: skip
        holders.setdefault(token, who)
        if highest is not None and token < highest["token"]:
            found.append((
                "token-back", float(term["t"]),
                f"{who} elected with token {token} after {highest['who']} was elected with "
                f"token {highest['token']}",
            ))  # fmt: skip
        if highest is None or token > highest["token"]:
            highest = term
    return found


def _fenced(rows: list[dict[str, Any]], acts: list[dict[str, Any]]) -> list[tuple[str, float, str]]:
    found = []
    highest: dict[str, Any] | None = None
    for row in sorted(rows, key=lambda r: r["id"]):
        if highest is not None and row["token"] < highest["token"]:
            found.append((
                "fence-order", float(row["t"]),
                f"fenced write {row['id']} by {row['who']} with token {row['token']} committed "
                f"after write {highest['id']} with token {highest['token']}",
            ))  # fmt: skip
        if highest is None or row["token"] >= highest["token"]:
            highest = row
    # A fenced write made while a greater token had already acted: its lease was gone.
    ends = sorted(acts, key=_end)
    end_times = [_end(a) for a in ends]
    running_max: list[dict[str, Any]] = []
    for act in ends:
        if not running_max or act["token"] > running_max[-1]["token"]:
            running_max.append(act)
        else:
            running_max.append(running_max[-1])
    for row in rows:
        index = bisect.bisect_left(end_times, row["t"]) - 1
        if index >= 0 and running_max[index]["token"] > row["token"]:
            before = running_max[index]
            found.append((
                "stale-write", float(row["t"]),
                f"fenced write {row['id']} by {row['who']} with token {row['token']} made after "
                f"{before['who']} had acted with token {before['token']}",
            ))  # fmt: skip
    return found


def _results(
    writes: list[dict[str, Any]], rows: list[dict[str, Any]], loses_writes: bool = False
) -> list[tuple[str, float, str]]:
    """Writes whose reported row is not the one the store holds (another writer or time,
    or none at all, unless the store may lose acknowledged writes: then a row missing, or
    holding a later write under the lost one's id, is not a violation)."""
    found = []
    by_id = {str(row["id"]): row for row in rows}
    for write in writes:
        if "id" not in write:
            continue
        row = by_id.get(str(write["id"]))
        if loses_writes and (row is None or float(row["t"]) > float(write["t"])):
            continue  # lost, its id given again to a later write by the promoted standby
        if row is None or row["who"] != write["who"] or abs(row["t"] - write["t"]) > 1e-5:
            held = "no such row" if row is None else f"the row is {row['who']}'s of {row['t']:.6f}"
            found.append((
                "fenced-result", float(write["t"]),
                f"{write['who']} (token {write['token']}) was told its fenced write of "
                f"{write['t']:.6f} is row {write['id']!r}: {held}",
            ))  # fmt: skip
    return found


def _stuck(
    writes: list[dict[str, Any]], readies: list[float], bound: float
) -> list[tuple[str, float, str]]:
    """Fenced writes of one term failing in a row for longer than ``bound``, counted from
    the first failure or from when the store last answered again, whichever is later."""
    found = []
    terms: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for write in writes:
        terms[(str(write["who"]), int(write["token"]))].append(write)
    for (who, token), attempts in terms.items():
        attempts.sort(key=lambda r: r["t"])
        failures: list[dict[str, Any]] = []
        for attempt in [*attempts, None]:
            if attempt is not None and attempt["ev"] == "write_error":
                failures.append(attempt)
                continue
            if failures:
                first, last = float(failures[0]["t"]), float(failures[-1]["t"])
                index = bisect.bisect_right(readies, last) - 1
                since = max(first, readies[index]) if index >= 0 else first
                if last - since > bound:
                    found.append((
                        "fenced-stuck", since + bound,
                        f"{who} (token {token}) failed {len(failures)} fenced writes in a row "
                        f"for {last - first:.2f} s ({failures[-1].get('error', '')})",
                    ))  # fmt: skip
                failures = []
    return found


def _bridges(
    blocks: list[dict[str, Any]], acts: list[dict[str, Any]], gap: float
) -> list[dict[str, Any]]:
    """A holder that blocked its own loop on purpose (``loop_blocked``, for ``seconds``) and
    then acted again with the same token led all along (a token once lost is never held
    again): its pause is no time without a leader. One stretch per such block, from the
    block to that next act, for the liveness check only."""
    bridges = []
    by_term: dict[tuple[str, int], list[float]] = defaultdict(list)
    for act in acts:
        by_term[(str(act["who"]), int(act["token"]))].append(float(act["t"]))
    for times in by_term.values():
        times.sort()
    for block in blocks:
        times = by_term.get((str(block["who"]), int(block["token"])), [])
        index = bisect.bisect_right(times, float(block["t"]))
        if index < len(times) and times[index] <= block["t"] + block.get("seconds", 0) + gap:
            bridges.append({"ev": "act", "t": float(block["t"]), "t1": times[index],
                            "who": block["who"], "token": block["token"]})  # fmt: skip
    return bridges


def _gaps(acts: list[dict[str, Any]], gap: float, end: float) -> list[tuple[float, float]]:
    """Stretches of time in which nobody acted (the last one runs to ``end``). A pause
    between two acts of one term (same holder, same token: a token once lost is never
    held again) is none: that holder led all along, only its loop did not run (a loaded
    machine, a collection), as for a ``loop_blocked`` (:func:`_bridges`)."""
    gaps = []
    covered: float | None = None
    term: tuple[Any, Any] | None = None
    for act in acts:
        if covered is not None and act["t"] - covered > gap and term != _term(act):
            gaps.append((covered, float(act["t"])))
        if covered is None or _end(act) >= covered:
            covered, term = _end(act), _term(act)
    if covered is not None and end - covered > gap:
        gaps.append((covered, end))
    return gaps


def _recoveries(
    acts: list[dict[str, Any]], faults: list[dict[str, Any]], params: Params, end: float
) -> list[Recovery]:
    """For each fault: from the store answering to the end of the first leaderless stretch
    it caused (one that ends after the fault and begins before its bound ran out, or before
    the next fault, whichever is first); 0 when the leader never stopped acting.

    A stretch begins with the last act before it, up to ``params.gap`` before the fault that
    caused it; one that begins that close to the next fault belongs to the next fault."""
    gaps = _gaps(acts, params.gap, end)
    recoveries = []
    for index, fault in enumerate(faults):
        start, ready = float(fault["t"]), float(fault.get("ready", fault["t"]))
        bound = params.bound(bool(fault.get("lossy"))) + float(fault.get("slack", 0.0))
        window = ready + bound
        if index + 1 < len(faults):
            window = min(window, float(faults[index + 1]["t"]) - params.gap)
        following = float(faults[index + 1]["t"]) if index + 1 < len(faults) else end
        seconds: float | None = 0.0
        for begin, finish in gaps:
            if finish > start and begin < window:
                seconds = max(0.0, finish - ready)
                # The run ended, or another fault came, before a leader was due: this
                # recovery cannot be measured (nor failed).
                if (following < finish or finish >= end) and following - ready <= bound:
                    seconds = None
                break
        recoveries.append(Recovery(str(fault["kind"]), start, ready, seconds, bound))
    return recoveries


def _tasks(
    sent: list[dict[str, Any]], started: list[dict[str, Any]], done: list[dict[str, Any]]
) -> list[tuple[str, float, str]]:
    found = []
    completed = {d["task"] for d in done if d.get("ok", True)}
    for task in sent:
        if task["task"] not in completed:
            found.append(("task-lost", float(task["t"]), f"task {task['task']} never completed"))
    # An execution is a task_started and the next task_done of the same task and process.
    finishes: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for d in sorted(done, key=lambda r: r["t"]):
        finishes[(d["task"], d.get("pid", d.get("who")))].append(float(d["t"]))
    runs: dict[Any, list[tuple[float, float, Any]]] = defaultdict(list)
    for s in sorted(started, key=lambda r: r["t"]):
        ends = finishes[(s["task"], s.get("pid", s.get("who")))]
        later = [e for e in ends if e >= s["t"]]
        finish = later[0] if later else float(s.get("end", s["t"]))
        if later:
            ends.remove(later[0])
        runs[s.get("key", s["task"])].append((float(s["t"]), finish, s["task"]))
    for key, executions in runs.items():
        executions.sort()
        latest_end, latest_task = None, None
        for begin, finish, task in executions:
            if latest_end is not None and begin < latest_end:
                found.append((
                    "task-overlap", begin,
                    f"task {task} with key {key!r} started while {latest_task} still ran",
                ))  # fmt: skip
            if latest_end is None or finish > latest_end:
                latest_end, latest_task = finish, task
    return found


def _intervals(acts: list[dict[str, Any]], gap: float) -> list[tuple[str, int, float, float]]:
    """Consecutive acts of one holder and token merged into stretches."""
    open_: dict[tuple[str, int], list[float]] = {}
    done: list[tuple[str, int, float, float]] = []
    for act in acts:
        key = (str(act["who"]), int(act["token"]))
        span = open_.get(key)
        if span is not None and act["t"] - span[1] <= gap:
            span[1] = max(span[1], _end(act))
            continue
        if span is not None:
            done.append((*key, span[0], span[1]))
        open_[key] = [float(act["t"]), _end(act)]
    done += [(*key, span[0], span[1]) for key, span in open_.items()]
    return sorted(done, key=lambda i: i[2])


def summary(values: list[float]) -> dict[str, float | None]:
    """min, median and p99 (nearest rank) of recovery times."""
    if not values:
        return {"min": None, "median": None, "p99": None}
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1))
    return {"min": ordered[0], "median": statistics.median(ordered), "p99": ordered[rank]}
