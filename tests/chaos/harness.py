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
``clock-ahead``, ``clock-behind``, ``clock-slew``
    the WALL clock of one candidate (the leader's or a follower's, at random) stepped an
    hour ahead or behind, or set running at twice or half speed (an offset the nemesis
    moves every :data:`TICK`; the waits stay real), for 1-3 TTLs; then stepped back to
    the real time (``clock-back``, a fault record of its own: a step too). Every candidate
    runs under libfaketime (:data:`LIBFAKETIME`) with an offset file of its slot, which
    the nemesis rewrites; ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` stay real, as with an
    NTP step, and every record is stamped with ``CLOCK_BOOTTIME``. Not on SQLite, whose
    clock is the process's own (a step there is a store clock step, docs/safety.md).
``stall``
    the leading Elector candidate's work stops (SIGUSR2) for :data:`STALL` TTLs without
    ``lease.heartbeat()``, past its ``watchdog=`` (:data:`WATCHDOG` TTLs), then acts once
    unchecked with its token: the elector stepped down when the watchdog fired but kept the
    lease renewed until the work returned, so that act comes before the next term's.
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
from tests.chaos.network import STORE, Network
from tests.chaos.stores import STORES, Store, clock
from tests.support import netns

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
#: libfaketime, multithreaded (Debian/Ubuntu: ``apt-get install faketime``): the
#: candidates' wall clocks, for the clock faults.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
#: A ``sitecustomize`` that mends ``time.sleep()`` under libfaketime (see its docstring).
MEND_SLEEP = ROOT / "tests" / "chaos" / "faketime"
#: Seconds a ``clock-ahead`` or ``clock-behind`` fault steps the wall clock.
CLOCK_STEP = 3600
#: The Elector candidates' ``watchdog=``, in TTLs (longer than a fenced write may block).
WATCHDOG = 1.5
#: How long a ``stall`` fault stops the work, in TTLs (past the watchdog).
STALL = 2.5

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
    #: Candidates and store in network namespaces of their own, with partitions among
    #: the faults: True, False, or None for "where namespaces can be made" (not SQLite).
    network: bool | None = None
    #: Only these fault kinds (names, or ``partition`` for every network fault); empty:
    #: every kind that applies.
    kinds: tuple[str, ...] = ()
    #: Candidates under libfaketime, with wall-clock steps among the faults: True, False,
    #: or None for "where libfaketime is installed" (not SQLite).
    clocks: bool | None = None
    #: The Elector candidates with ``watchdog=`` (:data:`WATCHDOG`), with ``stall`` among
    #: the faults.
    stalls: bool = True

    @property
    def params(self) -> checker.Params:
        delay = self.ttl if self.lock_delay is None else self.lock_delay
        loses = getattr(STORES.get(self.store), "loses_writes", False)
        return checker.Params(self.ttl, self.retry_interval, delay, loses_writes=loses)


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
    def __init__(self, config: Config, store: Store, workdir: Path,
                 network: Network | None = None) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.network = network
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
        self.stalling: list[dict[str, Any]] = []
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
            "CHAOS_WATCHDOG": str(WATCHDOG * c.ttl) if c.stalls else "",
            "CHAOS_STALL": str(STALL * c.ttl),
            **self.store.env(),
        }

    def command(self, port: str, argv: list[str]) -> list[str]:
        """``argv`` run in ``port``'s namespace (a slot, or the store's), if on a network."""
        return argv if self.network is None else self.network.command(port, argv)

    def at_store(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread where the store's server runs (its namespace) for a block."""
        return contextlib.nullcontext() if self.network is None else self.network.inside(STORE)

    def migrate(self) -> None:
        done = subprocess.run(
            self.command(STORE, [sys.executable, "-m", "tests.chaos.candidate", "--migrate"]),
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
        if self.config.clocks:
            # Its slot's wall clock (libfaketime reads the file on every call): an offset
            # the nemesis rewrites; the monotonic clocks stay real, as with an NTP step.
            path = self.clock_file(slot)
            if not path.exists():
                path.write_text("+0\n")
            preload = [str(LIBFAKETIME), *filter(None, [env.get("LD_PRELOAD")])]
            env.update(LD_PRELOAD=" ".join(preload), FAKETIME_TIMESTAMP_FILE=str(path),
                       FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1",
                       # Its sitecustomize mends time.sleep() under libfaketime.
                       PYTHONPATH=f"{MEND_SLEEP}:{env['PYTHONPATH']}")  # fmt: skip
        with open(self.logdir / f"{identity}.out", "ab") as out:
            proc = subprocess.Popen(self.command(slot, cmd), cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # fmt: skip
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
            if record["ev"] == "stalling":
                self.stalling.append(record)
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

    def kinds(self) -> list[FaultKind]:
        """The fault kinds of this run: :data:`FAULTS`, the store's own, and the network's
        when the run has one (restricted to ``config.kinds`` if given)."""
        kinds = [kind for kind in FAULTS if (not kind.network or self.network is not None)
                 and (not kind.clock or bool(self.config.clocks))
                 and (kind.name != "stall" or self.config.stalls)]  # fmt: skip
        kinds += [FaultKind(name, partial(Harness.store_fault, kind=name),
                            partial(_store_fault_applies, kind=name))
                  for name in self.store.faults]  # fmt: skip
        wanted = set(self.config.kinds)
        if wanted:
            kinds = [k for k in kinds if k.name in wanted or ("partition" in wanted and k.network)
                     or ("clock" in wanted and k.clock)
                     or ("store" in wanted and k.name in self.store.faults)]  # fmt: skip
        return kinds

    def fault(self, kind: str, start: float, ready: float, lossy: bool = False,
              **fields: Any) -> dict[str, Any]:  # fmt: skip
        return self.event("fault", kind=kind, t=start, ready=ready, lossy=lossy, **fields)

    def bound(self, fault: dict[str, Any]) -> float:
        """The liveness bound of ``fault``: the checker's (see :meth:`checker.Params.bound`)."""
        return self.config.params.bound(bool(fault["lossy"])) + float(fault.get("slack", 0.0))

    def recovered(self, fault: dict[str, Any]) -> bool:
        """Whether a leader acts again after ``fault`` (another term than the one it hit,
        for a fault aimed at the leader; after a partition, once it healed)."""
        act = self.leader()
        if act is None:
            return False
        after = max(float(fault["ready"]), float(fault.get("healed", fault["ready"])))
        if "target" in fault:
            return act["t"] > after and (act["who"], act["token"]) != (
                fault["target"],
                fault["token"],
            )
        if "healed" in fault:
            return bool(act["t"] > after)
        # A store fault: long enough for its effects to show (an old leader acting on
        # after a flush, a leader whose writes keep failing), then a leader.
        return bool(act["t"] > fault["ready"] + self.bound(fault))

    def nemesis(self, duration: float) -> None:
        params = self.config.params
        end = clock() + duration
        kinds = self.kinds()
        take_snapshot = getattr(self.store, "take_snapshot", None)
        if take_snapshot is not None:
            with self.at_store():
                take_snapshot()
            self.event("snapshot")
        while clock() < end:
            leader = self.until(self.leader, params.bound(True) + 5)
            choices = [kind for kind in kinds if kind.applies(self, leader)]
            if not choices:
                continue
            kind = self.rng.choices(choices, weights=[k.weight for k in choices])[0]
            fault = kind.inject(self, leader)
            if fault is not None:
                self.until(partial(self.recovered, fault), self.bound(fault) + 2)
            self.wait(self.rng.uniform(0.3, 1.5))

    def process_fault(self, leader: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
        """``kill``, ``stop``, ``term``, ``guard-kill`` or ``fenced-freeze`` of the leader."""
        c = self.config
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
            held = self.held(pid)
            self.until(lambda: clock() >= start + self.rng.uniform(2.5, 3.5) * c.ttl, 60)
            self.resume(pid, record, held)
            return record
        sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}[kind]
        start = clock()
        os.kill(pid, sig)
        record = self.fault(kind, start, start, target=who, token=leader["token"])
        if kind == "stop":
            held = self.held(pid)
            self.wait(self.rng.uniform(1.2, 2.0) * c.ttl)
            self.resume(pid, record, held)
        return record

    def held(self, pid: int) -> str:
        """The locks on the store that ``pid``, just sent a SIGSTOP, keeps every other
        process out with while stopped (:meth:`Store.locks_held`), once the signal took
        effect."""
        return self.store.locks_held(pid) if stopped(pid) else ""

    def resume(self, pid: int, record: dict[str, Any], held: str) -> None:
        """SIGCONT to ``pid``, stopped by the fault ``record`` while it held the locks
        ``held``. With any (SQLite has no server to end a frozen process's transaction or
        read: its file lock keeps every writer out until the process runs again;
        docs/database-backend.md) the store answers only from now on."""
        os.kill(pid, signal.SIGCONT)
        if held:
            record["ready"] = clock()
            record["locks"] = held

    def store_fault(self, leader: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
        """One of the store's own faults (:attr:`tests.chaos.stores.Store.faults`)."""
        with self.at_store():
            injected = self.store.inject(kind, self.rng)
        record = self.fault(kind, injected.start, injected.ready, injected.lossy,
                            detail=injected.detail)  # fmt: skip
        take_snapshot = getattr(self.store, "take_snapshot", None)
        if take_snapshot is not None and self.rng.random() < 0.3:
            with self.at_store():
                take_snapshot()
            self.event("snapshot")
        return record

    # -- partitions -------------------------------------------------------------------

    def followers(self, leader: dict[str, Any] | None) -> list[str]:
        """The slots whose candidate runs and does not lead."""
        led = None if leader is None else _slot(leader["who"])
        return [slot for slot, who in self.slots.items()
                if slot != led and self.procs[who].poll() is None]  # fmt: skip

    def partition(self, leader: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
        """Cut, lose or delay frames (see :data:`PARTITIONS`) for a while, then heal."""
        c, network = self.config, self.network
        assert network is not None
        fields: dict[str, Any] = {}
        if kind == "part-store":
            victim = STORE
        elif kind == "part-follower":
            victim = self.rng.choice(self.followers(leader))
        else:
            assert leader is not None
            victim = _slot(leader["who"])
        rules: list[dict[str, Any]]
        if kind == "part-leader-replies":  # requests reach the store, replies do not
            rules = [{"src": STORE, "dst": victim, "loss": 1.0}]
        elif kind == "part-leader-requests":  # replies would, requests do not
            rules = [{"src": victim, "dst": STORE, "loss": 1.0}]
        elif kind == "delay-leader":
            delay = self.rng.uniform(1.2, 3.0) * c.renew_interval
            direction = self.rng.choice(["both", "requests", "replies"])
            rules = []
            if direction in ("both", "requests"):
                rules.append({"src": victim, "dst": STORE, "delay": delay})
            if direction in ("both", "replies"):
                rules.append({"src": STORE, "dst": victim, "delay": delay})
            fields.update(delay=round(delay, 3), direction=direction)
        else:  # part-leader, part-follower, part-store: cut off both ways
            rules = [{"src": victim, "dst": "*", "loss": 1.0},
                     {"src": "*", "dst": victim, "loss": 1.0}]  # fmt: skip
        low, high = PARTITIONS[kind]
        seconds = self.rng.uniform(low, high) * c.ttl
        network.apply(rules)
        start = clock()
        self.wait(seconds)
        counts = network.heal()
        healed = clock()
        if kind in ("part-leader", "part-leader-replies", "part-leader-requests"):
            assert leader is not None
            fields.update(target=leader["who"], token=leader["token"])
        # From when may a leader be asked for (see docs/chaos.md, "Partitions").
        ready, slack = start, 0.0
        if kind == "part-leader-replies":
            slack = c.ttl  # the store renewed what the holder took for failed renewals
        elif kind == "part-store":
            ready, slack = healed, RECONNECT
        elif kind == "delay-leader":
            ready = healed + float(fields["delay"])  # frames held back still arrive
        return self.fault(kind, start, ready, victim=victim, healed=healed,
                          seconds=round(seconds, 3), slack=slack, switch=counts,
                          **fields)  # fmt: skip

    def stall(self, leader: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
        """The leading Elector candidate's work stalls past its watchdog (SIGUSR2)."""
        assert leader is not None
        who = leader["who"]
        armed = clock()
        os.kill(self.procs[who].pid, signal.SIGUSR2)
        stalled = self.until(
            lambda: next((r for r in self.stalling if r["who"] == who and r["t"] >= armed),
                         None),
            timeout=1.5,
        )  # fmt: skip
        if stalled is None:
            self.event("skipped", kind=kind, who=who)
            return None
        start = float(stalled["t"])
        # The lease is held until the work returns: from then on a leader is due.
        return self.fault(kind, start, start + float(stalled["seconds"]), target=who,
                          token=stalled["token"], seconds=stalled["seconds"])  # fmt: skip

    # -- clocks -----------------------------------------------------------------------

    def clock_file(self, slot: str) -> Path:
        """The libfaketime offset file of ``slot``'s candidates."""
        return self.workdir / f"faketime-{slot}"

    def set_clock(self, slot: str, spec: str) -> float:
        """Set ``slot``'s wall clock to libfaketime's ``spec`` (an offset: ``+3600``,
        ``-3600``, ``+0.125``...); the instant, on the boot clock."""
        path = self.clock_file(slot)
        staged = path.with_name(path.name + ".new")
        staged.write_text(spec + "\n")
        staged.replace(path)  # whole: the candidate reads it on every clock call
        return clock()

    def clock_fault(self, leader: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
        """Step (or slew) the wall clock of the leader or of a follower, for 1-3 TTLs,
        then step it back (a ``clock-back`` fault: another step)."""
        followers = self.followers(leader)
        if _leads(self, leader) and (not followers or self.rng.random() < 0.5):
            assert leader is not None
            role, victim = "leader", _slot(leader["who"])
        elif followers:
            role, victim = "follower", self.rng.choice(followers)
        else:
            return None
        slew, rate = kind == "clock-slew", 1.0
        if kind == "clock-ahead":
            spec = f"+{CLOCK_STEP}"
        elif kind == "clock-behind":
            spec = f"-{CLOCK_STEP}"
        else:
            rate = self.rng.choice([2.0, 0.5])
            spec = f"x{rate:g}"
        start = self.set_clock(victim, "+0" if slew else spec)
        self.fault(kind, start, start, victim=victim, role=role, spec=spec,
                   identity=self.slots[victim])  # fmt: skip
        seconds = self.rng.uniform(1.0, 3.0) * self.config.ttl
        if not slew:
            self.wait(seconds)
        else:
            # A slew: the wall clock runs at ``rate`` while the waits stay real, as under
            # NTP (whose slews are far smaller). Not libfaketime's own rate (``+0 x2``),
            # which also stretches or shrinks every select(), poll() and epoll_wait()
            # timeout of the process by 1/rate: a process that sleeps twice as long, a
            # different fault, that made a 0.75 s loop block look like 1.5 s without a
            # leader. The offset follows the rate in steps of one TICK.
            end = start + seconds

            def slewing() -> bool:
                now = clock()
                self.set_clock(victim, f"{(rate - 1.0) * (min(now, end) - start):+.3f}")
                return now >= end

            self.until(slewing, seconds + 1)
        back = self.set_clock(victim, "+0")
        return self.fault("clock-back", back, back, victim=victim, role=role, spec="+0",
                          identity=self.slots[victim], after=kind)  # fmt: skip


def stopped(pid: int, timeout: float = 1.0) -> bool:
    """Wait until the SIGSTOP sent to ``pid`` took effect (state ``T`` in
    ``/proc/PID/stat``): from then on the locks it holds stay as they are. False if it did
    not within ``timeout`` seconds, or is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        # "PID (comm) STATE ...": comm may hold spaces and parentheses.
        if stat[stat.rindex(")") + 2] in "Tt":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)


def _slot(identity: str) -> str:
    return identity.rsplit("-", 1)[0]


@dataclass(frozen=True)
class FaultKind:
    """A kind of fault the nemesis injects. Append one to :data:`FAULTS` to add it to
    every run (``config.kinds`` may restrict a run to some)."""

    name: str
    #: Injects it; returns the fault record (:meth:`Harness.fault`) or None if it could not
    #: be made. ``leader`` is the current leader's last act (or None).
    inject: Callable[[Harness, dict[str, Any] | None], dict[str, Any] | None]
    #: Whether it can be injected now.
    applies: Callable[[Harness, dict[str, Any] | None], bool] = lambda h, leader: True
    #: Its chance against the other kinds that apply.
    weight: float = 1.0
    #: A network fault: only in a run with a network (``config.network``).
    network: bool = False
    #: A clock fault: only in a run whose candidates run under libfaketime
    #: (``config.clocks``).
    clock: bool = False


def _leads(harness: Harness, leader: dict[str, Any] | None) -> bool:
    return leader is not None and harness.procs[leader["who"]].poll() is None


def _store_fault_applies(harness: Harness, leader: dict[str, Any] | None, kind: str) -> bool:
    # A restore from an older snapshot needs one taken.
    return kind != "redis-restore-old" or getattr(harness.store, "snapshot", None) is not None


#: How long each partition lasts, in TTLs (a uniform draw between the two).
PARTITIONS: dict[str, tuple[float, float]] = {
    "part-leader": (1.2, 2.0),  # the leader cut off, longer than the TTL
    "part-leader-replies": (1.2, 2.0),  # the store hears the leader, the leader not it
    "part-leader-requests": (1.2, 2.0),  # the leader hears the store, the store not it
    "delay-leader": (1.5, 3.0),  # frames held back longer than RENEW_INTERVAL
    "part-follower": (1.0, 2.5),  # a candidate that does not lead cut off
    "part-store": (0.5, 2.0),  # the store cut off from everyone
}
#: The weight of each network fault kind against the others' 1: a store with many faults
#: of its own (Redis: flush, three restarts, conn-kill) still gets more than 30 % of its
#: faults from the network.
NETWORK_WEIGHT = 1.5
#: Seconds allowed on top of the liveness bound after the store was cut off from
#: everyone, for the candidates' connections to come back (docs/chaos.md, "Partitions").
RECONNECT = 0.0

#: Every fault kind but the store's own (see :attr:`tests.chaos.stores.Store.faults`).
FAULTS: list[FaultKind] = [
    FaultKind("kill", partial(Harness.process_fault, kind="kill"), _leads),
    FaultKind("stop", partial(Harness.process_fault, kind="stop"), _leads),
    FaultKind("term", partial(Harness.process_fault, kind="term"), _leads),
    FaultKind("guard-kill", partial(Harness.process_fault, kind="guard-kill"),
              lambda h, leader: _leads(h, leader) and leader is not None
              and leader.get("role") == "payload"),
    FaultKind("fenced-freeze", partial(Harness.process_fault, kind="fenced-freeze"),
              lambda h, leader: _leads(h, leader) and leader is not None
              and leader.get("role") != "payload" and h.store.fenced),
    *(FaultKind(name, partial(Harness.partition, kind=name),
                (lambda h, leader: bool(h.followers(leader))) if name == "part-follower"
                else (lambda h, leader: True) if name == "part-store" else _leads,
                weight=NETWORK_WEIGHT, network=True)
      for name in PARTITIONS),
    FaultKind("stall", partial(Harness.stall, kind="stall"),
              lambda h, leader: _leads(h, leader) and leader is not None
              and leader.get("role") != "payload"),
    *(FaultKind(name, partial(Harness.clock_fault, kind=name),
                lambda h, leader: _leads(h, leader) or bool(h.followers(leader)),
                weight=0.5 if name == "clock-slew" else 1.0, clock=True)
      for name in ("clock-ahead", "clock-behind", "clock-slew")),
]  # fmt: skip


def run(config: Config, log: Callable[[str], None] = lambda line: None) -> Outcome:
    """One chaos run (see the module's docstring); returns the records and the check."""
    store_class = STORES[config.store]
    reason = store_class.unavailable()
    if reason is not None:
        raise RuntimeError(f"store unavailable: {reason}")
    if config.network is None:
        config.network = store_class.networked and netns.unavailable() is None
    elif config.network:
        if not store_class.networked:
            raise RuntimeError(f"{config.store} has no network to partition")
        reason = netns.unavailable()
        if reason is not None:
            raise RuntimeError(f"no network namespaces: {reason}")
    if config.clocks is None:
        config.clocks = config.store != "sqlite" and LIBFAKETIME.exists()
    elif config.clocks:
        if config.store == "sqlite":
            raise RuntimeError("sqlite reads the process's clock: a step is a store clock step")
        if not LIBFAKETIME.exists():
            raise RuntimeError(f"libfaketime is not installed ({LIBFAKETIME})")
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{config.store}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store = store_class(workdir, config.ttl)
    network = None
    if config.network:
        slots = [f"e{i}" for i in range(config.electors)]
        network = Network(workdir, slots + [f"r{i}" for i in range(config.runleaders)])
        network.start()
        store.on_network(network.address(STORE))
    harness = Harness(config, store, workdir, network)
    rows: list[dict[str, Any]] = []
    started = clock()
    try:
        where = f" in a namespace of its own, at {store.host}" if network else ""
        log(f"starting a private {store.name}{where}; files in {workdir}")
        with harness.at_store():
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
            with harness.at_store():
                rows = store.rows()
        except Exception as exc:
            harness.notes.append(f"could not read the fenced writes: {exc}")
        try:
            with harness.at_store():
                store.stop()
            store.remove()
        finally:
            if network is not None:
                network.close()
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
    locked = [f for f in faults if f.get("locks")]
    if locked:
        kinds = ", ".join(sorted({str(f["kind"]) for f in locked}))
        notes = [*notes, f"{len(locked)} of the {len(faults)} faults ({kinds}) froze a "
                 "candidate holding a lock on the SQLite file (a read or a write under way), "
                 "which keeps every writer out until it runs again: their recovery counts "
                 "from the SIGCONT (docs/chaos.md)"]  # fmt: skip
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
