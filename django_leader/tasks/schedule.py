"""A periodic schedule of django.tasks tasks, enqueued only by the elected process.

``DJANGO_LEADER["TASKS_SCHEDULE"]`` names the entries::

    DJANGO_LEADER = {
        "TASKS_SCHEDULE": {
            "send-digests": {"task": "mail.tasks.send_digests", "every": 60},
            "refresh": {"task": "shop.tasks.refresh", "every": timedelta(minutes=5),
                        "args": ["prices"], "kwargs": {"full": False},
                        "slot_kwarg": "slot"},
        },
    }

Every process runs ``manage.py runleader NAME --tasks`` (or an Elector with
:func:`run_schedule` as its work); the elected one enqueues. An entry's slots are the
multiples of ``every`` on the store's clock (seconds since the epoch), so every process
agrees on them. A slot is enqueued like this:

1. it is recorded as the entry's last slot in the shared slot records (the records the
   Celery beat uses, :meth:`Backend.slots() <django_leader.backends.base.Backend.slots>`),
   fenced by the lease: a process that lost the lease cannot record it;
2. the task is enqueued (with the slot's time as keyword ``slot_kwarg``, if the entry
   names one: an idempotency key);
3. the record is marked sent.

A newly elected process reads the records first and continues after the last recorded
slot. So no slot is enqueued twice across a failover, and a slot that fell due while
nobody led is enqueued once, late (only the latest such slot: missed slots are not
replayed). A leader that died between 1 and 2 leaves its slot unsent: the successor logs it
and does not enqueue it (at most once).

An enqueue that fails (the task backend raised) is tried again every :data:`RETRY_AFTER`
seconds while the term lasts, until it succeeds or the entry's next slot falls due (that
one is enqueued instead: the failed one is then a missed slot). Before each try the slot is
recorded again, fenced: only a leader that still holds the lease retries, and a successor
never enqueues it. (An enqueue that raised *after* the task backend stored the task, a lost
reply, is enqueued again by the retry: pass ``slot_kwarg`` if a task must notice that.)

**Time.** The leader never uses its wall clock: it reads the store's clock when its term
begins, every :data:`~django_leader.backends.slots.RESYNC_AFTER` seconds, and before it
records a slot; in between it carries the store's time forward on its boot clock
(:class:`~django_leader.backends.slots.StoreClock`). A slot is recorded and enqueued only
once the store's clock, read just before, has reached it. A step of the leader's wall clock
changes nothing; a step of the store's clock moves the schedule with it (forward: the latest
slot stepped over is enqueued at once, the others are missed; back: nothing until the
store's clock passes the last recorded slot again).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone

from django.db import connections

from ..backends import get_backend
from ..backends.base import Backend
from ..backends.slots import Slot, SlotStore, StoreClock
from ..exceptions import BackendUnavailable, LeadershipLost
from ..lease import Lease, clock
from .entries import Entry, load_schedule

logger = logging.getLogger("django_leader.tasks")


#: Seconds a leader waits before it tries again to record or enqueue after the store or
#: the task backend failed (a slot recorded but not enqueued is tried again, not dropped).
RETRY_AFTER = 1.0


class Enqueuer:
    """Enqueues the slots of ``entries`` that fall due while ``lease`` is held: one term
    of the leader (see the module's docstring)."""

    def __init__(self, lease: Lease, entries: Sequence[Entry], slots: SlotStore) -> None:
        self.lease = lease
        self.entries = list(entries)
        self.tasks = {entry.name: entry.resolve() for entry in self.entries}
        self.slots = slots
        self.clock = StoreClock(slots)  # the store's time; never this process's wall clock
        self.last: dict[str, datetime] = {}  # entry key -> last slot recorded (store clock)
        self.started = datetime.min.replace(tzinfo=timezone.utc)  # the term's (start())
        # entry key -> a slot recorded but not enqueued, and the clock() of its next try
        self.failed: dict[str, tuple[Slot, float]] = {}

    def start(self) -> None:
        """Read the last recorded slots and the store's clock."""
        records = self.slots.load(self.lease)
        self.started = self.clock.sync()  # slots before this fell due while no leader ran
        for entry in self.entries:
            slot = records.get(entry.key)
            if slot is None:
                continue
            self.last[entry.key] = slot.at
            if not slot.sent and slot.token != self.lease.token:
                logger.warning(
                    "tasks schedule: %s (token %s) stopped between recording slot %s of %r "
                    "and enqueueing it; it is not enqueued again (a slot is never enqueued "
                    "twice)",
                    slot.holder,
                    slot.token,
                    slot.at.isoformat(),
                    entry.name,
                )

    def _new_slot(self, entry: Entry, now: datetime) -> bool:
        last = self.last.get(entry.key)
        return last is None or entry.due(now) > last

    def step(self) -> float:
        """Enqueue what is due now by the store's clock, and try again the failed enqueues
        whose time has come; the seconds until the next slot or try."""
        now = self.clock.now()
        if any(self._new_slot(entry, now) for entry in self.entries):
            now = self.clock.sync()  # due by the estimate: only if the store agrees
        wait = math.inf
        for entry in self.entries:
            due = entry.due(now)
            if self._new_slot(entry, now):
                for at in self.catch_up(entry, now):
                    self.enqueue(entry, at)
            elif entry.key in self.failed and clock() >= self.failed[entry.key][1]:
                slot = self.failed[entry.key][0]
                self.slots.claim(self.lease, slot)  # still ours: LeadershipLost otherwise
                self.send(entry, slot)
            wait = min(wait, (entry.after(due) - now).total_seconds())
            if entry.key in self.failed:
                wait = min(wait, self.failed[entry.key][1] - clock())
        return max(0.0, wait)

    def catch_up(self, entry: Entry, now: datetime) -> list[datetime]:
        """The new slots of ``entry`` to enqueue now, oldest first, by its ``catch_up``:
        the latest (``once``); the latest unless it fell due before this term began
        (``skip``); the latest ``max_catch_up`` since the last recorded one (``all``). An
        entry never enqueued before starts at its latest slot."""
        due, last = entry.due(now), self.last.get(entry.key)
        if entry.catch_up == "skip" and due < self.started:
            self.last[entry.key] = due  # not recorded: the next leader skips it too
            logger.info(
                "tasks schedule: slot %s of %r fell due while no leader ran: skipped "
                "(catch_up 'skip')",
                due.isoformat(),
                entry.name,
            )
            return []
        if entry.catch_up != "all" or last is None:
            return [due]
        slots = entry.missed(last, now, entry.max_catch_up + 1)
        if len(slots) > entry.max_catch_up:
            slots = slots[1:]
            logger.warning(
                "tasks schedule: more than %d slots of %r fell due while no leader ran: "
                "the latest %d are enqueued, the ones before %s are not (max_catch_up)",
                entry.max_catch_up,
                entry.name,
                entry.max_catch_up,
                slots[0].isoformat(),
            )
        return slots

    def enqueue(self, entry: Entry, at: datetime) -> None:
        """Record slot ``at`` of ``entry``, fenced, then enqueue it."""
        lease = self.lease
        slot = Slot(entry.key, at, lease.token, lease.holder, uuid.uuid4().hex)
        self.slots.claim(lease, slot)  # LeadershipLost: the term is over
        self.last[entry.key] = at
        missed = self.failed.pop(entry.key, None)
        if missed is not None:
            logger.error(
                "tasks schedule: slot %s of %r was recorded but never enqueued: slot %s fell "
                "due first (missed slots are not replayed)",
                missed[0].at.isoformat(),
                entry.name,
                at.isoformat(),
            )
        self.send(entry, slot)

    def send(self, entry: Entry, slot: Slot) -> None:
        """Enqueue the recorded ``slot``; on failure, try again in RETRY_AFTER seconds."""
        lease, at = self.lease, slot.at
        kwargs = dict(entry.kwargs)
        if entry.slot_kwarg:
            kwargs[entry.slot_kwarg] = at.isoformat()
        try:
            result = self.tasks[entry.name].enqueue(*entry.args, **kwargs)
        except Exception as exc:
            self.failed[entry.key] = (slot, clock() + RETRY_AFTER)
            logger.error(
                "tasks schedule: slot %s of %r recorded but could not be enqueued, trying "
                "again in %gs: %s",
                at.isoformat(),
                entry.name,
                RETRY_AFTER,
                exc,
            )
            return
        self.failed.pop(entry.key, None)
        logger.info(
            "tasks schedule: enqueued %r for slot %s (result %s, token %s)",
            entry.name,
            at.isoformat(),
            result.id,
            lease.token,
        )
        try:
            self.slots.confirm(lease, slot)
        except Exception as exc:
            logger.warning("tasks schedule: could not mark slot %s sent: %s", at.isoformat(), exc)


def run_schedule(
    lease: Lease,
    *,
    schedule: Sequence[Entry] | None = None,
    backend: Backend | None = None,
) -> None:
    """Enqueue the schedule's tasks while ``lease`` is held: the work of an Elector, and
    what ``manage.py runleader NAME --tasks`` runs. ``schedule``: default
    ``TASKS_SCHEDULE``; ``backend``: the lease's store (default: the configured one).
    Returns once the lease is lost."""
    entries = load_schedule() if schedule is None else list(schedule)
    store = get_backend() if backend is None else backend
    enqueuer = Enqueuer(lease, entries, store.slots())
    if not entries:
        logger.warning("tasks schedule: DJANGO_LEADER['TASKS_SCHEDULE'] is empty")
    try:
        _enqueue_while_held(lease, enqueuer)
    finally:
        # This thread's Django connections (the enqueued tasks' database, the records'):
        # a term's work thread ends here, and its connections would stay open until
        # garbage-collected.
        connections.close_all()


def _enqueue_while_held(lease: Lease, enqueuer: Enqueuer) -> None:
    started = False
    while not lease.lost.is_set():
        try:
            if not started:
                enqueuer.start()
                started = True
            wait = enqueuer.step()
        except LeadershipLost as exc:
            logger.info("tasks schedule: no longer leading: %s", exc)
            return
        except BackendUnavailable as exc:
            logger.warning("tasks schedule: the lease store failed, trying again: %s", exc)
            wait = RETRY_AFTER
        lease.heartbeat()  # for runleader --tasks --watchdog
        lease.lost.wait(min(wait, 1.0))
