"""An :class:`~django_leader.Elector` candidate, reporting every transition it sees.

Environment (besides :mod:`.common`'s, which pick the store: a database, Redis or
ZooKeeper):
``DL_MP_IDENTITY``, ``DL_MP_LEASE`` (the lease name), ``DL_MP_TTL``, ``DL_MP_RENEW``,
``DL_MP_RETRY``; optional:

``DL_MP_MODE``, ``DL_MP_PRIORITY``, ``DL_MP_WATCHDOG``
    the Elector's ``mode`` (default: the settings'), ``priority`` and ``watchdog``; with a
    watchdog the work calls ``lease.heartbeat()`` every 10 ms, until ``hang``;
``DL_MP_DEFER=1``
    load, report ``ready``, and campaign only on the command ``start`` (so that processes
    started together join the queue in the order the parent says);
``DL_MP_TRACE``
    backend methods (comma-separated: ``acquire``, ``read``, ``candidates``, ``woken``, ...)
    whose every call is reported as ``call`` (``method``, ``who``, ``at``: its ``clock``)
    when it is made, and as ``returned`` when it returns; ``sleep`` reports ``sleeping``
    (``interval``, ``at``) each time the waiting candidate has decided how long it sleeps
    unless woken, just before it sleeps.

Events: ``ready``; ``started`` (campaigning); ``elected``, ``lost``, ``new_leader`` (from
the callbacks);
``deadline`` (the work thread saw the local deadline move: a renewal succeeded);
``state`` (``is_leader`` changed, sampled every 10 ms, or its first sample after the
process was stopped, with ``gap``); replies to commands.

Commands (stdin, JSON lines):

``start``
    with ``DL_MP_DEFER=1``: start campaigning; reply ``started``.
``status``
    reply ``status``: ``is_leader``, the held token, who the store says leads, and
    ``stuck_for`` (seconds a term's work has not returned since the term ended, or None).
``hang``
    the work deadlocks: it stops calling ``lease.heartbeat()`` (and watching ``lease.lost``)
    for good; reply ``hanging`` with ``beat_clock``, the ``clock`` of its last heartbeat.
``write``
    a ``FencedWrite`` row through ``lease.fenced()`` with the held lease; reply ``wrote``
    (``outcome``: ``committed``, ``rejected: ...`` or, on a store that cannot fence
    database writes, ``unsupported: NotSupportedError: ...``). The database is the one
    this child writes rows to: on a cache store, the token is checked against its fence row.
``freeze``
    as the next renewal returns, report ``freezing`` and SIGSTOP this whole process from
    the store thread (:class:`~tests.procs.common.Freezer`): no store call is in flight,
    so the process holds no lock while it is stopped and the pause only tests expiry.
``probe``
    with the (lost) lease of token ``token``: try a fenced write (``local_fence``), the
    same with a copy that does not know it lost (``db_fence``: only the database can
    refuse it, with the lease row or, on a cache store, the fence row), ``backend.renew``
    and ``backend.release``; reply ``probe``.
``flush``
    wait until the history this process noticed is written (a cache store writes it
    asynchronously); reply ``flushed`` (``ok``).
SIGTERM
    ``elector.stop()`` (which releases the lease), flush the history, report ``stopped``
    (``history_flushed``), exit 0.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from tests.procs.common import (
    Freezer,
    clock,
    commands,
    db_alias,
    elector_state,
    emit,
    lease_fields,
    make_backend,
    setup_django,
    wall,
)

if TYPE_CHECKING:
    from django_leader import Lease

#: How often the work thread looks at its lease, and the monitor at ``is_leader``.
WORK_POLL = 0.01
#: A pause between two ``is_leader`` samples longer than this is reported (``state``, ``gap``).
MONITOR_GAP = 0.5
#: Seconds to wait for the history to be written.
FLUSH_TIMEOUT = 10.0


def main() -> None:
    setup_django()
    from django_leader import Elector, LeadershipLost, NotSupportedError
    from django_leader.backends.base import Backend
    from testproject.demoapp.models import FencedWrite
    from tests.support.counting import Call, CountingBackend

    identity = os.environ["DL_MP_IDENTITY"]
    ttl = float(os.environ["DL_MP_TTL"])
    watchdog = float(os.environ["DL_MP_WATCHDOG"]) if os.environ.get("DL_MP_WATCHDOG") else None
    traced = {method for method in os.environ.get("DL_MP_TRACE", "").split(",") if method}
    backend: Backend = make_backend()
    if traced:

        def trace(call: Call) -> None:
            if call.method in traced:
                emit("call", method=call.method, who=call.who, at=call.at)

        def returned(call: Call) -> None:
            if call.method in traced:
                emit("returned", method=call.method, who=call.who, at=call.at)

        backend = CountingBackend(backend, listener=trace, returned=returned)
    database = db_alias()
    leases: dict[int, Lease] = {}
    freezer = Freezer(backend)
    hang = threading.Event()

    def deadlock(lease: Lease, beat: float) -> None:
        emit("hanging", token=lease.token, beat_clock=beat)
        stuck = threading.Lock()
        stuck.acquire()
        stuck.acquire()  # never returns: this thread waits for itself

    def work(lease: Lease) -> None:
        leases[lease.token] = lease
        emit("work_started", token=lease.token)
        seen = lease.deadline
        beat = clock()
        while not lease.lost.wait(WORK_POLL):
            if hang.is_set():
                deadlock(lease, beat)
            if watchdog is not None:
                beat = clock()  # before heartbeat(): never later than the watchdog's stamp
                lease.heartbeat()
            if lease.deadline == seen:
                continue
            seen = lease.deadline
            emit("deadline", **lease_fields(lease))
        emit("work_done", token=lease.token, reason=lease.lost_reason)

    def on_lost(lease: Lease) -> None:
        assert lease.deadline is not None
        emit(
            "lost", token=lease.token, reason=lease.lost_reason, deadline_wall=wall(lease.deadline)
        )

    class Candidate(Elector):
        def _poll_interval(self) -> float:
            interval = super()._poll_interval()
            if "sleep" in traced:
                emit("sleeping", interval=interval, at=clock())
            return interval

    elector = Candidate(
        os.environ["DL_MP_LEASE"],
        ttl=ttl,
        renew_interval=float(os.environ["DL_MP_RENEW"]),
        retry_interval=float(os.environ["DL_MP_RETRY"]),
        identity=identity,
        backend=backend,
        mode=os.environ.get("DL_MP_MODE") or None,
        priority=int(os.environ.get("DL_MP_PRIORITY", "0")),
        watchdog=watchdog,
        on_elected=lambda lease: emit("elected", **lease_fields(lease)),
        on_lost=on_lost,
        on_new_leader=lambda lease: emit("new_leader", holder=lease.holder, token=lease.token),
    )

    freezer.report = elector_state(elector)

    def monitor() -> None:
        leading, sampled = False, time.monotonic()
        while True:
            now, previous = elector.is_leader, sampled
            sampled = time.monotonic()
            # A long gap between samples means this process was stopped: report what
            # is_leader says the moment it runs again, changed or not.
            gap = sampled - previous if sampled - previous > MONITOR_GAP else None
            if now != leading or gap is not None:
                leading = now
                lease = elector.lease
                emit("state", leader=now, gap=gap, token=None if lease is None else lease.token)
            time.sleep(WORK_POLL)

    def on_sigterm(signum: int, frame: Any) -> None:
        emit("sigterm", is_leader=elector.is_leader)
        elector.stop()
        # os._exit skips atexit: write the history (the release) now.
        flushed = backend.flush_history(FLUSH_TIMEOUT)
        emit("stopped", is_leader=elector.is_leader, history_flushed=flushed)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    threading.Thread(target=monitor, name="monitor", daemon=True).start()

    def start() -> None:
        elector.start(work)
        emit("started", identity=identity, mode=str(elector.mode), priority=elector.priority)

    deferred = os.environ.get("DL_MP_DEFER") == "1"
    if not deferred:
        start()
    emit("ready", identity=identity)

    def fenced_write(lease: Lease, note: str) -> str:
        try:
            with lease.fenced(using=database):
                FencedWrite.objects.using(database).create(
                    writer=identity, token=lease.token, note=note
                )
        except LeadershipLost as exc:
            return f"rejected: {exc}"
        except NotSupportedError as exc:
            return f"unsupported: {type(exc).__name__}: {exc}"
        return "committed"

    for command in commands():
        cmd = command["cmd"]
        if cmd == "start" and deferred:
            deferred = False
            start()
        elif cmd == "hang":
            hang.set()
        elif cmd == "status":
            held = elector.lease
            store = elector.leader()
            emit(
                "status",
                is_leader=elector.is_leader,
                token=None if held is None else held.token,
                store_holder=None if store is None else store.holder,
                store_token=None if store is None else store.token,
                stuck_for=elector.stuck_for,
            )
        elif cmd == "write":
            held = elector.lease
            if held is None:
                emit("wrote", token=None, outcome="not leader")
            else:
                emit("wrote", token=held.token, outcome=fenced_write(held, command["note"]))
        elif cmd == "flush":
            emit("flushed", ok=backend.flush_history(FLUSH_TIMEOUT))
        elif cmd == "freeze":
            freezer.armed.set()
            emit("freeze_armed")
        elif cmd == "probe":
            old = leases[command["token"]]
            # A copy that has not noticed anything: not lost, deadline far ahead. Its
            # fenced() passes the local check, so only the database can refuse it.
            unaware = dataclasses.replace(
                old, lost=threading.Event(), lost_reason="", deadline=clock() + 60
            )
            emit(
                "probe",
                token=old.token,
                is_leader=elector.is_leader,
                held=old.held,
                lost=old.lost.is_set(),
                lost_reason=old.lost_reason,
                local_fence=fenced_write(old, "probe-local"),
                db_fence=fenced_write(unaware, "probe-db"),
                renewed=backend.renew(old, ttl) is not None,
                released=backend.release(old),
            )
        else:
            emit("error", error=f"unknown command {command!r}")
    os._exit(0)


if __name__ == "__main__":
    main()
