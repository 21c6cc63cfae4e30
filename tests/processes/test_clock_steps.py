"""Wall-clock steps and slews on a candidate, on every store, with real processes
(issue 24, "Clock steps").

Two candidates (``tests/procs/clock_candidate.py``) campaign for one name with TTL 3 s;
each runs under libfaketime with its own offset file, which the test rewrites: the wall
clock of that process alone moves (``time.time()``, ``datetime.now()``, every C library's
``CLOCK_REALTIME``), by an hour ahead or behind, or runs at twice or half speed, while
``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` (the lease clock) do not move, as with an NTP
step or an operator's ``date -s`` on another machine. The servers (PostgreSQL, MariaDB,
Redis, ZooKeeper) keep their clocks. Each step comes while the process leads, or while it
waits; then the leader is frozen past its TTL while both clocks are an hour behind, the
other takes over, and the deposed holder's fenced writes must be refused.

SQLite is different: its clock (``'now'``) is read by the process that runs the statement,
from the machine's clock, which every process of the machine shares: a step of one
process's wall clock alone cannot happen there, and a step of the machine's clock is a step
of the store's. So on SQLite both candidates share one offset file (the machine's clock):
an hour back, the takeover, then an hour forward, which docs/safety.md counts as a store
clock step ("What no lease can promise"): the follower may take the lease while the holder
still believes it leads; fenced writes still hold.

Every act (``lease.check()`` passed) and fenced write is stamped with ``CLOCK_BOOTTIME`` and
checked with the chaos suite's checker (:mod:`tests.chaos.checker`): no act with a lower
token after one with a higher token, tokens never repeat nor go back, fenced writes commit
in token order and never after a greater token acted, and after each step a leader acts
within TTL + RETRY_INTERVAL + 1 s (no lock-delay: nothing here makes a store forget).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from testproject.demoapp.models import FencedWrite
from tests.chaos.checker import Params, Violation, check
from tests.procs.common import clock
from tests.support.cluster import (
    PATIENCE,
    RETRY,
    STARTUP,
    STORES,
    Child,
    Cluster,
    Event,
    matches,
    open_cluster,
    open_store,
    report,
    wait_renewals,
)
from tests.support.stores import unavailable

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs libfaketime, /proc"),
]

#: Where Debian and Ubuntu (``apt-get install faketime``) put the multithreaded library.
LIBFAKETIME_PATHS = [
    Path(directory, "libfaketimeMT.so.1")
    for directory in (
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
        "/usr/local/lib/faketime",
    )
]
HOUR = 3600
#: The lease's TTL here, a second above the other multiprocess tests' (tests.support.cluster):
#: the leader must keep its lease through every step, and with TTL 2 s a ZooKeeper leader on
#: a loaded two-core machine (make test's four workers) once missed a renewal by its
#: deadline, a loss of load, not of a clock ("deadline passed while a renewal was still in
#: flight").
TTL = 3.0
#: And a renewal interval of 1 s, which bounds each store call at 0.9 s
#: (``Timing.call_timeout``): with 0.5 s, a ZooKeeper starved of CPU (stress-ng --cpu 4 on
#: two cores) let every renewal time out until the deadline passed, once in six runs.
RENEW = 1.0
#: The checker's slack on top of TTL + RETRY_INTERVAL for a loaded machine (the
#: multiprocess tests' TAKEOVER_BOUND allows the same).
GRACE = 1.0


def libfaketime() -> Path:
    """The library, else skip (in CI, where .ci/run installs it, fail)."""
    for path in LIBFAKETIME_PATHS:
        if path.exists():
            return path
    unavailable("libfaketime is not installed (apt-get install faketime)")


#: Every store but SQLite, whose clock is the machine's (see the module's docstring).
NETWORKED = [key for key in STORES if key != "sqlite"]


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The store (a key of ``STORES``, parametrized per test), skipped (in CI: failed)
    without libfaketime."""
    libfaketime()
    yield from open_store(request.param)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


class Clocks:
    """The candidates' wall clocks: one libfaketime offset file per candidate (or one for
    all, the machine's), and the steps made, as the checker's ``fault`` records."""

    def __init__(self, cluster: Cluster, shared: bool) -> None:
        self.cluster = cluster
        self.shared = shared
        self.library = libfaketime()
        self.faults: list[Event] = []

    def path(self, label: str) -> Path:
        return self.cluster.tmp_path / f"faketime-{'machine' if self.shared else label}"

    def spawn(self, label: str) -> Child:
        path = self.path(label)
        if not path.exists():
            path.write_text("+0\n")
        timing = {"TTL": str(TTL), "RENEW": str(RENEW), "RETRY": str(RETRY)}
        env = {f"DL_MP_{key}": value for key, value in timing.items()}
        # The same timing in the settings, which bound each store call of the backend.
        env.update({f"DJANGO_LEADER_{key}": value for key, value in timing.items()})
        preload = [str(self.library), *filter(None, [os.environ.get("LD_PRELOAD")])]
        env.update(
            LD_PRELOAD=" ".join(preload),
            FAKETIME_TIMESTAMP_FILE=str(path),
            FAKETIME_NO_CACHE="1",
            # An NTP step moves the wall clock only: the lease clock must stay real.
            FAKETIME_DONT_FAKE_MONOTONIC="1",
        )
        return self.cluster.spawn(label, "clock_candidate", **env)

    def set(self, kind: str, spec: str, *children: Child) -> float:
        """Set the wall clock of ``children`` (all of them, with a shared file) to
        libfaketime's ``spec`` (``+3600``, ``-3600 x0.5``...), record the step, and wait
        until each child reads it; the instant on the boot clock."""
        at = clock()
        for path in {self.path(child.label) for child in children}:
            staged = path.with_suffix(".new")
            staged.write_text(spec + "\n")
            staged.replace(path)  # whole: libfaketime reads the file on every call
        self.faults.append({"ev": "fault", "kind": kind, "t": at, "ready": at})
        offset = float(spec.split()[0])
        for child in children:
            skew = self.skew(child)
            # A rate (x2, x0.5) also moves the clock by the time since the process began.
            if "x" not in spec:
                assert abs(skew - offset) < 60, f"{child.label}'s clock is {skew:+.1f}s off"
        return at

    def skew(self, child: Child) -> float:
        """How far ``child``'s wall clock is from this process's, now."""
        reply = child.request("clock", "clock")
        return float(reply["wall"]) - (time.time() - (clock() - float(reply["boot"])))

    def rate(self, child: Child, seconds: float = 1.0) -> float:
        """How fast ``child``'s wall clock runs (1.0: as the boot clock)."""
        first = child.request("clock", "clock")
        time.sleep(seconds)  # time passing is what is measured
        second = child.request("clock", "clock")
        return (second["wall"] - first["wall"]) / (second["boot"] - first["boot"])


def other(children: list[Child], child: Child) -> Child:
    return next(c for c in children if c is not child)


def take_over(
    cluster: Cluster, clocks: Clocks, leader: Child, waiter: Child, token: int
) -> tuple[Event, float]:
    """Freeze ``leader`` right after a renewal until ``waiter`` is elected, then let it
    run: it has stepped down, and its lease (``token``) can write through ``fenced()``
    neither as it is nor as a copy that does not know it lost. The new term, and how long
    after the freeze it began."""
    after = leader.send("freeze")
    frozen = cluster.wait_for(matches("freezing", leader.label), "the freeze", PATIENCE, after)
    clocks.faults.append({"ev": "fault", "kind": f"{leader.label} (leader) frozen",
                          "t": frozen["t"], "ready": frozen["t"]})  # fmt: skip
    elected = cluster.wait_for(
        matches("elected", waiter.label), "the takeover", TTL + RETRY + PATIENCE, after
    )
    assert leader.state() == "T", f"{leader.label} ran again before the takeover"
    os.kill(leader.pid, signal.SIGCONT)
    resumed = cluster.wait_for(matches("resumed", leader.label), "the resume", PATIENCE, after)
    cluster.wait_for(matches("lost", leader.label, token=token), "the step-down", PATIENCE, after)
    assert not resumed["held"], f"{leader.label} still held its lease after the takeover"
    # With Redis and ZooKeeper the fence row refuses a token once a greater one wrote
    # (docs/safety.md); a database's lease row refuses it as soon as the lease changed.
    cluster.wait_for(
        matches("write", waiter.label, token=elected["token"]),
        "the new leader's write",
        after=after,
    )
    probe = leader.request("probe", "probe", token=token)
    assert probe["local_fence"].startswith("rejected"), probe
    assert probe["db_fence"].startswith("rejected"), f"{probe}\n{cluster.describe()}"
    assert elected["token"] > token, (elected, token)
    return elected, elected["t"] - frozen["t"]


def check_run(
    cluster: Cluster,
    clocks: Clocks,
    children: list[Child],
    allowed: Callable[[Violation], bool] = lambda violation: False,
) -> tuple[list[Violation], list[Violation]]:
    """Stop the children, read their fenced rows, run the chaos checker over everything:
    the violations, and those of them ``allowed`` excuses."""
    cluster.kill_all()
    label = {child.identity: child.label for child in children}
    records: list[Event] = [
        event
        for event in cluster.select(lambda event: True)
        if event["ev"] in ("elected", "act", "write", "write_error")
    ]
    rows = FencedWrite.objects.using(cluster.db_alias).filter(writer__in=list(label))
    probes = [row for row in rows if row.note.startswith("probe")]
    assert not probes, f"a deposed holder's fenced write committed: {probes}"
    for row in rows:
        records.append(
            {"ev": "row", "id": row.pk, "token": row.token, "who": label[row.writer],
             "t": float(row.note)}
        )  # fmt: skip
    result = check(
        [*records, *clocks.faults],
        Params(ttl=TTL, retry_interval=RETRY, lock_delay=0.0, grace=GRACE),
    )
    assert result.rows > 0 and result.terms >= 2, (result.rows, result.terms)
    for recovery in result.recoveries:
        print(f"{recovery.kind}: a leader acted {recovery.seconds} s after (<= {recovery.bound})")
    excused = [violation for violation in result.violations if allowed(violation)]
    return [violation for violation in result.violations if not allowed(violation)], excused


@pytest.mark.parametrize("store", NETWORKED, indirect=True)
def test_wall_clock_steps_on_a_candidate_change_nothing(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """One candidate's wall clock an hour ahead, then an hour behind, while it leads; the
    same for the other while it waits; the leader frozen past its TTL with both clocks an
    hour behind (the waiter takes over, the frozen one's fenced writes are refused); the new
    leader's clock two hours ahead; then both clocks slewed (twice and half speed). The
    leader keeps its lease through every step and slew, no one acts out of token order,
    and a frozen leader is replaced within TTL + RETRY_INTERVAL (+1 s)."""
    clocks = Clocks(cluster, shared=False)
    children = [clocks.spawn("a"), clocks.spawn("b")]
    cluster.wait_ready(children)
    first = cluster.wait_for(matches("elected"), "a first leader", STARTUP)
    leader = cluster.children[first["who"]]
    waiter, token = other(children, leader), first["token"]
    wait_renewals(cluster, leader.label, token, 1)

    # While it leads: an hour ahead, then an hour behind (two hours back).
    clocks.set(f"{leader.label} (leader) +1 h", f"+{HOUR}", leader)
    wait_renewals(cluster, leader.label, token, 2)
    clocks.set(f"{leader.label} (leader) -1 h", f"-{HOUR}", leader)
    wait_renewals(cluster, leader.label, token, 2)
    # While it waits: an hour ahead (a follower comparing the expiry with its wall clock
    # would take the lease at its next poll), then an hour behind.
    clocks.set(f"{waiter.label} (waiter) +1 h", f"+{HOUR}", waiter)
    wait_renewals(cluster, leader.label, token, 3)  # >= 3 polls of the waiter
    clocks.set(f"{waiter.label} (waiter) -1 h", f"-{HOUR}", waiter)
    wait_renewals(cluster, leader.label, token, 2)

    # Both an hour behind: the waiter takes over a frozen leader in time, and the frozen
    # one (whose wall clock says its lease has an hour left) is fenced off.
    second, takeover = take_over(cluster, clocks, leader, waiter, token)
    leader, waiter, token = waiter, leader, second["token"]
    wait_renewals(cluster, leader.label, token, 1)
    clocks.set(f"{leader.label} (leader) +1 h from -1 h", f"+{HOUR}", leader)
    wait_renewals(cluster, leader.label, token, 2)

    # Slews: the leader's wall clock at twice the speed, the waiter's at half (libfaketime
    # starts a rate with a step by the time since the process began, times rate - 1).
    clocks.set(f"{leader.label} (leader) x2", f"+{HOUR} x2", leader)
    clocks.set(f"{waiter.label} (waiter) x0.5", f"-{HOUR} x0.5", waiter)
    fast, slow = clocks.rate(leader), clocks.rate(waiter)
    assert 1.7 < fast < 2.3 and 0.35 < slow < 0.65, (fast, slow)
    wait_renewals(cluster, leader.label, token, 3)

    violations, _ = check_run(cluster, clocks, children)
    report(request, takeover=takeover)
    assert not violations, "\n".join(map(str, violations)) + "\n" + cluster.describe()


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_sqlite_machine_clock_steps(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """SQLite (see the module's docstring): the machine's clock, which SQLite reads, an
    hour behind while one process leads and the other waits; the leader frozen past its
    TTL then (the waiter takes over in time, the frozen one is fenced off); then an hour
    forward, a store clock step forward: the lease may change hands while its holder still
    believes it leads, for at most TTL after the step; fenced writes, token order and the
    liveness bound hold throughout."""
    assert isinstance(store, DatabaseBackend) and store.vendor == "sqlite"
    clocks = Clocks(cluster, shared=True)
    children = [clocks.spawn("a"), clocks.spawn("b")]
    cluster.wait_ready(children)
    first = cluster.wait_for(matches("elected"), "a first leader", STARTUP)
    leader = cluster.children[first["who"]]
    waiter, token = other(children, leader), first["token"]
    wait_renewals(cluster, leader.label, token, 1)

    clocks.set("machine -1 h", f"-{HOUR}", *children)
    wait_renewals(cluster, leader.label, token, 3)
    second, takeover = take_over(cluster, clocks, leader, waiter, token)
    wait_renewals(cluster, second["who"], second["token"], 1)

    forward = clocks.set("machine +1 h (the store's clock steps forward)", "+0", *children)
    renewal = cluster.wait_for(
        lambda event: matches("deadline")(event) and event["t"] > forward,
        "a renewal after the step",
    )
    wait_renewals(cluster, renewal["who"], renewal["token"], 2)

    def forward_step_overlap(violation: Violation) -> bool:
        # The holder's deadline is at most TTL after its last renewal, before the step.
        return violation.check == "overlap" and forward <= violation.t <= forward + TTL

    violations, excused = check_run(cluster, clocks, children, allowed=forward_step_overlap)
    handed = cluster.select(lambda event: event["ev"] == "elected" and event["t"] > forward)
    late = max((violation.t - forward for violation in excused), default=0.0)
    print(f"forward step: the lease changed hands {len(handed)} time(s); acts out of token "
          f"order (the documented limit): {len(excused)}, the last {late:.3f} s after the "
          "step")  # fmt: skip
    report(request, takeover=takeover)
    assert not violations, "\n".join(map(str, violations)) + "\n" + cluster.describe()
