"""An asyncio program that holds ``alock()`` or runs an ``AsyncElector``, for
tests/processes/test_async_multiprocess.py.

Environment (besides :mod:`.common`'s, which pick the store): ``DL_MP_IDENTITY``,
``DL_MP_LEASE``, ``DL_MP_TTL``, ``DL_MP_RENEW``, ``DL_MP_RETRY`` and ``DL_ASYNC_MODE``:

``contend``
    ``DL_ASYNC_TASKS`` tasks contend for ``alock(DL_MP_LEASE)``. Reports ``ready``; on the
    command ``go`` (``at``: a wall-clock start, ``seconds``) each task enters and leaves
    the lock over and over until ``at + seconds``, appending an ``enter`` and an ``exit``
    record (JSON: ``pid``, ``task``, ``token``, ``clock``, ``held``) to the shared file
    ``DL_ASYNC_LOG`` while it holds the lease (one ``O_APPEND`` write each, fsync'd); then
    reports ``done`` (``entries``, ``errors``).
``hold``
    takes ``alock(DL_MP_LEASE)`` and holds it; reports ``acquired`` (the lease's fields) and
    writes a ``FencedWrite`` (note ``before``) through ``await lease.afenced()``. A monitor
    thread (not the loop) reports ``renewed`` each time the local deadline moves,
    ``state`` when ``(held, lost)`` changes or on its first sample after a pause (``gap``),
    and ``lost``. Commands:

    ``block`` (``freeze``: bool)
        the coroutine reports ``blocking`` and blocks the event loop in a synchronous wait
        until ``unblock``; with ``freeze``, the store thread then SIGSTOPs the process as
        the next renewal returns (no store call in flight: no lock held while stopped, see
        :class:`Freezer`), reporting ``freezing``, and ``resumed`` (``held``, ``lost``)
        first thing after SIGCONT. Once unblocked the coroutine samples the lease before
        anything else (``unblocked``: ``held``, ``lost``, ``blocked_for``) and, if it was
        frozen, tries to
        act: a fenced write (note ``after``) with its lease and with a copy that does not
        know it lost (note ``after-unaware``); reply ``wrote`` (``fenced``, ``unaware``:
        ``committed`` or ``rejected: ...``).
    ``unblock``
        handled by the stdin thread (the loop is blocked): ends the synchronous wait.
``elector``
    an ``AsyncElector`` with async callbacks (``elected``, ``lost``, ``new_leader``) and an
    async work (``working``; ``work_ended`` when it returns (it awaits ``wait_lost()``) or is
    cancelled at the loss: ``cancelled``); ``ready`` once
    campaigning. A monitor thread reports ``state`` (``is_leader`` changed, or its first
    sample after a pause: ``gap``) and ``renewed``; the command ``block`` (``freeze``) blocks
    the loop, and SIGSTOPs the process as the next renewal returns, as in ``hold`` (``resumed``:
    ``is_leader``, ``held``, ``lost``), until ``unblock`` (``unblocked``: ``is_leader``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from tests.procs.common import (
    Freezer,
    clock,
    db_alias,
    elector_state,
    emit,
    lease_fields,
    make_backend,
    setup_django,
)

if TYPE_CHECKING:
    from django_leader import Lease

#: How often the monitor thread samples the lease.
POLL = 0.01
#: A pause between two samples longer than this is reported (``state``, ``gap``).
GAP = 0.5


class Commands:
    """The parent's commands, read by a thread of their own: ``unblock`` is handled there
    (it must work while the event loop is blocked), the others queued for the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.unblock = threading.Event()
        threading.Thread(target=self._read, name="commands", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command["cmd"] == "unblock":
                self.unblock.set()
            else:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, command)


async def contend() -> None:
    from django_leader import LeaseHeld, alock

    backend = make_backend()
    name = os.environ["DL_MP_LEASE"]
    ttl = float(os.environ["DL_MP_TTL"])
    log = os.open(os.environ["DL_ASYNC_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    commands = Commands(asyncio.get_running_loop())
    emit("ready")
    go = await commands.queue.get()
    at, seconds = float(go["at"]), float(go["seconds"])
    entries: list[int] = []
    errors: list[str] = []

    def record(kind: str, task: int, lease: Lease) -> None:
        line = {
            "ev": kind,
            "pid": os.getpid(),
            "task": task,
            "token": lease.token,
            "clock": clock(),
            "held": lease.held,
        }
        # One write of one short line on an O_APPEND file: atomic, in the order of the
        # writes of every process; fsync'd before the lease is released.
        os.write(log, (json.dumps(line) + "\n").encode())
        os.fsync(log)

    async def task(number: int) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        while time.time() < at + seconds:
            try:
                async with alock(name, ttl=ttl, timeout=seconds + 30, backend=backend) as lease:
                    record("enter", number, lease)
                    entries.append(lease.token)
                    # Stay inside over a few loop turns, so that an overlap would show.
                    for _ in range(3):
                        await asyncio.sleep(0.005)
                    record("exit", number, lease)
            except LeaseHeld as exc:
                errors.append(f"LeaseHeld: {exc}")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0)

    await asyncio.gather(*(task(n) for n in range(int(os.environ["DL_ASYNC_TASKS"]))))
    emit("done", entries=len(entries), errors=errors)


async def hold() -> None:
    from django_leader import LeadershipLost, alock
    from testproject.demoapp.models import FencedWrite

    backend = make_backend()
    name = os.environ["DL_MP_LEASE"]
    database = db_alias()
    # A database store fences with its lease row; the others with the fence row in the
    # database the rows go to (docs/safety.md).
    using = None if os.environ["DL_MP_STORE"] == "database" else database
    commands = Commands(asyncio.get_running_loop())
    freezer = Freezer(backend)

    def write(held: Lease, note: str) -> None:
        FencedWrite.objects.using(database).create(writer=name, token=held.token, note=note)

    async def fenced_write(held: Lease, note: str) -> str:
        try:
            await held.afenced(write, held, note, using=using)
        except LeadershipLost as exc:
            return f"rejected: {exc}"
        return "committed"

    def monitor(lease: Lease) -> None:
        seen = lease.deadline
        state = (lease.held, lease.lost.is_set())
        sampled = time.monotonic()
        while True:
            now, previous = time.monotonic(), sampled
            sampled = now
            gap = now - previous if now - previous > GAP else None
            current = (lease.held, lease.lost.is_set())
            if current != state or gap is not None:
                emit("state", held=current[0], lost=current[1], gap=gap, token=lease.token)
                if current[1] and not state[1]:
                    emit("lost", reason=lease.lost_reason, **lease_fields(lease))
                state = current
            if lease.deadline != seen:
                seen = lease.deadline
                emit("renewed", **lease_fields(lease))
            time.sleep(POLL)

    async with alock(name, ttl=float(os.environ["DL_MP_TTL"]), backend=backend) as lease:
        freezer.report = lambda: {
            **lease_fields(lease),
            "held": lease.held,
            "lost": lease.lost.is_set(),
        }
        threading.Thread(target=monitor, args=(lease,), name="monitor", daemon=True).start()
        emit("acquired", **lease_fields(lease))
        emit("wrote", note="before", fenced=await fenced_write(lease, "before"))
        while True:
            command = await commands.queue.get()
            if command["cmd"] != "block":
                emit("error", error=f"unknown command {command!r}")
                continue
            frozen = bool(command.get("freeze"))
            commands.unblock.clear()
            emit("blocking", freeze=frozen)
            if frozen:
                freezer.armed.set()
            started = time.monotonic()
            # The fault: a long synchronous call blocks the event loop.
            commands.unblock.wait(120)
            held, lost = lease.held, lease.lost.is_set()  # before anything else
            emit("unblocked", held=held, lost=lost, blocked_for=time.monotonic() - started)
            if frozen:
                unaware = dataclasses.replace(
                    lease, lost=threading.Event(), lost_reason="", deadline=clock() + 60
                )
                emit(
                    "wrote",
                    note="after",
                    fenced=await fenced_write(lease, "after"),
                    unaware=await fenced_write(unaware, "after-unaware"),
                )


async def elect() -> None:
    from django_leader import AsyncElector

    class Reporting(AsyncElector):
        async def on_elected(self, lease: Lease) -> None:
            emit("elected", **lease_fields(lease))

        async def on_lost(self, lease: Lease) -> None:
            assert lease.deadline is not None
            emit("lost", reason=lease.lost_reason, **lease_fields(lease))

        async def on_new_leader(self, lease: Lease) -> None:
            emit("new_leader", holder=lease.holder, token=lease.token)

    async def work(lease: Lease) -> None:
        emit("working", token=lease.token)
        cancelled = False
        try:
            await lease.wait_lost()
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            emit("work_ended", token=lease.token, cancelled=cancelled, held=lease.held)

    backend = make_backend()
    freezer = Freezer(backend)
    elector = Reporting(
        os.environ["DL_MP_LEASE"],
        ttl=float(os.environ["DL_MP_TTL"]),
        renew_interval=float(os.environ["DL_MP_RENEW"]),
        retry_interval=float(os.environ["DL_MP_RETRY"]),
        identity=os.environ["DL_MP_IDENTITY"],
        backend=backend,
    )
    commands = Commands(asyncio.get_running_loop())

    freezer.report = elector_state(elector)

    def monitor() -> None:
        leading, deadline, sampled = False, None, time.monotonic()
        while True:
            now, previous = time.monotonic(), sampled
            sampled = now
            gap = now - previous if now - previous > GAP else None
            lease = elector.lease
            current = elector.is_leader
            if current != leading or gap is not None:
                leading = current
                token = None if lease is None else lease.token
                emit("state", leader=current, gap=gap, token=token)
            if lease is not None and lease.deadline != deadline:
                deadline = lease.deadline
                emit("renewed", **lease_fields(lease))
            time.sleep(POLL)

    await elector.start(work)
    threading.Thread(target=monitor, name="monitor", daemon=True).start()
    emit("ready")
    while True:
        command = await commands.queue.get()
        if command["cmd"] != "block":
            emit("error", error=f"unknown command {command!r}")
            continue
        commands.unblock.clear()
        emit("blocking", freeze=bool(command.get("freeze")))
        if command.get("freeze"):
            freezer.armed.set()
        started = time.monotonic()
        # The fault: a long synchronous call blocks the event loop.
        commands.unblock.wait(120)
        leading = elector.is_leader  # before anything else
        emit("unblocked", is_leader=leading, blocked_for=time.monotonic() - started)


def main() -> None:
    setup_django()
    mode = os.environ["DL_ASYNC_MODE"]
    program = {"contend": contend, "hold": hold, "elector": elect}[mode]
    try:
        asyncio.run(program())
    except BaseException as exc:
        emit("fatal", error=f"{type(exc).__name__}: {exc}")
        raise
    os._exit(0)


if __name__ == "__main__":
    main()
