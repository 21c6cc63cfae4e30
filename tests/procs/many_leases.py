"""A process that holds many leases at once, for tests/processes/test_sessions.py; or, with
``DL_MP_ROLE=operator``, another process acting on the same leases through the backend.

Environment: :mod:`.common`'s (``DL_MP_STORE``, ``DL_MP_ALIAS``, ``DL_MP_DB_ALIAS``,
``DL_MP_DB_NAME``, ``DL_MP_ZOOKEEPER_ROOT``), and the ``DJANGO_LEADER_*`` variables of the
test project's settings (the store that ``lock()`` and ``Elector`` use by default, and the
default timing). It uses the public API only: ``lock()``, ``Elector``,
``hooks.add_observer``, and for the operator the backend's ``acquire``, ``read`` and
``force_release``.

Events (JSON lines on stdout): ``ready`` (``threads_total``: the process's threads before
any lease, from ``/proc/self/status``), then one reply per command.

Commands of a holder (stdin, JSON lines):

``hold``
    enter ``lock(f"{prefix}-{i}", ttl=ttl, timeout=within)`` for ``i`` in
    ``range(count)``, one after the other in the main thread (an ``ExitStack`` keeps them
    all); reply ``holding`` (``renew_interval`` of the locks, ``tokens``), or
    ``hold_failed`` (``index``, ``error``) after releasing those it had.
``elect``
    start ``count`` Electors (``f"{prefix}-{i}"``, ``ttl``) and wait up to ``within`` s for
    each to lead; reply ``elected`` (``names``, ``tokens``), or ``elect_failed``.
``status``
    reply ``status``: per lease, whether ``lease.lost`` is set (read first, without
    ``lease.held``, which would itself mark a passed deadline), ``held``, ``lost_cause``
    (the ``LossReason`` name), token, ``expires_at``/``renewed_at`` (store clock, epoch
    seconds); per Elector, ``is_leader``; ``threads_total`` and the names of the threads
    named ``leader-...``; the number of renewals the observers saw succeed and be refused
    (``renew``, ``renew_refused``) per lease since the last ``status``.
``release``
    leave every ``lock()`` block and stop every Elector; reply ``released`` (``errors``).

Commands of an operator:

``force_release``
    ``backend.force_release(name)``; reply ``forced`` (``token`` of the lease it freed).
``acquire_all``
    ``backend.acquire(name, identity, ttl)`` for each of ``names``, each tried again until
    granted (while its earlier term runs out), for up to ``within`` seconds in all; reply
    ``acquired_all`` (per name: ``token``, ``acquired_at``), or ``acquire_failed``.
``read``
    ``backend.read(name)`` for each of ``names``; reply ``read`` (per name: ``holder`` and
    ``token``, or None).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Any

from tests.procs.common import commands, emit, epoch, make_backend, setup_django

if TYPE_CHECKING:
    from django_leader import Elector, Lease


def threads_total() -> int:
    """Every thread of this process, Python's or not (``Threads:`` of /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads: line in /proc/self/status")


def leader_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("leader-"))


def describe(lease: Lease) -> dict[str, Any]:
    lost = lease.lost.is_set()  # before .held, which marks a passed deadline as lost
    return {
        "token": lease.token,
        "lost": lost,
        "held": lease.held,
        "lost_cause": None if lease.lost_cause is None else lease.lost_cause.name,
        "lost_reason": lease.lost_reason,
        "expires_at": epoch(lease.expires_at),
        "renewed_at": epoch(lease.renewed_at),
    }


class Holder:
    def __init__(self) -> None:
        from django_leader import hooks

        self.stack = contextlib.ExitStack()
        self.leases: dict[str, Lease] = {}
        self.electors: dict[str, Elector] = {}
        self.seen: Counter[tuple[str, str]] = Counter()
        self.seen_lock = threading.Lock()
        hooks.add_observer(self.observe)

    def observe(self, event: str, name: str, value: float) -> None:
        if event in ("renew", "renew_refused", "renew_failed"):
            with self.seen_lock:
                self.seen[(event, name)] += 1

    def hold(self, prefix: str, count: int, ttl: float, timeout: float) -> None:
        from django_leader import lock

        renew_interval = None
        for i in range(count):
            name = f"{prefix}-{i}"
            try:
                held = lock(name, ttl=ttl, timeout=timeout)
                renew_interval = held.timing.renew_interval
                self.leases[name] = self.stack.enter_context(held)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                threads, names = threads_total(), leader_threads()
                errors = self.release()
                emit(
                    "hold_failed",
                    index=i,
                    error=error,
                    trace=traceback.format_exc(limit=3),
                    threads_total=threads,
                    leader_threads=len(names),
                    release_errors=errors,
                )
                return
        emit(
            "holding",
            count=count,
            renew_interval=renew_interval,
            tokens={name: lease.token for name, lease in self.leases.items()},
        )

    def elect(self, prefix: str, count: int, ttl: float, timeout: float) -> None:
        from django_leader import Elector

        for i in range(count):
            elector = Elector(f"{prefix}-{i}", ttl=ttl)
            self.electors[elector.name] = elector
            elector.start()
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if all(e.is_leader for e in self.electors.values()):
                tokens = {}
                for name, elector in self.electors.items():
                    lease = elector.lease
                    tokens[name] = None if lease is None else lease.token
                emit("elected", names=sorted(self.electors), tokens=tokens)
                return
            time.sleep(0.05)
        leading = sorted(n for n, e in self.electors.items() if e.is_leader)
        emit("elect_failed", leading=leading, of=len(self.electors))

    def status(self) -> None:
        with self.seen_lock:
            seen, self.seen = self.seen, Counter()
        emit(
            "status",
            leases={name: describe(lease) for name, lease in self.leases.items()},
            electors={name: e.is_leader for name, e in self.electors.items()},
            threads_total=threads_total(),
            leader_threads=leader_threads(),
            renewed={name: n for (event, name), n in seen.items() if event == "renew"},
            refused={name: n for (event, name), n in seen.items() if event == "renew_refused"},
            failed={name: n for (event, name), n in seen.items() if event == "renew_failed"},
        )

    def release(self) -> list[str]:
        errors = []
        for elector in self.electors.values():
            try:
                elector.stop(timeout=30)
            except Exception as exc:
                errors.append(f"{elector.name}: {type(exc).__name__}: {exc}")
        try:
            self.stack.close()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        self.leases.clear()
        self.electors.clear()
        return errors


def operate(command: dict[str, Any]) -> None:
    from django_leader.backends.base import Backend

    global _backend
    if _backend is None:
        _backend = make_backend()
    backend: Backend = _backend
    identity = os.environ.get("DL_MP_IDENTITY", f"operator-{os.getpid()}")
    cmd = command["cmd"]
    if cmd == "force_release":
        freed = backend.force_release(command["name"], actor="test_sessions")
        emit("forced", name=command["name"], token=None if freed is None else freed.token)
    elif cmd == "acquire_all":
        give_up = time.monotonic() + command["within"]
        granted: dict[str, Any] = {}
        pending = list(command["names"])
        while pending and time.monotonic() < give_up:
            for name in list(pending):
                lease, _ = backend.acquire(name, identity, command["ttl"])
                if lease is not None:
                    granted[name] = {"token": lease.token, "acquired_at": epoch(lease.acquired_at)}
                    pending.remove(name)
            if pending:
                time.sleep(0.1)
        if pending:
            emit("acquire_failed", pending=pending, granted=len(granted))
        else:
            emit("acquired_all", leases=granted, identity=identity)
    elif cmd == "read":
        found = {}
        for name in command["names"]:
            lease = backend.read(name)
            found[name] = None if lease is None else {"holder": lease.holder, "token": lease.token}
        emit("read", leases=found)
    else:
        emit("error", error=f"unknown command {command!r}")


_backend: Any = None


def main() -> None:
    setup_django()
    operator = os.environ.get("DL_MP_ROLE") == "operator"
    holder = None if operator else Holder()
    emit("ready", threads_total=threads_total(), leader_threads=leader_threads())
    for command in commands():
        try:
            if holder is None:
                operate(command)
            elif command["cmd"] == "hold":
                holder.hold(command["prefix"], command["count"], command["ttl"], command["within"])
            elif command["cmd"] == "elect":
                holder.elect(command["prefix"], command["count"], command["ttl"], command["within"])
            elif command["cmd"] == "status":
                holder.status()
            elif command["cmd"] == "release":
                emit("released", errors=holder.release())
            else:
                emit("error", error=f"unknown command {command!r}")
        except Exception as exc:
            emit("fatal", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
    if holder is not None:
        holder.release()
    if _backend is not None:
        _backend.flush_history(10)
    os._exit(0)


if __name__ == "__main__":
    main()
