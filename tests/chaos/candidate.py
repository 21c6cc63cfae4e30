"""An Elector candidate of a chaos run: ``python -m tests.chaos.candidate``.

It campaigns for ``CHAOS_LEASE`` with the timing in ``CHAOS_TTL``, ``CHAOS_RENEW`` and
``CHAOS_RETRY``, through the public API only (``Elector``, ``Lease.check()``,
``Lease.fenced()``), and appends its leadership actions to the JSON-lines file
``CHAOS_LOG``, every time stamped with ``CLOCK_BOOTTIME`` (see :mod:`tests.chaos.checker`):
``elected``, ``act`` every :data:`ACT_EVERY` seconds while ``lease.check()`` passes,
``stepped_down``, and on a database store (``CHAOS_FENCED=1``) a fenced write of a
``FencedWrite`` row every :data:`WRITE_EVERY` seconds (``write``, or ``write_refused`` /
``write_error``).

With ``CHAOS_ASYNC=1`` the candidate is an asyncio program instead: an
:class:`~django_leader.AsyncElector` whose coroutine work acts the same way (fenced writes
through ``lease.afenced()``) and, every :data:`BLOCK_EVERY` seconds or so, blocks its
event loop with a synchronous sleep of :data:`BLOCK_FOR` times the TTL (``loop_blocked``): the
session thread must go on renewing meanwhile, and a lease lost meanwhile must be found
lost by the next check.

SIGUSR1 arms a freeze: the next fenced write within a second SIGSTOPs this process inside
``lease.fenced()``, after its insert, holding the lease row locked (``freezing``).
With ``CHAOS_WATCHDOG`` (seconds) the Elector has ``watchdog=`` set, and the work calls
``lease.heartbeat()`` after each act. SIGUSR2 arms a stall (for a second, like a freeze):
at its next act the work logs ``stalling`` and stops, without heart-beating nor checking,
for ``CHAOS_STALL`` seconds (longer than the watchdog), then acts once, unchecked, with
its token (``act`` with ``stalled``): the elector steps down when the watchdog fires but
keeps the lease renewed until the work returns, so that act must come before any greater
token acts (the checker's ``overlap`` check); then the work finds the lease lost and
returns. (The asyncio candidate's stall is an ``await``, which the AsyncElector cancels
when the watchdog steps it down: it never acts again.)

SIGTERM stops the elector (which releases the lease) and exits 0.

``python -m tests.chaos.candidate --migrate`` creates the tables of the store instead.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_leader import Lease

#: Seconds between two acts of the leader.
ACT_EVERY = 0.05
#: Seconds between two fenced writes of the leader.
WRITE_EVERY = 0.1
#: Seconds a freeze stays armed.
FREEZE_ARMED = 1.0
#: Seconds between two blocks of an async candidate's event loop (on average; never in
#: the first of these seconds of a term, so that a new leader acts at once).
BLOCK_EVERY = 4.0
#: How long a block lasts, in TTLs: as long as a renewal interval of the chaos runs
#: (TTL / 4), short enough not to stretch a recovery past the liveness bound (0.6 TTL
#: did: a leader blocked right after a MariaDB restart acted 0.12 s past it).
BLOCK_FOR = 0.25


def clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Log:
    """One JSON object per line, written whole (line buffered, one lock)."""

    def __init__(self, path: str, who: str) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.who = who
        self.lock = threading.Lock()

    def __call__(self, ev: str, t: float | None = None, **fields: Any) -> None:
        record = {"ev": ev, "t": clock() if t is None else t, "who": self.who,
                  "pid": os.getpid(), **fields}  # fmt: skip
        line = json.dumps(record, default=str) + "\n"
        with self.lock:
            self.out.write(line)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    if sys.argv[1:] == ["--migrate"]:
        from django.core.management import call_command

        call_command("migrate", "django_leader", verbosity=0)
        call_command("migrate", "demoapp", verbosity=0)
        return

    from django_leader import Elector, LeadershipLost, NotSupportedError
    from testproject.demoapp.models import FencedWrite

    who = os.environ["CHAOS_IDENTITY"]
    log = Log(os.environ["CHAOS_LOG"], who)
    fenced = os.environ.get("CHAOS_FENCED") == "1"
    freeze_until = [0.0]
    watchdog = float(os.environ.get("CHAOS_WATCHDOG") or 0) or None
    stall_for = float(os.environ.get("CHAOS_STALL") or 0)
    stall = [0.0]  # armed until then
    stop = threading.Event()

    def insert(lease: Lease) -> tuple[float, int]:
        """The fenced write's body (inside ``lease.fenced()``): when, and the row's id."""
        made = clock()
        row = FencedWrite.objects.create(writer=who, token=lease.token, note=f"{made:.6f}")
        if clock() < freeze_until[0]:
            freeze_until[0] = 0.0
            log("freezing", token=lease.token)
            # Directed at this thread, SIGSTOP stops the whole process before the
            # call returns, inside the transaction, with the lease row locked.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            log("resumed", token=lease.token)
        return made, row.pk

    def fenced_write(lease: Lease) -> None:
        try:
            with lease.fenced():
                made, pk = insert(lease)
            log("write", t=made, token=lease.token, id=pk)
        except LeadershipLost as exc:
            log("write_refused", token=lease.token, error=str(exc))
        except Exception as exc:  # a dead connection, a timeout: logged, the leader goes on
            log("write_error", token=lease.token, error=f"{type(exc).__name__}: {exc}"[:300])

    def arm_freeze(signum: int, frame: Any) -> None:
        freeze_until[0] = clock() + FREEZE_ARMED

    def arm_stall(signum: int, frame: Any) -> None:
        stall[0] = clock() + FREEZE_ARMED

    signal.signal(signal.SIGUSR1, arm_freeze)
    signal.signal(signal.SIGUSR2, arm_stall)

    if os.environ.get("CHAOS_ASYNC") == "1":
        run_async(who, log, fenced, insert, watchdog, stall_for, stall)
        return

    def work(lease: Lease) -> None:
        nonlocal fenced
        next_write = 0.0
        while True:
            before = clock()
            try:
                lease.check()
            except LeadershipLost:
                break
            log("act", t=before, t1=clock(), token=lease.token)
            if clock() < stall[0]:
                stall[0] = 0.0
                log("stalling", token=lease.token, seconds=stall_for)
                time.sleep(stall_for)  # no heartbeat: the watchdog fires meanwhile
                now = clock()
                log("act", t=now, t1=now, token=lease.token, stalled=True)  # unchecked
            lease.heartbeat()
            if fenced and clock() >= next_write:
                try:
                    fenced_write(lease)
                except NotSupportedError:
                    fenced = False
                next_write = clock() + WRITE_EVERY
            if lease.lost.wait(ACT_EVERY):
                break
        log("acting_end", token=lease.token)

    elector = Elector(
        os.environ["CHAOS_LEASE"],
        ttl=float(os.environ["CHAOS_TTL"]),
        renew_interval=float(os.environ["CHAOS_RENEW"]),
        retry_interval=float(os.environ["CHAOS_RETRY"]),
        identity=who,
        watchdog=watchdog,
        on_elected=lambda lease: log("elected", token=lease.token),
        on_lost=lambda lease: log(
            "stepped_down", token=lease.token, reason=getattr(lease, "lost_reason", "")
        ),
    )

    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    log("started")
    elector.start(work)
    while not stop.wait(0.5):
        pass
    elector.stop()
    log("stopped")
    os._exit(0)


def run_async(
    who: str,
    log: Log,
    fenced: bool,
    insert: Callable[[Lease], tuple[float, int]],
    watchdog: float | None,
    stall_for: float,
    stall: list[float],
) -> None:
    """The candidate as an asyncio program (``CHAOS_ASYNC=1``): an AsyncElector."""
    import asyncio
    import random

    from django_leader import AsyncElector, LeadershipLost, NotSupportedError

    ttl = float(os.environ["CHAOS_TTL"])
    stop = asyncio.Event()

    async def write(lease: Lease) -> None:
        try:
            made, pk = await lease.afenced(insert, lease)
            log("write", t=made, token=lease.token, id=pk)
        except LeadershipLost as exc:
            log("write_refused", token=lease.token, error=str(exc))

    async def work(lease: Lease) -> None:
        nonlocal fenced
        next_write = 0.0
        next_block = clock() + BLOCK_EVERY + random.expovariate(1 / BLOCK_EVERY)
        try:
            while True:
                before = clock()
                try:
                    lease.check()
                except LeadershipLost:
                    break
                log("act", t=before, t1=clock(), token=lease.token)
                if clock() < stall[0]:
                    stall[0] = 0.0
                    log("stalling", token=lease.token, seconds=stall_for)
                    await asyncio.sleep(stall_for)  # the loop runs on, the work beats not
                    now = clock()
                    log("act", t=now, t1=now, token=lease.token, stalled=True)  # unchecked
                lease.heartbeat()
                if fenced and clock() >= next_write:
                    try:
                        await write(lease)
                    except NotSupportedError:
                        fenced = False
                    except Exception as exc:  # a dead connection, a timeout: the leader goes on
                        log("write_error", token=lease.token,
                            error=f"{type(exc).__name__}: {exc}"[:300])  # fmt: skip
                    next_write = clock() + WRITE_EVERY
                if clock() >= next_block:
                    log("loop_blocked", token=lease.token, seconds=BLOCK_FOR * ttl)
                    time.sleep(BLOCK_FOR * ttl)  # the loop stops; the session renews
                    next_block = clock() + random.expovariate(1 / BLOCK_EVERY)
                if await lease.wait_lost(ACT_EVERY):
                    break
        finally:  # also when cancelled: leadership ended
            log("acting_end", token=lease.token)

    async def main() -> None:
        elector = AsyncElector(
            os.environ["CHAOS_LEASE"],
            ttl=ttl,
            renew_interval=float(os.environ["CHAOS_RENEW"]),
            retry_interval=float(os.environ["CHAOS_RETRY"]),
            identity=who,
            watchdog=watchdog,
            on_elected=lambda lease: log("elected", token=lease.token),
            on_lost=lambda lease: log(
                "stepped_down", token=lease.token, reason=getattr(lease, "lost_reason", "")
            ),
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        log("started", mode="async")
        await elector.start(work)
        await stop.wait()
        await elector.stop()
        log("stopped")

    asyncio.run(main())
    os._exit(0)


if __name__ == "__main__":
    main()
