"""Elections: handover time with and without wake-ups, store load per handover, and the
peers (celery-redbeat, single-beat), measured in one run on this machine.

    python bench/elections.py [--trials 20] [--crash-trials 10] [--reference-trials 10]
        [--peer-trials 10] [--parts handover,reference,crash,peers,load]
        [--sizes 10,100,500] [--stores postgresql,redis,sqlite,mariadb,zookeeper]
        [--modes race,fifo] [--profile]

**handover** — three candidate processes of one name (``bench/election_candidate.py``,
one Elector each, its campaign in the main thread); the leader gets ``SIGTERM``
(``Elector.stop()``: it releases the lease, then wakes the next), and the time from the
signal to the next ``elected`` (the new leader's ``on_elected``) is measured, ``--trials``
times, on PostgreSQL and Redis, in ``race`` and ``fifo`` mode, with the store's wake-ups
(LISTEN/NOTIFY, pub/sub) and without them (``--no-wakeups``: the followers poll every
``retry_interval``), and on ZooKeeper (watches) with wake-ups only: its polling is every
other store's. ZooKeeper is the one of the test project's settings (127.0.0.1:2181 unless
``DJANGO_LEADER_ZOOKEEPER_HOSTS`` says otherwise), under a ``ROOT`` of this run's own
(``/django-leader-bench-<pid>``, initialized, deleted at the end), with ``LEASE_TTL`` the
bench's ttl, so that the session timeout asked for is the ttl (a server grants at least
two ticks: 4 s on 2181). The stopped process then campaigns again as a new candidate, as a
replacement process would, without a start-up competing with the next trial for the CPU.
Before each signal the bench waits a random part of ``retry_interval``, so that the
signal falls at a random point of the followers' polling. Every call the candidates make
to the store is traced, which gives where the time of a handover goes (``--profile``
prints each trial's steps). The candidates woken per handover are counted from the trace
too: the distinct followers whose watch fired between the signal and the next trial's.

**reference** — SQLite and MariaDB (no wake-ups there: polling only), ``race``.

**crash** — ``SIGKILL`` of the leader, with wake-ups: the next leader must wait for the
lease to expire; the promise is at most ``ttl + retry_interval``. (On ZooKeeper the lease
also goes when the dead holder's session ends, which on 2181 is after 4 s: its ttl of 2 s
ends it first.) A spare process, loaded
ahead, replaces the killed one.

**peers** — celery-redbeat (``celery beat -S redbeat.RedBeatScheduler``) and single-beat
(``single-beat sleep 3600``) with the same lock lifetime and polling period, on the test
project's Redis: three processes of each, the lock holder gets ``SIGTERM``, and the time
to the next ``beat: Acquired lock`` / ``acquired lock`` line is measured (when the bench
reads it: neither logs a precise time). Needs ``pip install celery-redbeat single-beat``
(``make bench`` installs them).

**load** — what the store counts around one graceful handover with 10, 100 and 500 waiting
candidates (Electors as threads, at most 100 per process), ``race`` and ``fifo``, on a
private PostgreSQL with ``pg_stat_statements``, a private Redis (``INFO commandstats``)
and a private ZooKeeper (``mntr``: packets received and sent, reads and writes, watch
notifications; from ``tests/support/zookeeper_server.py``, whose session bounds allow the
part's 120-second ttl), started for the run: the shared servers' counters would count the
other clients too, and the shared PostgreSQL allows 100 connections (each waiting Elector
holds one). The handover is ``stop`` of the leading Elector (the same path as SIGTERM);
the counters are read before it and :data:`LOAD_WINDOW` seconds after, and the idle rate,
measured just before (:data:`IDLE_WINDOW`), is subtracted. The trace gives how many
candidates were woken and how many tried to acquire.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from _setup import ROOT, SETTINGS, migrate, setup

CANDIDATE = str(Path(__file__).resolve().with_name("election_candidate.py"))
ZOOKEEPER_BACKEND = "django_leader.backends.zookeeper.ZooKeeperBackend"
#: The timing of the handover, crash and peer parts: a crash costs at most ttl + retry.
TTL, RENEW, RETRY = 2.0, 0.5, 1.0
#: The timing of the load part: long, so that the idle traffic (a heartbeat every ttl/3
#: per candidate, polls) is small beside a handover's.
LOAD_TTL, LOAD_RENEW, LOAD_RETRY = 120.0, 40.0, 40.0
#: Candidates per process in the load part.
PER_PROCESS = 100
#: Seconds counted after each handover of the load part.
LOAD_WINDOW = 1.5
#: Newly started candidates join in a burst (each lists the queue, creates its entry,
#: arms its watches): before the idle rate is measured, the load part waits until the
#: clients send at most QUIET requests a second over a QUIET_WINDOW, for QUIET_FOR seconds
#: at most. The idle rate is measured over IDLE_WINDOW: two handover windows, since the
#: idle traffic comes in bursts (heartbeats, polls) that a short window over- or
#: under-counts, and the handover's count is what is left once it is subtracted.
QUIET, QUIET_WINDOW, QUIET_FOR = 5.0, 0.5, 30.0
IDLE_WINDOW = 2 * LOAD_WINDOW
#: Handovers per configuration of the load part.
LOAD_ROUNDS = 3
#: The columns of the load table (load_row), here and in bench/report.py.
LOAD_HEADER = [
    "store",
    "mode",
    "waiting",
    "woken",
    "acquire attempts",
    "requests",
    "commands run",
    "of which (mean per handover)",
    "handover",
    "idle requests/s",
    "requests to join",
]
#: The parts, in the order they run.
PARTS = ("handover", "reference", "crash", "peers", "load")
#: Before each signal: a pause, plus a random part of the followers' polling period (of
#: the leader's renewal period before a SIGKILL: the rest of its lease).
SETTLE, JITTER, CRASH_JITTER = 0.1, RETRY, RENEW


def clock() -> float:
    return time.time()


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


# -- processes and their lines ----------------------------------------------------------
class Log:
    """Every line of every process, in the order they arrived: (pid, received, words)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lines: list[tuple[int, float, list[str]]] = []

    def add(self, pid: int, words: list[str]) -> None:
        with self.cond:
            self.lines.append((pid, clock(), words))
            self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return len(self.lines)

    def since(self, mark: int) -> list[tuple[int, float, list[str]]]:
        with self.cond:
            return list(self.lines[mark:])

    def wait(
        self,
        found: Callable[[int, float, list[str]], bool],
        mark: int,
        timeout: float,
    ) -> tuple[int, float, list[str]] | None:
        """The first line from ``mark`` on for which ``found`` is true, waiting for it."""
        give_up = clock() + timeout
        with self.cond:
            index = mark
            while True:
                while index < len(self.lines):
                    line = self.lines[index]
                    index += 1
                    if found(*line):
                        return line
                remaining = give_up - clock()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)

    def until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        give_up = clock() + timeout
        with self.cond:
            while not condition():
                remaining = give_up - clock()
                if remaining <= 0:
                    raise RuntimeError(f"timed out waiting for {what}")
                self.cond.wait(min(remaining, 0.5))


class Proc:
    """A child process whose output lines go to ``log`` (stderr too)."""

    def __init__(self, log: Log, argv: list[str], env: dict[str, str], stdin: bool = False):
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.loaded = False
        self.ready: set[str] = set()
        #: "started", "loaded", "ready" (or elected), "stopped" (--rejoin), or "go" (sent)
        self.state = "started"
        self.tail: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words[:1] == ["loaded"]:
                self.loaded = True
                self.state = "loaded"
            elif words[:1] in (["ready"], ["elected"]) and len(words) > 1:
                self.ready.add(words[1])  # the leader never announces: it is ready too
                self.state = "ready"
            elif words[:1] == ["stopped"]:
                self.state = "stopped"
            elif words[:1] not in (["T"], ["elected"]):
                self.tail = [*self.tail[-30:], line.rstrip()]
            self.log.add(self.pid, words)
        with self.log.cond:
            self.log.cond.notify_all()

    def send(self, text: str) -> None:
        if text == "go":
            self.state = "go"
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    def finish(self, timeout: float = 10.0) -> None:
        """Wait for the process to exit (SIGKILL after ``timeout``), and its last lines."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)

    def kill(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.finish()


def candidate_argv(
    name: str,
    mode: str,
    wakeups: bool,
    timing: tuple[float, float, float],
    electors: int = 1,
    wait: bool = True,
    rejoin: bool = False,
) -> list[str]:
    ttl, renew, retry = timing
    argv = [
        sys.executable,
        CANDIDATE,
        name,
        "--ttl",
        str(ttl),
        "--renew",
        str(renew),
        "--retry",
        str(retry),
        "--mode",
        mode,
        "--trace",
        "--electors",
        str(electors),
    ]
    if not wakeups:
        argv.append("--no-wakeups")
    if wait:
        argv.append("--wait")
    if rejoin:
        argv.append("--rejoin")
    return argv


# -- handover trials ----------------------------------------------------------------------
STAGES = (
    ("signal→handler", "signal", "term"),
    ("handler→release sent", "term", "rel0"),
    ("release", "rel0", "rel1"),
    ("released→wake sent", "rel1", "wake0"),
    ("wake sent (NOTIFY/PUBLISH)", "wake0", "wake1"),
    ("wake sent→follower woken", "wake0", "woken"),
    ("woken→acquire sent", "woken", "acq0"),
    ("released→acquire sent (no wake-up)", "rel1", "acq0"),
    ("acquire", "acq0", "acq1"),
    ("acquired→elected", "acq1", "elected"),
)


@dataclass
class Series:
    store: str
    mode: str
    wakeups: bool
    sig: str
    gaps: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)
    winners: Counter[str] = field(default_factory=Counter)
    #: Per trial: the distinct followers woken (their watch fired) from the signal on.
    woken: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        wake = "wake-ups" if self.wakeups else "polling"
        return f"{self.store} {self.mode} {wake} {self.sig}"

    def stage_medians(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for stage, _, _ in STAGES:
            values = [s[stage] for s in self.stages if stage in s]
            if values:
                found[stage] = statistics.median(values)
        return found


def breakdown(
    lines: list[tuple[int, float, list[str]]],
    signalled: float,
    victim: int,
    winner: str,
    elected: float,
) -> dict[str, float]:
    """When each step of one handover happened (from the trace), as stage durations."""
    at: dict[str, float] = {"signal": signalled, "elected": elected}
    for pid, _, words in lines:
        if words[:1] != ["T"] or len(words) < 5:
            continue
        kind, who, start, end = words[1], words[2], float(words[3]), float(words[4])
        if start < signalled:
            continue
        if pid == victim:
            if kind == "term":
                at.setdefault("term", start)
            elif kind == "rel":
                at.setdefault("rel0", start)
                at.setdefault("rel1", end)
            elif kind == "wake":
                at.setdefault("wake0", start)
                at.setdefault("wake1", end)
        elif who == winner:
            if kind == "woken" and start <= elected:
                at.setdefault("woken", start)
            elif kind == "acq" and words[5:6] == ["1"]:
                at["acq0"], at["acq1"] = start, end
    if "wake0" not in at and "rel1" in at:
        # race: the release itself wakes the name's watchers (NOTIFY in its transaction,
        # PUBLISH in its script): no wake-up call of its own.
        at["wake0"] = at["wake1"] = at["rel1"]
    stages = {}
    for stage, first, second in STAGES:
        if stage.startswith("released→acquire") and "woken" in at:
            continue
        if first in at and second in at:
            stages[stage] = at[second] - at[first]
    return stages


def handover_series(
    log: Log,
    store: str,
    env: dict[str, str],
    mode: str,
    wakeups: bool,
    sig: signal.Signals,
    trials: int,
    profile: bool,
) -> Series:
    """``trials`` handovers among three candidate processes. After SIGTERM the stopped
    leader's process campaigns again as a new candidate (``--rejoin``: what a replacement
    process would do, without its start-up); after SIGKILL a spare process, loaded ahead,
    replaces it."""
    series = Series(store, mode, wakeups, sig.name)
    name = f"bench-elections-{uuid.uuid4().hex[:8]}"
    rejoin = sig == signal.SIGTERM
    argv = candidate_argv(name, mode, wakeups, (TTL, RENEW, RETRY), rejoin=rejoin)
    start = log.mark()
    every: list[Proc] = []
    spare: Proc | None = None
    #: (log mark, signalled, victim pid) of each trial, for the wake-ups counted at the end.
    windows: list[tuple[int, float, int]] = []

    def new() -> Proc:
        proc = Proc(log, argv, env, stdin=True)
        every.append(proc)
        return proc

    try:
        running = [new() for _ in range(3)]
        for proc in running:
            log.until(lambda proc=proc: proc.loaded or not proc.alive, 60, "a candidate to load")
            proc.send("go")
        if not rejoin:
            spare = new()
        first = log.wait(lambda pid, received, words: words[:1] == ["elected"], start, 60)
        if first is None:
            raise RuntimeError(f"{series.label}: nobody elected\n" + "\n".join(running[0].tail))
        leader = first[0]
        for trial in range(trials):

            def steady(spare: Proc | None = spare, leader: int = leader) -> bool:
                return (
                    (spare is None or spare.loaded)
                    and all(p.state == "ready" and p.alive for p in running)
                    and any(p.pid == leader for p in running)
                )

            log.until(steady, 60, f"{series.label}: candidates ready")
            jitter = JITTER if rejoin else CRASH_JITTER
            time.sleep(SETTLE + random.uniform(0, jitter))  # a random phase
            mark = log.mark()
            victim = next(p for p in running if p.pid == leader)
            signalled = clock()
            windows.append((mark, signalled, victim.pid))
            os.kill(victim.pid, sig)
            found = log.wait(
                lambda pid, received, words, old=victim.pid: (
                    words[:1] == ["elected"] and pid != old
                ),
                mark,
                3 * (TTL + RETRY),
            )
            if found is None:
                raise RuntimeError(f"{series.label}: no new leader after {sig.name}")
            pid, _, words = found
            elected = float(words[3])
            series.gaps.append(elected - signalled)
            if rejoin:
                log.until(lambda old=victim: old.state == "stopped", 30, "the old leader to stop")
            else:
                victim.finish()
            time.sleep(0.02)  # the winner's last trace lines
            stages = breakdown(log.since(mark), signalled, victim.pid, words[1], elected)
            series.stages.append(stages)
            series.winners[words[1]] += 1
            if profile:
                steps = "  ".join(f"{k} {v * 1000:.1f}" for k, v in stages.items())
                print(f"    {series.label} #{trial + 1}: {ms(elected - signalled)}  [{steps}]")
            leader = pid
            if rejoin:
                victim.send("go")
            else:
                assert spare is not None
                running.remove(victim)
                spare.send("go")
                running.append(spare)
                spare = new()
        series.woken = count_woken(log, windows)
    finally:
        for proc in every:
            proc.kill()
    return series


def count_woken(log: Log, windows: list[tuple[int, float, int]]) -> list[int]:
    """For each trial: the distinct candidates, other than the stopped leader, whose watch
    fired from its signal until the next trial's (the last: until now)."""
    counts = []
    for index, (mark, signalled, victim) in enumerate(windows):
        end = windows[index + 1][1] if index + 1 < len(windows) else clock()
        woken = {
            words[2]
            for pid, _, words in log.since(mark)
            if pid != victim
            and words[:2] == ["T", "woken"]
            and len(words) > 3
            and signalled <= float(words[3]) < end
        }
        counts.append(len(woken))
    return counts


def summary_row(series: Series, bound: float | None = None) -> str:
    gaps = series.gaps
    cells = [
        series.store,
        series.mode,
        "yes" if series.wakeups else "no (polling)",
        series.sig,
        str(len(gaps)),
        ms(statistics.median(gaps)),
        ms(pct(gaps, 0.99)),
        ms(max(gaps)),
    ]
    if series.woken and series.wakeups:
        cells.append(f"{statistics.median(series.woken):g} (max {max(series.woken)})")
    else:
        cells.append("")
    if bound is not None:
        cells.append(f"{sum(g <= bound for g in gaps)} of {len(gaps)}")
    return "| " + " | ".join(cells) + " |"


# -- store load ------------------------------------------------------------------------------
class PrivateStore:
    """A private server for the load part: ``counts()`` reads its statement counters."""

    label = ""

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Whatever the store needs before the first measurement."""

    def counts(self) -> Counter[str]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


def pg_kind(query: str) -> str:
    """A short name for a statement pg_stat_statements counted (constants are $n there)."""
    q = " ".join(query.split()).lower()
    if "pg_notify" in q:
        return "NOTIFY"
    if q in ("begin", "commit", "rollback"):
        return "BEGIN/COMMIT"
    if "django_leader_leasecandidate" in q:
        if q.startswith("select"):
            return "registry SELECT"
        if q.startswith("delete") and "identity =" in q:
            return "registry withdraw"
        if q.startswith("delete"):
            return "registry DELETE expired"
        return "registry upsert"
    if "django_leader_leaseevent" in q:
        return "history INSERT" if q.startswith("insert") else "history SELECT (last token)"
    if "django_leader_lease" in q:
        if q.startswith("update") and "token = token +" in q:
            return "lease UPDATE acquire"
        if q.startswith("update") and "renewed_at" in q:
            return "lease UPDATE renew"
        if q.startswith("update") and "previous_holder = holder" in q:
            return "lease UPDATE release"
        if q.startswith("insert"):
            return "lease INSERT (if missing)"
        if q.startswith("select"):
            return "lease SELECT"
        return "lease other"
    if q in ("select $1", "select 1"):
        return "SELECT 1"
    if q.startswith(("listen", "unlisten")):
        return "LISTEN/UNLISTEN"
    return "other"


class PrivatePostgres(PrivateStore):
    label = "postgresql"

    def __init__(self, workdir: Path, connections: int) -> None:
        from tests.chaos.stores import PostgreSQLStore

        store = self.store = PostgreSQLStore(workdir, LOAD_TTL)
        options = (
            f"-p {store.port} -k {store.base} -c listen_addresses=127.0.0.1 -c fsync=off "
            f"-c max_connections={connections} -c shared_preload_libraries=pg_stat_statements "
            "-c pg_stat_statements.track=all -c pg_stat_statements.max=5000"
        )

        def start() -> None:  # the chaos store's start, with the counters and more connections
            from tests.chaos.stores import START_TIMEOUT, _as_user, _run, wait_until

            bindir = store.bindir()
            _run(
                [
                    *_as_user("postgres"),
                    f"{bindir}/pg_ctl",
                    "-D",
                    str(store.data),
                    "-o",
                    options,
                    "-l",
                    str(store.base / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
                cwd="/",
            )
            wait_until(store.answers, START_TIMEOUT, "postgresql")

        store._start = start  # type: ignore[method-assign]
        store.start()
        with store.connect() as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def env(self) -> dict[str, str]:
        return self.store.env()

    def counts(self) -> Counter[str]:
        with self.store.connect() as db:
            rows = db.execute(
                "SELECT query, calls FROM pg_stat_statements s JOIN pg_database d "
                "ON d.oid = s.dbid WHERE d.datname = %s",
                ["chaos"],
            ).fetchall()
        found: Counter[str] = Counter()
        for query, calls in rows:
            if "pg_stat_statements" not in query:  # this very query
                found[pg_kind(query)] += int(calls)
        return found

    def stop(self) -> None:
        self.store.stop()
        self.store.remove()


class PrivateRedis(PrivateStore):
    label = "redis"

    def __init__(self, workdir: Path) -> None:
        from tests.chaos.stores import RedisStore

        self.store = RedisStore(workdir, LOAD_TTL)
        self.store.start()

    def warm_up(self) -> None:
        """A new Redis looks like one that lost its state: the first acquisition starts a
        lock-delay (``max(LOCK_DELAY, ttl)``) during which nobody may acquire. Take it
        with a 1-second ttl and delay first, so that the load part's candidates do not
        wait for it (120 s with their ttl)."""
        snippet = (
            "import django, time; django.setup(); "
            "from django_leader.backends import get_backend; "
            "get_backend().acquire('bench-warm-up', 'bench', 1.0); time.sleep(1.2)"
        )
        env = {
            **base_env(),
            **self.env(),
            "DJANGO_LEADER_TTL": "1",
            "DJANGO_LEADER_RENEW": "0.3",
            "DJANGO_LEADER_RETRY": "0.3",
        }
        subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=env, check=True)

    def env(self) -> dict[str, str]:
        return self.store.env()

    def counts(self) -> Counter[str]:
        stats = self.store.client().info("commandstats")
        found: Counter[str] = Counter()
        for key, value in stats.items():
            command = key.removeprefix("cmdstat_")
            if command in ("info",):
                continue
            found[command] += int(value["calls"])
        return found

    def stop(self) -> None:
        self.store.stop()


#: What ``mntr`` counts that the load part reports (cumulative counters), and its names.
MNTR_COUNTERS = {
    "zk_packets_received": "packets received",
    "zk_packets_sent": "packets sent",
    "zk_cnt_readlatency": "reads",
    "zk_cnt_updatelatency": "writes",
    "zk_sum_node_deleted_watch_count": "watches fired: deleted",
    "zk_sum_node_changed_watch_count": "watches fired: changed",
    "zk_sum_node_created_watch_count": "watches fired: created",
    "zk_sum_node_children_watch_count": "watches fired: children",
}


def mntr(host: str, port: int) -> Counter[str]:
    """The counters of :data:`MNTR_COUNTERS` from ZooKeeper's ``mntr`` (the one reading
    counts itself: a packet each way, subtracted with the idle rate)."""
    from testproject.services import four_letter_word

    found: Counter[str] = Counter()
    for line in four_letter_word(host, port, "mntr", timeout=5.0).splitlines():
        key, _, value = line.partition("\t")
        if key in MNTR_COUNTERS:
            found[MNTR_COUNTERS[key]] = int(float(value))
    if not found:
        raise RuntimeError(f"zookeeper {host}:{port}: mntr answered no counters")
    return found


class ZooKeeperRoot:
    """A ``ROOT`` of this run's own on a ZooKeeper: initialized (no lock-delay: nothing
    was ever held there), deleted by :meth:`remove`."""

    def __init__(self, hosts: str, root: str) -> None:
        from django_leader.backends.zookeeper import ZooKeeperBackend

        self.hosts, self.root = hosts, root
        self.backend = ZooKeeperBackend(hosts=hosts, root=root)
        self.backend.initialize()

    def env(self, timing: tuple[float, float, float]) -> dict[str, str]:
        """The candidates' environment; ``LEASE_TTL`` (the default session timeout asked
        for) is the candidates' ttl, as a deployment would set it."""
        ttl, renew, retry = timing
        return {
            **base_env(),
            "DJANGO_LEADER_BACKEND": ZOOKEEPER_BACKEND,
            "DJANGO_LEADER_ZOOKEEPER_HOSTS": self.hosts,
            "DJANGO_LEADER_ZOOKEEPER_ROOT": self.root,
            "DJANGO_LEADER_TTL": f"{ttl:g}",
            "DJANGO_LEADER_RENEW": f"{renew:g}",
            "DJANGO_LEADER_RETRY": f"{retry:g}",
        }

    def remove(self) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            with contextlib.suppress(NoNodeError):
                self.backend.client.delete(self.root, recursive=True)
        except Exception as exc:  # best effort: the root is the run's own
            print(f"  zookeeper: {self.root} not deleted: {exc!r}")
        finally:
            self.backend.shutdown()


class PrivateZooKeeper(PrivateStore):
    label = "zookeeper"

    def __init__(self, workdir: Path) -> None:
        from tests.support.zookeeper_server import ZooKeeperServer, missing

        reason = missing()
        if reason:
            raise RuntimeError(reason)
        # Sessions up to 1000 ticks (200 s): the part's ttl of 120 s needs a session as long.
        self.server = ZooKeeperServer(workdir / "zk", max_session_ticks=1000)
        self.server.start()
        self.root: ZooKeeperRoot | None = None

    def warm_up(self) -> None:
        self.root = ZooKeeperRoot(self.server.hosts, f"/django-leader-bench-load-{os.getpid()}")

    def env(self) -> dict[str, str]:
        if self.root is None:
            return {"DJANGO_LEADER_ZOOKEEPER_HOSTS": self.server.hosts}
        return self.root.env((LOAD_TTL, LOAD_RENEW, LOAD_RETRY))

    def counts(self) -> Counter[str]:
        return mntr("127.0.0.1", self.server.port)

    def stop(self) -> None:
        if self.root is not None:
            self.root.backend.shutdown()
        self.server.close()


@dataclass
class Load:
    store: str
    mode: str
    size: int
    idle: dict[str, float]  # per second
    rounds: list[dict[str, float]]  # per handover, idle subtracted
    woken: list[int]
    tried: list[int]
    gaps: list[float]
    #: Requests the clients sent while the candidates added for this size joined (from
    #: the start of the first new process until the store was quiet again).
    joining: float = 0.0


def load_series(log: Log, store: PrivateStore, mode: str, sizes: list[int]) -> list[Load]:
    """For each of ``sizes`` (ascending): that many waiting candidates, and
    :data:`LOAD_ROUNDS` graceful handovers (``stop`` of the leading elector, which rejoins
    the queue after the count), each counted for :data:`LOAD_WINDOW` seconds. The
    candidates are added to those of the previous size."""
    name = f"bench-load-{uuid.uuid4().hex[:8]}"
    env = {**base_env(), **store.env()}
    timing = (LOAD_TTL, LOAD_RENEW, LOAD_RETRY)
    procs: list[Proc] = []
    results: list[Load] = []
    label = f"load {store.label} {mode}"
    try:
        mark = log.mark()
        argv = [*candidate_argv(name, mode, True, timing, wait=False), "--commands"]
        holder = Proc(log, argv, env, stdin=True)
        procs.append(holder)
        found = log.wait(lambda p, r, w: p == holder.pid and w[:1] == ["elected"], mark, 60)
        if found is None:
            raise RuntimeError(f"{label}: the first leader was not elected")
        leader = (holder, found[2][1])
        waiting = 0
        for size in sizes:
            joined_from = store.counts()
            while waiting < size:
                count = min(PER_PROCESS, size - waiting)
                argv = candidate_argv(name, mode, True, timing, electors=count, wait=False)
                procs.append(Proc(log, [*argv, "--commands"], env, stdin=True))
                waiting += count
            log.until(
                lambda size=size: sum(len(p.ready) for p in procs) >= size + 1,
                180,
                f"{label} {size}: {size} candidates ready",
            )
            quiet(store)
            joined = store.counts()
            joining = sent(store.label, {k: joined[k] - joined_from.get(k, 0) for k in joined})
            pids = {p.pid for p in procs}
            mark = log.mark()
            before, started = store.counts(), clock()
            time.sleep(IDLE_WINDOW)
            after, ended = store.counts(), clock()
            idle = {k: (after[k] - before[k]) / (ended - started) for k in after | before}
            idle_tries = len(traced(log, mark, "acq", started, ended, pids)) / (ended - started)
            result = Load(store.label, mode, size, idle, [], [], [], [], joining)
            for _ in range(LOAD_ROUNDS):
                mark = log.mark()
                owner, identity = leader
                before, started = store.counts(), clock()
                owner.send(f"stop {identity}")
                found = log.wait(
                    lambda p, r, w, pids=pids, old=identity: (
                        p in pids and w[:1] == ["elected"] and w[1] != old
                    ),
                    mark,
                    30,
                )
                if found is None:
                    raise RuntimeError(f"{label} {size}: no new leader")
                result.gaps.append(float(found[2][3]) - started)
                time.sleep(max(0.0, started + LOAD_WINDOW - clock()))
                after, ended = store.counts(), clock()
                span = ended - started
                result.rounds.append(
                    {k: after[k] - before[k] - idle.get(k, 0.0) * span for k in after | before}
                )
                # (the stopping leader's own watch hears a broadcast too: not counted)
                woken = traced(log, mark, "woken", started, ended, pids)
                result.woken.append(len({w[2] for w in woken} - {identity}))
                acquisitions = len(traced(log, mark, "acq", started, ended, pids))
                result.tried.append(round(acquisitions - idle_tries * span))
                mark = log.mark()
                owner.send(f"start {identity}")  # a waiting candidate again, at the tail
                leader = (next(p for p in procs if p.pid == found[0]), found[2][1])
                back = log.wait(
                    lambda p, r, w, identity=identity: w[:3] == ["T", "ann", identity], mark, 60
                )
                if back is None:
                    raise RuntimeError(f"{label} {size}: {identity} did not rejoin")
                time.sleep(0.3)  # its watch subscribed (the hub looks every 0.1 s)
            results.append(result)
            print(f"  {load_row(result)} idle: {sum(idle.values()):.1f}/s", flush=True)
        return results
    finally:
        for proc in procs:
            proc.kill()


def traced(
    log: Log, mark: int, kind: str, start: float, end: float, pids: set[int]
) -> list[list[str]]:
    """The trace lines of ``kind`` from ``pids`` since ``mark`` whose call began between
    ``start`` and ``end``."""
    return [
        w
        for pid, _, w in log.since(mark)
        if pid in pids
        and w[:1] == ["T"]
        and len(w) > 4
        and w[1] == kind
        and start <= float(w[3]) <= end
    ]


# -- peers --------------------------------------------------------------------------------
@dataclass
class Peer:
    tool: str
    gaps: list[float]


def peer_series(
    log: Log, tool: str, trials: int, broker: str, sig: signal.Signals = signal.SIGTERM
) -> Peer:
    """``trials`` handovers among three processes of ``tool``: ``sig`` to the lock holder
    (SIGTERM: to its main process, as ``docker stop`` does; SIGKILL: to its whole process
    group, as when a host dies), then the time to the next one's "acquired" line."""
    run = uuid.uuid4().hex[:8]
    celery = str(Path(sys.executable).with_name("celery"))
    if tool == "celery-redbeat":
        argv = [
            celery,
            "-A",
            "testproject",
            "beat",
            "-l",
            "INFO",
            "-S",
            "redbeat.RedBeatScheduler",
            "--max-interval",
            str(int(RETRY)),
        ]
        env = {
            **base_env(),
            "DJANGO_LEADER_REDBEAT_LOCK_TIMEOUT": str(math.ceil(TTL)),
            "DJANGO_LEADER_REDBEAT_PREFIX": f"redbeat-{run}",
        }
        ready, elected = "beat: Starting...", "beat: Acquired lock"
    else:
        single = str(Path(sys.executable).with_name("single-beat"))
        argv = [single, "sleep", "3600"]
        env = {
            **base_env(),
            "SINGLE_BEAT_REDIS_SERVER": broker,
            "SINGLE_BEAT_IDENTIFIER": f"bench-{run}",
            "SINGLE_BEAT_LOCK_TIME": "3",
            "SINGLE_BEAT_INITIAL_LOCK_TIME": "4",
            "SINGLE_BEAT_HEARTBEAT_INTERVAL": str(int(RETRY)),
            "SINGLE_BEAT_LOG_LEVEL": "debug",
        }
        ready, elected = "timer called", "acquired lock"
    peer = Peer(tool, [])
    procs: list[Proc] = []
    states: dict[int, str] = {}  # pid -> "waiting" or "leader", from their lines
    seen = [log.mark()]

    def scan() -> None:
        """Read the lines that came since the last look (``log.cond`` held)."""
        for pid, _, words in log.lines[seen[0] :]:
            text = " ".join(words)
            if elected in text:
                states[pid] = "leader"
            elif ready in text and pid not in states:
                states[pid] = "waiting"
        seen[0] = len(log.lines)

    def start() -> Proc:
        proc = Proc(log, argv, env)
        procs.append(proc)
        return proc

    try:
        running = [start() for _ in range(3)]
        for _ in range(trials):

            def steady() -> bool:
                scan()
                leaders = [p for p in running if states.get(p.pid) == "leader" and p.alive]
                return len(leaders) == 1 and all(p.alive and p.pid in states for p in running)

            log.until(steady, 90, f"{tool}: one holder and two processes waiting")
            # Past their start-up, the others wait for the lock (poll it).
            time.sleep(SETTLE + random.uniform(0, JITTER if sig == signal.SIGTERM else RENEW))
            victim = next(p for p in running if states.get(p.pid) == "leader")
            mark = log.mark()
            signalled = clock()
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(victim.pid, signal.SIGKILL)
            else:
                victim.signal(sig)
            found = log.wait(
                lambda pid, r, words, old=victim.pid: pid != old and elected in " ".join(words),
                mark,
                30,
            )
            if found is None:
                raise RuntimeError(f"{tool}: no new lock holder\n" + "\n".join(victim.tail))
            peer.gaps.append(found[1] - signalled)  # when received: they log no usable time
            victim.finish()
            states.pop(victim.pid, None)
            running.remove(victim)
            running.append(start())
    finally:
        for proc in procs:
            proc.kill()
    return peer


# -- the run ------------------------------------------------------------------------------
def base_env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_LEADER_LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "PYTHONPATH": str(ROOT),
    }


def store_envs(wanted: list[str], roots: list[ZooKeeperRoot]) -> dict[str, dict[str, str]]:
    """The environment of the candidates of each reachable store; a ZooKeeper root made
    for the run is added to ``roots`` (the caller removes them)."""
    from django.conf import settings

    found = {}
    for alias, label in (("postgresql", "postgresql"), ("default", "sqlite"), ("mysql", "mariadb")):
        if alias in settings.DATABASES:
            migrate(alias)
            found[label] = {**base_env(), "DJANGO_LEADER_DATABASE": alias}
    if "redis" in settings.CACHES:
        migrate("default")  # its history
        found["redis"] = {
            **base_env(),
            "DJANGO_LEADER_BACKEND": "django_leader.backends.cache.CacheBackend",
            "DJANGO_LEADER_CACHE": "redis",
        }
    zookeeper = getattr(settings, "ZOOKEEPER", None)
    if zookeeper and "zookeeper" in wanted:
        migrate("default")  # its history
        root = ZooKeeperRoot(zookeeper["HOSTS"], f"/django-leader-bench-{os.getpid()}")
        roots.append(root)
        found["zookeeper"] = root.env((TTL, RENEW, RETRY))
    return found


def versions() -> str:
    import platform

    import django
    from django.db import connections

    parts = [f"Python {platform.python_version()}", f"Django {django.get_version()}"]
    for package in ("psycopg", "redis", "kazoo", "celery", "celery-redbeat", "single-beat"):
        try:
            from importlib.metadata import version

            parts.append(f"{package} {version(package)}")
        except Exception:
            parts.append(f"{package} (not installed)")
    servers = []
    for alias, label in (("postgresql", "PostgreSQL"), ("mysql", "MariaDB")):
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT version()")
                servers.append(f"{label} {cursor.fetchone()[0].split(',')[0].split()[1]}")
        except Exception:
            pass
    try:
        from django.core.cache import caches

        from django_leader.backends.redis import redis_client

        client = redis_client(caches["redis"])
        servers.append(f"Redis {client.info('server')['redis_version']}")
    except Exception:
        pass
    try:
        from django.conf import settings

        from testproject.services import four_letter_word

        host, _, port = settings.ZOOKEEPER["HOSTS"].split(",")[0].rpartition(":")
        srvr = four_letter_word(host, int(port), "srvr")
        servers.append(f"ZooKeeper {srvr.split()[2].split('-')[0]}")
    except Exception:
        pass
    return ", ".join(parts + servers)


def machine() -> str:
    import platform

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}; "
        f"load average at the start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def print_table(header: Iterable[str], rows: Iterable[str]) -> None:
    cells = list(header)
    print("| " + " | ".join(cells) + " |")
    print("|" + "---|" * len(cells))
    for row in rows:
        print(row)
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="graceful handovers per case")
    parser.add_argument("--crash-trials", type=int, default=10)
    parser.add_argument("--reference-trials", type=int, default=10)
    parser.add_argument("--peer-trials", type=int, default=10)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--sizes", default="10,100,500", help="waiting candidates (load)")
    parser.add_argument(
        "--stores",
        default="postgresql,redis,sqlite,mariadb,zookeeper",
        help="which stores (e.g. --stores zookeeper: only ZooKeeper; the peers run with redis)",
    )
    parser.add_argument("--modes", default="race,fifo")
    parser.add_argument("--profile", action="store_true", help="print every trial's steps")
    args = parser.parse_args()
    began = clock()
    setup()
    roots: list[ZooKeeperRoot] = []
    try:
        run(args, roots, began)
    finally:
        for root in roots:
            root.remove()


#: The stores of the handover and crash parts, and which wake-up settings each is run
#: with (ZooKeeper's polling would be every other store's: not run).
HANDOVER_STORES = {"postgresql": (True, False), "redis": (True, False), "zookeeper": (True,)}


def run(args: argparse.Namespace, roots: list[ZooKeeperRoot], began: float) -> None:
    from django.conf import settings

    from testproject.services import UNAVAILABLE

    parts = [part for part in PARTS if part in args.parts.split(",")]
    wanted = args.stores.split(",")
    envs = {k: v for k, v in store_envs(wanted, roots).items() if k in wanted}
    modes = [m for m in ("race", "fifo") if m in args.modes.split(",")]
    log = Log()
    print(f"# elections bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    print(
        f"timing: ttl {TTL:g} s, renew {RENEW:g} s, retry {RETRY:g} s (the crash promise: "
        f"ttl + retry = {TTL + RETRY:g} s); load part: ttl {LOAD_TTL:g} s, renew "
        f"{LOAD_RENEW:g} s, retry {LOAD_RETRY:g} s\n",
        flush=True,
    )
    handover: list[Series] = []
    crash: list[Series] = []
    peers: list[Peer] = []
    loads: list[Load] = []
    took: dict[str, float] = {}
    for part in parts:
        part_began = clock()
        if part == "handover":
            for store, wakeup_cases in HANDOVER_STORES.items():
                for mode in modes:
                    for wakeups in wakeup_cases:
                        if store in envs:
                            handover.append(
                                handover_series(
                                    log,
                                    store,
                                    envs[store],
                                    mode,
                                    wakeups,
                                    signal.SIGTERM,
                                    args.trials,
                                    args.profile,
                                )
                            )
                            print(f"  {summary_row(handover[-1])}", flush=True)
        elif part == "reference":
            for store in ("sqlite", "mariadb"):
                if store in envs:
                    handover.append(
                        handover_series(
                            log,
                            store,
                            envs[store],
                            "race",
                            False,
                            signal.SIGTERM,
                            args.reference_trials,
                            args.profile,
                        )
                    )
                    print(f"  {summary_row(handover[-1])}", flush=True)
        elif part == "crash":
            for store in HANDOVER_STORES:
                for mode in modes:
                    if store in envs:
                        crash.append(
                            handover_series(
                                log,
                                store,
                                envs[store],
                                mode,
                                True,
                                signal.SIGKILL,
                                args.crash_trials,
                                args.profile,
                            )
                        )
                        print(f"  {summary_row(crash[-1], TTL + RETRY)}", flush=True)
        elif part == "peers" and "redis" in envs:
            for tool in ("celery-redbeat", "single-beat"):
                try:
                    peers.append(
                        peer_series(log, tool, args.peer_trials, settings.CELERY_BROKER_URL)
                    )
                except (FileNotFoundError, RuntimeError) as exc:
                    print(f"  {tool}: not measured: {exc}", flush=True)
                    continue
                print(f"  {peer_row(peers[-1])}", flush=True)
        elif part == "load":
            sizes = [int(size) for size in args.sizes.split(",") if size]
            loads = run_load(log, sizes, list(envs), modes)
        took[part] = clock() - part_began
    print()
    report(handover, crash, peers, loads)
    for reason in UNAVAILABLE.values():
        print(f"skipped: {reason}")
    spent = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in took.items())
    print(f"(the run took {clock() - began:.0f} s: {spent})")


def report(
    handover: list[Series], crash: list[Series], peers: list[Peer], loads: list[Load]
) -> None:
    """The results as Markdown tables (docs/benchmarks.md quotes them)."""
    if handover:
        print("## Graceful handover: SIGTERM of the leader → the next one elected\n")
        print_table(
            ["store", "mode", "wake-ups", "signal", "trials", "median", "p99", "max", "woken"],
            [summary_row(s) for s in handover],
        )
        print("Where the time goes: median of each step over the trials, in ms\n")
        medians = [s.stage_medians() for s in handover]
        rows = [
            f"| {stage} | "
            + " | ".join(f"{m[stage] * 1000:.1f}" if stage in m else "" for m in medians)
            + " |"
            for stage, _, _ in STAGES
            if any(stage in m for m in medians)
        ]
        rows.append(
            "| trials won by a follower woken first | "
            + " | ".join(
                f"{sum('wake sent→follower woken' in t for t in s.stages)} of {len(s.stages)}"
                for s in handover
            )
            + " |"
        )
        print_table(
            ["step", *(f"{s.store} {s.mode} {'wake' if s.wakeups else 'poll'}" for s in handover)],
            rows,
        )
    if crash:
        bound = TTL + RETRY
        print(f"## Crash failover: SIGKILL of the leader (promise ≤ ttl + retry = {bound:g} s)\n")
        print_table(
            [
                "store",
                "mode",
                "wake-ups",
                "signal",
                "trials",
                "median",
                "p99",
                "max",
                "woken",
                "within",
            ],
            [summary_row(s, TTL + RETRY) for s in crash],
        )
    if peers:
        print("## Beside the peers: graceful handover on Redis, SIGTERM of the lock holder\n")
        rows = [
            f"| django-leader, {s.mode}, {'wake-ups' if s.wakeups else 'polling'} | "
            f"{len(s.gaps)} | {ms(statistics.median(s.gaps))} | {ms(pct(s.gaps, 0.99))} | "
            f"{ms(max(s.gaps))} |"
            for s in handover
            if s.store == "redis"
        ]
        print_table(["tool", "trials", "median", "p99", "max"], rows + [peer_row(p) for p in peers])
    if loads:
        print(
            f"## Store load per graceful handover (private servers; {LOAD_ROUNDS} handovers "
            f"each, counted for {LOAD_WINDOW:g} s from the stop, idle rate subtracted)\n"
        )
        print_table(
            LOAD_HEADER,
            [load_row(r) for r in sorted(loads, key=lambda r: (r.store, r.mode, r.size))],
        )


def peer_row(peer: Peer) -> str:
    gaps = peer.gaps
    return (
        f"| {peer.tool} | {len(gaps)} | {ms(statistics.median(gaps))} | {ms(pct(gaps, 0.99))} | "
        f"{ms(max(gaps))} |"
    )


def run_load(log: Log, sizes: list[int], stores: list[str], modes: list[str]) -> list[Load]:
    """The load part: both private stores at once (what is counted is statements, not
    time), race then fifo on each."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    started: list[PrivateStore] = []
    results: list[Load] = []
    makers = {
        "postgresql": lambda: PrivatePostgres(workdir / "pg", max(sizes) + 100),
        "redis": lambda: PrivateRedis(workdir),
        "zookeeper": lambda: PrivateZooKeeper(workdir),
    }
    try:
        for label, make in makers.items():
            if label not in stores:
                continue
            try:
                store = make()
            except Exception as exc:
                print(f"  load: no private {label}: {exc}")
                continue
            started.append(store)
            done = subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
                cwd=ROOT,
                env={**base_env(), **store.env()},
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"migrate on the private {label}: {done.stderr[-2000:]}")
            store.warm_up()
        errors: list[BaseException] = []

        def measure(store: PrivateStore) -> None:
            try:
                for mode in modes:
                    results.extend(load_series(log, store, mode, sizes))
            except BaseException as exc:
                errors.append(exc)

        # The stores at once: what is counted is statements, not time.
        threads = [threading.Thread(target=measure, args=(store,)) for store in started]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
    finally:
        for store in started:
            store.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


#: Commands a Redis client sends itself; the others in INFO commandstats ran inside the
#: backend's Lua scripts (EVALSHA).
CLIENT_COMMANDS = {
    "evalsha",
    "eval",
    "publish",
    "subscribe",
    "unsubscribe",
    "hello",
    "client",
    "ping",
    "select",
    "script",
}


def load_row(result: Load) -> str:
    totals = [sum(r.values()) for r in result.rounds]
    requests = [sent(result.store, r) for r in result.rounds]
    if result.store == "zookeeper":
        # commands run: the reads and writes among the requests (a multi is one write); the
        # rest of the row is what mntr counted besides.
        totals = [r.get("reads", 0.0) + r.get("writes", 0.0) for r in result.rounds]
    kinds: dict[str, float] = {}
    for r in result.rounds:
        for key, value in r.items():
            kinds[key] = kinds.get(key, 0.0) + value / len(result.rounds)
    ranked = sorted(kinds.items(), key=lambda item: -item[1])
    top = ", ".join(f"{key} {value:.0f}" for key, value in ranked if round(value) >= 1)
    return (
        f"| {result.store} | {result.mode} | {result.size} | "
        f"{statistics.median(result.woken):.0f} | {statistics.median(result.tried):.0f} | "
        f"{statistics.median(requests):.0f} | {statistics.median(totals):.0f} | {top} | "
        f"{ms(statistics.median(result.gaps))} | {sent(result.store, result.idle):.1f} | "
        f"{result.joining:.0f} |"
    )


def quiet(store: PrivateStore) -> None:
    """Wait until ``store``'s clients are quiet (see :data:`QUIET`), or QUIET_FOR s."""
    give_up = clock() + QUIET_FOR
    before, started = store.counts(), clock()
    while clock() < give_up:
        time.sleep(QUIET_WINDOW)
        after, ended = store.counts(), clock()
        rate = sent(store.label, {k: after[k] - before.get(k, 0) for k in after}) / (
            ended - started
        )
        if rate <= QUIET:
            return
        before, started = after, ended


def sent(store: str, counts: dict[str, float]) -> float:
    """The requests the clients sent among a store's ``counts``: on ZooKeeper the packets
    it received, on Redis the commands clients send (the others ran inside scripts), on
    the databases every statement."""
    if store == "zookeeper":
        return counts.get("packets received", 0.0)
    if store == "redis":
        return sum((v for k, v in counts.items() if k in CLIENT_COMMANDS), 0.0)
    return sum(counts.values())


if __name__ == "__main__":
    main()
