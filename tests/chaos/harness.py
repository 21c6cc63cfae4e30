"""The chaos harness: candidates on a private store, a seeded nemesis, and the check.

:func:`run` starts a private store (:mod:`tests.chaos.stores`), creates its tables, starts
``electors`` Elector candidates (:mod:`tests.chaos.candidate`) and ``runleaders``
``manage.py runleader`` candidates with a payload (:mod:`tests.chaos.payload`), all
campaigning for one lease, and then, for ``duration`` seconds, lets a nemesis driven by
``random.Random(seed)`` inject one fault at a time:

``kill``, ``stop``, ``term``
    SIGKILL, SIGSTOP for 1.2-2 TTLs (then SIGCONT), or SIGTERM of the current leader's
    process (for a runleader: ``manage.py runleader`` itself). A candidate that exits is
    started again, with a new identity.
``guard-kill``
    SIGKILL of the runleader guard between the leading runleader and its payload.
``fenced-freeze``
    (database stores) the leading Elector candidate SIGSTOPs itself inside
    ``lease.fenced()``, holding the lease row locked, for 2.5-3.5 TTLs.
the store's own faults
    see :attr:`tests.chaos.stores.Store.faults`: Redis FLUSHDB, restarts with and without
    persistence and from an older snapshot, ``CLIENT KILL``; PostgreSQL and MariaDB
    restarts, ``pg_terminate_backend`` and ``KILL`` of every connection.

After each fault the nemesis waits until a leader acts again (another term than the one
a fault aimed at the leader hit; after a store fault, once the liveness bound has passed),
at most the liveness bound plus 2 s, then 0.3-1.5 s, so each recovery is measured on its
own. At the end every
process of the run is killed, the fenced writes are read from the store, and
:func:`tests.chaos.checker.check` checks all records.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from random import Random
from typing import Any, TypeVar

from tests.chaos import checker
from tests.chaos.stores import STORES, Store, clock

ROOT = Path(__file__).resolve().parents[2]
LEASE = "chaos"
#: An act younger than this means someone leads now.
LIVE = 0.3
#: Seconds the first leader may take (every candidate starts Django at once).
FIRST_LEADER = 90.0
#: Seconds between the first leader and the first fault.
SETTLE = 3.0
#: How often the harness reads the logs and looks for exited candidates.
TICK = 0.05

T = TypeVar("T")


@dataclass
class Config:
    store: str
    duration: float = 600.0
    seed: int = 1
    ttl: float = 2.0
    renew_interval: float = 0.5
    retry_interval: float = 0.5
    electors: int = 3
    runleaders: int = 2
    #: Seconds no candidate may acquire after the store lost state. Default:
    #: max(LOCK_DELAY setting, ttl), where the setting defaults to LEASE_TTL, which the
    #: candidates get as ``ttl``; so ``ttl``.
    lock_delay: float | None = None
    #: Where the logs and the private store live (default: a new temporary directory,
    #: removed after the run unless ``keep``).
    workdir: Path | None = None
    keep: bool = False

    @property
    def params(self) -> checker.Params:
        delay = self.ttl if self.lock_delay is None else self.lock_delay
        return checker.Params(self.ttl, self.retry_interval, delay)


@dataclass
class Outcome:
    config: Config
    result: checker.Result
    records: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    workdir: Path
    started: float
    ended: float
    notes: list[str] = field(default_factory=list)


class Tail:
    """Reads the JSON lines that the candidates append to their files in ``logdir``."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def poll(self) -> list[dict[str, Any]]:
        found = []
        with os.scandir(self.logdir) as entries:
            grown = [
                Path(entry.path) for entry in entries
                if entry.name.endswith(".jsonl")
                and entry.stat().st_size > self.offsets.get(Path(entry.path), 0)
            ]  # fmt: skip
        for path in sorted(grown):
            with open(path, "rb") as source:
                source.seek(self.offsets.get(path, 0))
                data = source.read()
            if not data:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            lines = (self.partial.pop(path, b"") + data).split(b"\n")
            if lines[-1]:
                self.partial[path] = lines[-1]
            for line in lines[:-1]:
                if line.strip():
                    found.append(json.loads(line))
        return found


class Harness:
    def __init__(self, config: Config, store: Store, workdir: Path) -> None:
        self.config = config
        self.store = store
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.rng = Random(config.seed)
        self.run_id = uuid.uuid4().hex
        self.tail = Tail(self.logdir)
        self.records: list[dict[str, Any]] = []  # the candidates'
        self.events: list[dict[str, Any]] = []  # the nemesis's: faults, spawns, exits
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # identity -> process
        self.slots: dict[str, str] = {}  # slot -> identity of its current process
        self.generation: dict[str, int] = {}
        self.last_act: dict[str, Any] | None = None
        self.freezing: list[dict[str, Any]] = []
        self.live: dict[tuple[str, int], dict[str, Any]] = {}  # (who, pid) -> last act
        self.highest_token = 0  # the greatest token that acted
        self.stale_since: dict[int, float] = {}  # pid of a payload -> first stale act seen
        self.notes: list[str] = []
        self.closing = False  # no more respawns

    # -- processes --------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        inherited = {
            key: value for key, value in os.environ.items()
            if not key.startswith(("DJANGO_LEADER_", "CHAOS_"))
            and key not in ("DATABASE_URL", "REDIS_URL")
        }  # fmt: skip
        c = self.config
        return {
            **inherited,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONPATH": str(ROOT),
            "DJANGO_LEADER_EXTRA_DATABASES": "0",
            "DJANGO_LEADER_TTL": str(c.ttl),
            "DJANGO_LEADER_RENEW": str(c.renew_interval),
            "DJANGO_LEADER_RETRY": str(c.retry_interval),
            "CHAOS_RUN_ID": self.run_id,
            "CHAOS_LOG_DIR": str(self.logdir),
            "CHAOS_LEASE": LEASE,
            "CHAOS_TTL": str(c.ttl),
            "CHAOS_RENEW": str(c.renew_interval),
            "CHAOS_RETRY": str(c.retry_interval),
            "CHAOS_FENCED": "1" if self.store.fenced else "0",
            **self.store.env(),
        }

    def migrate(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "tests.chaos.candidate", "--migrate"],
            cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed: {done.stderr[-2000:]}")

    def spawn(self, slot: str) -> None:
        self.generation[slot] = generation = self.generation.get(slot, 0) + 1
        identity = f"{slot}-{generation}"
        c = self.config
        env = {**self.env(), "CHAOS_IDENTITY": identity,
               "CHAOS_LOG": str(self.logdir / f"{identity}.jsonl")}  # fmt: skip
        if slot.startswith("e"):
            cmd = [sys.executable, "-m", "tests.chaos.candidate"]
            # Every other Elector candidate is an asyncio program (an AsyncElector).
            env["CHAOS_ASYNC"] = "1" if int(slot[1:]) % 2 else "0"
        else:
            cmd = [sys.executable, "manage.py", "runleader", LEASE, "--identity", identity,
                   "--ttl", str(c.ttl), "--renew-interval", str(c.renew_interval),
                   "--retry-interval", str(c.retry_interval),
                   "--", sys.executable, "-m", "tests.chaos.payload"]  # fmt: skip
        with open(self.logdir / f"{identity}.out", "ab") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.procs[identity] = proc
        self.slots[slot] = identity
        self.event("spawn", who=identity, pid=proc.pid)

    def respawn_exited(self) -> None:
        if self.closing:
            return
        for slot, identity in list(self.slots.items()):
            proc = self.procs[identity]
            if proc.poll() is not None:
                self.event("exit", who=identity, status=proc.returncode)
                self.spawn(slot)

    def ours(self, pid: int) -> bool:
        """Whether ``pid`` is a process of this run (it has our CHAOS_RUN_ID)."""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"CHAOS_RUN_ID={self.run_id}".encode() in environ.split(b"\0")

    def kill_everything(self) -> None:
        """SIGCONT and SIGKILL every process of this run: candidates, guards, payloads."""
        self.closing = True
        for _ in range(3):
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
            mine = [pid for pid in pids if self.ours(pid)]
            if not mine:
                break
            for pid in mine:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
            for proc in self.procs.values():
                with contextlib.suppress(Exception):
                    proc.wait(5)
            time.sleep(0.2)

    # -- observation ------------------------------------------------------------------

    def event(self, ev: str, **fields: Any) -> dict[str, Any]:
        record = {"ev": ev, "t": clock(), "source": "nemesis", **fields}
        self.events.append(record)
        return record

    def tick(self) -> None:
        for record in self.tail.poll():
            self.records.append(record)
            if record["ev"] == "freezing":
                self.freezing.append(record)
            if record["ev"] == "act":
                self.live[(record["who"], record["pid"])] = record
                self.highest_token = max(self.highest_token, int(record["token"]))
                if self.last_act is None or record["t"] >= self.last_act["t"]:
                    self.last_act = record
        self.reap_stale_payloads()
        self.respawn_exited()

    def reap_stale_payloads(self) -> None:
        """SIGKILL a payload that has acted with a stale token for over a TTL.

        A payload that outlives its lease (its guard killed) would act for ever: the checker
        has seen it by then, and left running it would be taken for the leader."""
        now = clock()
        recent = [a for a in self.live.values() if a["t"] > now - LIVE]
        if not recent:
            return
        highest = max(a["token"] for a in recent)
        for act in recent:
            if act.get("role") != "payload" or act["token"] >= highest:
                continue
            since = self.stale_since.setdefault(act["pid"], now)
            if now - since > self.config.ttl and self.ours(act["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(act["pid"], signal.SIGKILL)
                self.event("reaped", who=act["who"], pid=act["pid"], token=act["token"])
                del self.live[(act["who"], act["pid"])]

    def until(self, probe: Callable[[], T], timeout: float) -> T | None:
        """Tick until ``probe()`` is truthy (returned) or ``timeout`` seconds passed (None)."""
        give_up = clock() + timeout
        while True:
            self.tick()
            value = probe()
            if value or clock() >= give_up:
                return value or None
            time.sleep(TICK)

    def wait(self, seconds: float) -> None:
        self.until(lambda: False, seconds)

    def leader(self) -> dict[str, Any] | None:
        """Who leads now: of the processes that acted in the last LIVE seconds, the one
        with the greatest token (a stale one may act on: that is a violation, not a leader)."""
        now = clock()
        recent = [a for a in self.live.values() if a["t"] > now - LIVE]
        # Nor is a process acting with a token below one that acted before (a payload
        # that outlived its lease, until it is reaped).
        recent = [a for a in recent if a["token"] >= self.highest_token]
        return max(recent, key=lambda a: (a["token"], a["t"])) if recent else None

    # -- the nemesis ------------------------------------------------------------------

    def applicable(self, leader: dict[str, Any] | None) -> list[str]:
        kinds = []
        if leader is not None and self.procs[leader["who"]].poll() is None:
            kinds += ["kill", "stop", "term"]
            if leader.get("role") == "payload":
                kinds.append("guard-kill")
            elif self.store.fenced:
                kinds.append("fenced-freeze")
        snapshot = getattr(self.store, "snapshot", None)
        kinds += [k for k in self.store.faults if k != "redis-restore-old" or snapshot]
        return kinds

    def fault(self, kind: str, start: float, ready: float, lossy: bool = False,
              **fields: Any) -> dict[str, Any]:  # fmt: skip
        return self.event("fault", kind=kind, t=start, ready=ready, lossy=lossy, **fields)

    def inject(self, kind: str, leader: dict[str, Any] | None) -> dict[str, Any] | None:
        c = self.config
        if kind in ("kill", "term", "stop", "guard-kill", "fenced-freeze"):
            assert leader is not None
            who = leader["who"]
            pid = self.procs[who].pid
            if kind == "guard-kill":
                guard = int(leader["ppid"])
                if not self.ours(guard):
                    return None
                start = clock()
                os.kill(guard, signal.SIGKILL)
                return self.fault(kind, start, start, target=who, token=leader["token"])
            if kind == "fenced-freeze":
                armed = clock()
                os.kill(pid, signal.SIGUSR1)
                frozen = self.until(
                    lambda: next((r for r in self.freezing if r["who"] == who
                                  and r["t"] >= armed), None),
                    timeout=1.5,
                )  # fmt: skip
                if frozen is None:
                    self.event("skipped", kind=kind, who=who)
                    return None
                start = float(frozen["t"])
                record = self.fault(kind, start, start, target=who, token=leader["token"])
                self.until(lambda: clock() >= start + self.rng.uniform(2.5, 3.5) * c.ttl, 60)
                os.kill(pid, signal.SIGCONT)
                if self.store.name == "sqlite":
                    # SQLite has no server to abort the frozen transaction: its file lock
                    # keeps every writer out until the process runs again, so the store
                    # answers only from then on (docs/database-backend.md).
                    record["ready"] = clock()
                return record
            sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}[kind]
            start = clock()
            os.kill(pid, sig)
            record = self.fault(kind, start, start, target=who, token=leader["token"])
            if kind == "stop":
                self.wait(self.rng.uniform(1.2, 2.0) * c.ttl)
                os.kill(pid, signal.SIGCONT)
            return record
        injected = self.store.inject(kind, self.rng)
        record = self.fault(kind, injected.start, injected.ready, injected.lossy,
                            detail=injected.detail)  # fmt: skip
        take_snapshot = getattr(self.store, "take_snapshot", None)
        if take_snapshot is not None and self.rng.random() < 0.3:
            take_snapshot()
            self.event("snapshot")
        return record

    def recovered(self, fault: dict[str, Any]) -> bool:
        """Whether a leader acts again after ``fault`` (another term than the one it hit,
        for a fault aimed at the leader)."""
        act = self.leader()
        if act is None:
            return False
        if "target" in fault:
            return act["t"] > fault["ready"] and (act["who"], act["token"]) != (
                fault["target"],
                fault["token"],
            )
        # A store fault: long enough for its effects to show (an old leader acting on
        # after a flush, a leader whose writes keep failing), then a leader.
        return bool(act["t"] > fault["ready"] + self.config.params.bound(fault["lossy"]))

    def nemesis(self, duration: float) -> None:
        params = self.config.params
        end = clock() + duration
        take_snapshot = getattr(self.store, "take_snapshot", None)
        if take_snapshot is not None:
            take_snapshot()
            self.event("snapshot")
        while clock() < end:
            leader = self.until(self.leader, params.bound(True) + 5)
            kinds = self.applicable(leader)
            if not kinds:
                continue
            kind = self.rng.choice(kinds)
            fault = self.inject(kind, leader)
            if fault is not None:
                self.until(partial(self.recovered, fault), params.bound(fault["lossy"]) + 2)
            self.wait(self.rng.uniform(0.3, 1.5))


def run(config: Config, log: Callable[[str], None] = lambda line: None) -> Outcome:
    """One chaos run (see the module's docstring); returns the records and the check."""
    store_class = STORES[config.store]
    reason = store_class.unavailable()
    if reason is not None:
        raise RuntimeError(f"store unavailable: {reason}")
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{config.store}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store = store_class(workdir, config.ttl)
    harness = Harness(config, store, workdir)
    rows: list[dict[str, Any]] = []
    started = clock()
    try:
        log(f"starting a private {store.name} in {workdir}")
        store.start()
        harness.migrate()
        for index in range(config.electors):
            harness.spawn(f"e{index}")
        for index in range(config.runleaders):
            harness.spawn(f"r{index}")
        log(f"{config.electors} Elector and {config.runleaders} runleader candidates started")
        if harness.until(harness.leader, FIRST_LEADER) is None:
            raise RuntimeError(f"no leader within {FIRST_LEADER:.0f} s; logs in {workdir}")
        harness.wait(SETTLE)  # every candidate has started Django and campaigns
        started = clock()
        log(f"first leader: {harness.last_act}; nemesis for {config.duration:.0f} s "
            f"(seed {config.seed})")  # fmt: skip
        harness.nemesis(config.duration)
        harness.wait(config.ttl)  # let the last fault play out
    finally:
        ended = clock()
        harness.kill_everything()
        harness.tick()
        try:
            rows = store.rows()
        except Exception as exc:
            harness.notes.append(f"could not read the fenced writes: {exc}")
        store.stop()
        store.remove()
    records = [
        {"ev": "run", "t": started, **{k: str(v) if isinstance(v, Path) else v
                                      for k, v in asdict(config).items()}},
        *harness.records, *harness.events, *rows,
        {"ev": "run_end", "t": ended},
    ]  # fmt: skip
    with open(workdir / "records.jsonl", "w") as out:
        for record in records:
            out.write(json.dumps(record, default=str) + "\n")
    outcome = _check(config, records, workdir, started, ended, harness.notes)
    if not config.keep and config.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def _check(config: Config, records: list[dict[str, Any]], workdir: Path, started: float,
           ended: float, notes: list[str]) -> Outcome:  # fmt: skip
    # Only what happened during the nemesis counts; start-up and shutdown do not.
    checked = [r for r in records if r["ev"] in ("row", "run") or started <= r["t"] <= ended]
    result = checker.check(checked, config.params)
    faults = [r for r in records if r["ev"] == "fault"]
    return Outcome(config, result, records, faults, workdir, started, ended, notes)


def recheck(workdir: Path) -> Outcome:
    """Check the records a run kept in ``workdir`` (``--keep`` or ``--workdir``) again."""
    with open(workdir / "records.jsonl") as source:
        records = [json.loads(line) for line in source if line.strip()]
    run = next(r for r in records if r["ev"] == "run")
    fields = {f: run[f] for f in Config.__dataclass_fields__ if f in run and f != "workdir"}
    config = Config(**fields, workdir=workdir)
    ended = next((r["t"] for r in records if r["ev"] == "run_end"), None)
    if ended is None:  # kept by an older harness: the last act
        ended = max(float(r.get("t1", r["t"])) for r in records if r["ev"] == "act")
    return _check(config, records, workdir, float(run["t"]), float(ended), [])
