"""RQ's cron jobs enqueued by the elected process only: :func:`run_while_leader`.

RQ repeats jobs with its cron scheduler (``rq cron``, django-rq's ``manage.py rqcron``;
RQ 2.7 or later): a ``CronScheduler`` enqueues each registered job when it is due, and
nothing coordinates two of them, so each process that runs one enqueues every job (RQ's
own scheduler for ``enqueue_at``/``enqueue_in`` takes a lock per queue; rq-scheduler one
lock per loop). After :func:`run_while_leader(cron) <run_while_leader>`, the processes
campaign for one lease, and only the one that leads enqueues.

Each due time is a **slot**, recorded under the lease's fencing token before the job is
enqueued (``django_leader.slot_gate``): a deposed leader cannot record one, so enqueues
nothing, and a newly elected process continues each job's schedule from the last slot any
leader recorded (an interval job one interval after it, a cron job at its next time; a
time missed while nobody led is enqueued once, at once).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .elector import Elector
from .lease import Lease
from .slot_gate import SlotGate

try:
    from rq.cron import CronJob, CronScheduler
    from rq.utils import now
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('django_leader.rq needs RQ: pip install "django-leader[rq]"') from exc
if not hasattr(CronJob, "set_enqueue_time"):  # pragma: no cover - depends on the environment
    raise ImportError('django_leader.rq needs RQ 2.7 or later: pip install "django-leader[rq]"')

logger = logging.getLogger("django_leader.rq")

__all__ = ["run_while_leader"]

#: Seconds a process that does not lead sleeps between two looks at its lease (a local
#: check: no store call).
FOLLOWER_POLL = 1.0


def run_while_leader(
    cron: CronScheduler, name: str | None = None, **elector_options: Any
) -> Elector:
    """Enqueue ``cron``'s jobs only while this process holds the lease ``name`` (default
    ``rq-cron``); the started :class:`~django_leader.Elector` that campaigns for it.

    ``cron``: an RQ ``CronScheduler`` (django-rq's ``DjangoCronScheduler`` too), with its
    jobs registered or not yet; call its ``start()`` next, as without django-leader. Its
    stop (SIGTERM, SIGINT) releases the lease. ``elector_options``: those of
    :class:`~django_leader.Elector` (``ttl``, ``backend``, ``identity``, ...).
    """
    if not isinstance(cron, CronScheduler):
        raise TypeError(f"run_while_leader() takes an RQ CronScheduler, not {type(cron).__name__}")
    if getattr(cron, "_django_leader_gate", None) is not None:
        raise RuntimeError("this CronScheduler is run by run_while_leader() already")
    elector = Elector("rq-cron" if name is None else name, **elector_options)
    gate = _CronGate(cron, SlotGate(elector.backend.slots(), "cron job", logger))
    sleep_interval, register_death = cron.calculate_sleep_interval, cron.register_death
    request_stop = getattr(cron, "_request_stop", None)  # RQ's SIGTERM/SIGINT handler

    def sleep_while_following() -> float:
        # Not RQ's own while following: a job overdue here (enqueued by the leader) would
        # make it 0, a loop that never sleeps. Nor just after this process was elected,
        # before its jobs follow the records: an interval job it never ran has no next
        # time, and RQ's answer is then 60 s (the schedule would stop for a minute).
        if not gate.slots.leads:
            return FOLLOWER_POLL
        return sleep_interval() if gate.aligned else 0.0

    def stop_then_register_death(*args: Any, **kwargs: Any) -> Any:
        try:
            elector.stop(timeout=elector.timing.ttl)  # releases the lease
        finally:
            died = register_death(*args, **kwargs)
        return died

    # RQ offers no hook: the instance's own methods are wrapped.
    for attr, method in (
        ("_django_leader_gate", gate),
        ("enqueue_jobs", gate.enqueue_jobs),
        ("calculate_sleep_interval", sleep_while_following),
        ("register_death", stop_then_register_death),
        *([("_request_stop", gate.deferring(request_stop))] if request_stop else []),
    ):
        setattr(cron, attr, method)
    elector.start(gate.lead)
    return elector


def slot_key(job: CronJob) -> str:
    """What a cron job's slots are recorded under: its name (RQ 2.11+) or function, queue,
    schedule and arguments (two registrations of one function differ by their arguments)."""
    arguments = hashlib.sha256(repr((job.args, sorted(job.kwargs.items()))).encode()).hexdigest()
    name = getattr(job, "name", "") or job.func_name
    return f"{name}@{job.queue_name}:{job.cron or job.interval}:{arguments[:12]}"


class _CronGate:
    """``CronScheduler.enqueue_jobs`` on the leader only, each due time once."""

    def __init__(self, cron: CronScheduler, slots: SlotGate) -> None:
        self.cron = cron
        self.slots = slots
        self._aligned: Lease | None = None  # the term whose records the jobs follow
        self._busy = False  # recording a slot and enqueuing its job
        self._stop: tuple[Callable[..., None], tuple[Any, ...]] | None = None  # deferred

    def deferring(self, request_stop: Callable[..., None]) -> Callable[..., None]:
        """RQ's signal handler, which raises ``StopRequested`` wherever the main thread is:
        while a slot is recorded and its job enqueued, the stop waits for them (an
        exception in the middle of a store call may leave its connection busy, and the job
        of a recorded slot unenqueued)."""

        def request_stop_between_jobs(*args: Any) -> None:
            if self._busy:
                self._stop = (request_stop, args)
                return
            request_stop(*args)

        return request_stop_between_jobs

    @property
    def aligned(self) -> bool:
        """Whether the jobs follow the records of the term this process leads in."""
        return self._aligned is not None and self._aligned is self.slots.lease

    def lead(self, lease: Lease) -> None:
        self.slots.open(lease)
        logger.info("%r leads: RQ cron jobs are enqueued here", lease.name)
        try:
            lease.lost.wait()
        finally:
            self.slots.close()
            logger.info("%r no longer leads: RQ cron jobs not enqueued", lease.name)

    def enqueue_jobs(self) -> list[CronJob]:
        """RQ's own loop, gated: each due job's slot recorded before it is enqueued."""
        lease = self.slots.lease
        if lease is None or not self.slots.leads:
            return []
        if self._aligned is not lease:
            self._align()
            self._aligned = lease
        enqueue_time = now()
        enqueued: list[CronJob] = []
        for job in self.cron.get_jobs():
            if not job.should_run():
                continue
            self._busy = True
            try:
                taken = self._enqueue(job, enqueue_time)
            finally:
                self._busy = False
            if self._stop is not None:
                request_stop, args = self._stop
                self._stop = None
                request_stop(*args)
            if taken is None:
                break
            if taken:
                enqueued.append(job)
        return enqueued

    def _enqueue(self, job: CronJob, enqueue_time: datetime) -> bool | None:
        """Record ``job``'s due time and enqueue it: True; False if that time was recorded
        before (or perhaps was); None once this process no longer leads."""
        if self.slots.take(slot_key(job), [_due(job) or enqueue_time]) is None:
            if not self.slots.leads:
                return None
            job.set_enqueue_time(enqueue_time)  # enqueued before, or perhaps: not again
            return False
        job.enqueue(self.cron.connection)
        job.set_enqueue_time(enqueue_time)
        return True

    def _align(self) -> None:
        """Each job continues from the last slot any leader recorded for it."""
        for job in self.cron.get_jobs():
            last = self.slots.last(slot_key(job))
            if last is not None and (
                job.latest_enqueue_time is None or last > job.latest_enqueue_time
            ):
                job.set_enqueue_time(last)


def _due(job: CronJob) -> datetime | None:
    """When ``job`` is due; None for an interval job that never ran (due now)."""
    if job.latest_enqueue_time is None and not job.cron:
        return None
    due: datetime | None = job.next_enqueue_time
    return due
