"""An :class:`~django_leader.Elector` candidate whose wall clock the parent steps: run under
libfaketime (``LD_PRELOAD``, ``FAKETIME_TIMESTAMP_FILE`` that the parent rewrites,
``FAKETIME_NO_CACHE=1``, ``FAKETIME_DONT_FAKE_MONOTONIC=1``), so that ``time.time()``,
``datetime.now()`` and every C library's ``CLOCK_REALTIME`` (SQLite's ``'now'`` included)
move, while ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` do not: what an NTP step or an
operator's ``date -s`` does.

Environment: :mod:`.common`'s (the store), ``DL_MP_IDENTITY``, ``DL_MP_LEASE``,
``DL_MP_TTL``, ``DL_MP_RENEW``, ``DL_MP_RETRY``.

The work acts like a chaos candidate (``tests/chaos/candidate.py``), and every record
carries ``t`` (and ``t1``) on ``CLOCK_BOOTTIME``, the clock :mod:`tests.chaos.checker`
compares: ``act`` every :data:`ACT_EVERY` s while ``lease.check()`` passes (``wall``: this
process's ``time.time()`` then), a fenced write of a ``FencedWrite`` row (note: its
``t``) every :data:`WRITE_EVERY` s (``write`` with the row's ``id``, ``write_refused``,
``write_error``), ``elected``, ``lost``, ``deadline`` (a renewal moved the local deadline;
``deadline``: on the boot clock), ``acting_end``.

Commands (stdin, JSON lines):

``clock``
    reply ``clock``: ``wall`` (``time.time()``) and ``boot`` (``CLOCK_BOOTTIME``) read
    together, so that the parent can tell the step took effect.
``freeze``
    as the next renewal returns, once no fenced write is running (no store call in
    flight, no fenced transaction open), report ``freezing`` and SIGSTOP this whole
    process from the store thread (:class:`~tests.procs.common.Freezer`).
``probe``
    with the lease of token ``token`` (lost by now): a fenced write with it
    (``local_fence``) and with a copy that does not know it lost (``db_fence``: only the
    store can refuse it); reply ``probe``.
"""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING, Any, SupportsIndex

if "faketime" in os.environ.get("LD_PRELOAD", ""):
    # libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC fails clock_nanosleep() on
    # CLOCK_MONOTONIC with TIMER_ABSTIME (EINVAL), which is how Python >= 3.11 sleeps:
    # every time.sleep() would raise. The same wait, through select() (which retries with
    # the time left after a signal): a tool's defect, not a change of what is measured.
    def _sleep(seconds: float | SupportsIndex) -> None:
        select.select([], [], [], max(0.0, float(seconds)))

    time.sleep = _sleep

# (Imported after the sleep is fixed, before anything could take the broken one.)
import dataclasses
import threading

from tests.procs.common import (
    Freezer,
    clock,
    commands,
    db_alias,
    emit,
    make_backend,
    setup_django,
)

if TYPE_CHECKING:
    from django_leader import Lease

#: Seconds between two acts of the leader.
ACT_EVERY = 0.05
#: Seconds between two fenced writes of the leader.
WRITE_EVERY = 0.1


def main() -> None:
    setup_django()
    from django_leader import Elector, LeadershipLost
    from testproject.demoapp.models import FencedWrite

    identity = os.environ["DL_MP_IDENTITY"]
    backend = make_backend()
    database = db_alias()
    leases: dict[int, Lease] = {}
    writing = threading.Lock()  # held by a fenced write: a freeze waits for it
    freezer = Freezer(backend, quiet=writing)

    def fenced_write(lease: Lease, note: str | None = None) -> tuple[str, int | None, float]:
        """A fenced write with ``lease``: the outcome, the row's id, when it was made."""
        made = clock()
        try:
            with writing, lease.fenced(using=database):
                made = clock()
                row = FencedWrite.objects.using(database).create(
                    writer=identity, token=lease.token, note=note or f"{made:.6f}"
                )
        except LeadershipLost as exc:
            return f"rejected: {exc}", None, made
        except Exception as exc:  # a dead connection, a timeout: the leader goes on
            return f"error: {type(exc).__name__}: {exc}"[:300], None, made
        return "committed", row.pk, made

    def work(lease: Lease) -> None:
        leases[lease.token] = lease
        seen = lease.deadline
        next_write = 0.0
        while True:
            before = clock()
            try:
                lease.check()
            except LeadershipLost:
                break
            emit("act", t=before, t1=clock(), token=lease.token, wall=time.time())
            if clock() >= next_write:
                outcome, pk, made = fenced_write(lease)
                if outcome == "committed":
                    emit("write", t=made, token=lease.token, id=pk)
                elif outcome.startswith("rejected"):
                    emit("write_refused", t=made, token=lease.token, error=outcome)
                else:
                    emit("write_error", t=made, token=lease.token, error=outcome)
                next_write = clock() + WRITE_EVERY
            if lease.deadline != seen:
                seen = lease.deadline
                emit("deadline", t=clock(), token=lease.token, deadline=seen)
            if lease.lost.wait(ACT_EVERY):
                break
        emit("acting_end", t=clock(), token=lease.token)

    def on_lost(lease: Lease) -> None:
        emit(
            "lost", t=clock(), token=lease.token, reason=lease.lost_reason, deadline=lease.deadline
        )

    elector = Elector(
        os.environ["DL_MP_LEASE"],
        ttl=float(os.environ["DL_MP_TTL"]),
        renew_interval=float(os.environ["DL_MP_RENEW"]),
        retry_interval=float(os.environ["DL_MP_RETRY"]),
        identity=identity,
        backend=backend,
        on_elected=lambda lease: emit("elected", t=clock(), token=lease.token),
        on_lost=on_lost,
    )

    def report() -> dict[str, Any]:
        lease = elector.lease
        held = lease is not None and lease.held
        return {"t": clock(), "token": None if lease is None else lease.token, "held": held}

    freezer.report = report
    elector.start(work)
    emit("ready", t=clock(), identity=identity)

    for command in commands():
        cmd = command["cmd"]
        if cmd == "clock":
            emit("clock", wall=time.time(), boot=clock())
        elif cmd == "freeze":
            freezer.armed.set()
            emit("freeze_armed", t=clock())
        elif cmd == "probe":
            old = leases[command["token"]]
            # A copy that has not noticed anything: not lost, deadline far ahead. Its
            # fenced() passes the local check, so only the store can refuse it.
            unaware = dataclasses.replace(
                old, lost=threading.Event(), lost_reason="", deadline=clock() + 60
            )
            emit(
                "probe",
                t=clock(),
                token=old.token,
                held=old.held,
                lost=old.lost.is_set(),
                local_fence=fenced_write(old, "probe-local")[0],
                db_fence=fenced_write(unaware, "probe-db")[0],
            )
        else:
            emit("error", error=f"unknown command {command!r}")
    os._exit(0)


if __name__ == "__main__":
    main()
