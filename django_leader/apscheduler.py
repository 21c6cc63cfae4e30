"""APScheduler 3 on the elected process only: :func:`run_while_leader`.

Every instance of the app starts its scheduler as before and hands it to
:func:`run_while_leader`, which starts the scheduler paused (or pauses it) and campaigns
for a lease. While this process leads, the scheduler runs; when leadership ends it is
paused again, and a job still running sees :func:`~django_leader.current_lease` lost.

Two guards make a scheduled time run at most once across a failover:

* **Submissions.** Every job the scheduler hands to an executor goes through the gate
  first: nothing runs unless this process holds the lease now (a deposed leader whose
  scheduler has not been paused yet submits nothing).
* **Slots.** Before a job runs for a scheduled time, the time is recorded as the job's
  last slot in the lease store, written under the lease's fencing token (the records of
  ``LeaderScheduler``, see ``django_leader.backends.slots``); a time not later than the
  recorded one is not run again. So the next leader, with a shared job store that the
  previous one had no time to update, or with a memory job store of its own holding the
  same schedule, skips what its predecessor ran and runs what it did not. A ZooKeeper
  store keeps these records too; a store that keeps none (a custom backend) records them in
  the process only.

A leader whose scheduler thread has died (APScheduler lets a job store's exception end it)
would hold the lease and run nothing: it gives the lease up and campaigns no more.

APScheduler's own rules apply to what is left: ``misfire_grace_time`` and ``coalesce``
decide what a new leader runs of the times missed while nobody led.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import datetime
from typing import Any

from django.db import connections

from .aio import running_loop
from .async_elector import AsyncElector
from .backends.slots import SlotStore
from .elector import Elector
from .lease import Lease, _use_lease
from .slot_gate import SlotGate

try:
    from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN
    from apscheduler.executors.pool import ProcessPoolExecutor
    from apscheduler.schedulers import SchedulerNotRunningError
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'django_leader.apscheduler needs APScheduler 3: pip install "django-leader[apscheduler]"'
    ) from exc

logger = logging.getLogger("django_leader.apscheduler")

#: How often the leader looks whether its scheduler's thread is still alive (seconds).
WATCH_INTERVAL = 1.0

__all__ = ["run_while_leader"]


def run_while_leader(
    scheduler: BaseScheduler, name: str | None = None, **elector_options: Any
) -> Elector | AsyncElector:
    """Run ``scheduler``'s jobs only while this process holds the lease ``name``; the
    started :class:`~django_leader.Elector` that campaigns for it (an
    :class:`~django_leader.AsyncElector` for an ``AsyncIOScheduler``: call this from a
    coroutine then).

    ``scheduler``: an APScheduler 3 scheduler, started or not, with any job stores
    (memory, SQLAlchemy, django-apscheduler's ``DjangoJobStore``). It is started paused
    if it was not running, and paused at once if it was. ``name`` defaults to
    ``apscheduler:<scheduler class>:<job store classes>``. ``elector_options``: those of
    :class:`~django_leader.Elector` (``ttl``, ``backend``, ``identity``, ...).

    ``scheduler.shutdown()`` stops the campaign and releases the lease; so does
    ``elector.stop()``, which leaves the scheduler paused.
    """
    if not isinstance(scheduler, BaseScheduler):
        raise TypeError(
            f"run_while_leader() takes an APScheduler 3 scheduler, not {type(scheduler).__name__}"
        )
    if getattr(scheduler, "_django_leader_gate", None) is not None:
        raise RuntimeError("this scheduler is run by run_while_leader() already")
    name = default_name(scheduler) if name is None else name
    is_async = isinstance(scheduler, AsyncIOScheduler)
    loop = running_loop()
    if is_async and loop is None:
        raise RuntimeError(
            "run_while_leader() of an AsyncIOScheduler must be called from a coroutine "
            "(on the loop the scheduler runs on)"
        )
    elector: Elector | AsyncElector = (
        AsyncElector(name, **elector_options) if is_async else Elector(name, **elector_options)
    )
    gate = _Gate(elector.backend.slots())
    scheduler._django_leader_gate = gate
    _guard_submissions(scheduler, gate)
    if scheduler.running:
        scheduler.pause()
    else:
        scheduler.start(paused=True)

    def lead(lease: Lease) -> None:
        gate.open(lease)
        try:
            _quietly(scheduler.resume)
            logger.info("%r leads: APScheduler resumed", name)
            while not lease.lost.wait(WATCH_INTERVAL):
                if not _scheduling(scheduler):
                    logger.error(
                        "%r: APScheduler's scheduler thread has died (its exception is "
                        "above): no job can run here any more; giving the lease up and "
                        "campaigning no more, so that another instance runs the schedule",
                        name,
                    )
                    elector.stop()  # from the work: asks, and the campaign ends on return
                    break
        finally:
            gate.close()
            _quietly(scheduler.pause)
            logger.info("%r no longer leads: APScheduler paused", name)

    def on_shutdown(event: object) -> None:
        gate.end()
        stopping = elector.stop(timeout=elector.timing.ttl)
        if inspect.isawaitable(stopping):  # an AsyncElector: its stop is awaited on the loop
            gate.stopping = asyncio.ensure_future(stopping)

    scheduler.add_listener(on_shutdown, EVENT_SCHEDULER_SHUTDOWN)
    if isinstance(elector, AsyncElector):
        assert loop is not None
        gate.starting = loop.create_task(elector.start(lead))
    else:
        elector.start(lead)
    return elector


def default_name(scheduler: BaseScheduler) -> str:
    """``apscheduler:<scheduler class>:<job store classes, sorted>``."""
    stores = sorted({type(store).__name__ for store in scheduler._jobstores.values()})
    return f"apscheduler:{type(scheduler).__name__}:{','.join(stores) or 'MemoryJobStore'}"


class _Gate(SlotGate):
    """The slot gate of one scheduler, and what runs it on an event loop needs."""

    def __init__(self, slots: SlotStore) -> None:
        super().__init__(slots, "job", logger)
        # An AsyncElector's start() and stop(), as tasks on the loop (kept referenced).
        self.starting: asyncio.Future[Any] | None = None
        self.stopping: asyncio.Future[Any] | None = None
        self._io: ThreadPoolExecutor | None = None

    def end(self) -> None:
        """Let nothing run any more; the gate's own thread, if any, closes its Django
        connections and ends."""
        self.close()
        with self._lock:
            io, self._io = self._io, None
        if io is not None:
            io.submit(connections.close_all)
            io.shutdown(wait=False)

    def take_here(self, job: Any, run_times: list[datetime]) -> tuple[Lease, list[datetime]] | None:
        """:meth:`take`, from the scheduler's thread. On an event loop's thread (an
        ``AsyncIOScheduler``) the store is written from a thread of the gate's own, waited
        for: Django's ORM refuses to run where an event loop runs."""
        if running_loop() is None:
            return self.take(str(job.id), run_times)
        with self._lock:
            if self._io is None:
                self._io = ThreadPoolExecutor(1, thread_name_prefix="leader-apscheduler")
            io = self._io
        return io.submit(self.take, str(job.id), run_times).result()


def _guard_submissions(scheduler: BaseScheduler, gate: _Gate) -> None:
    """Send every submission of ``scheduler`` through ``gate``: the scheduler looks its
    executors up by alias for each due job (``_lookup_executor``) and submits the job to
    it; the executor it gets back takes only what the gate lets through."""
    lookup = scheduler._lookup_executor

    @functools.wraps(lookup)
    def guarded_lookup(alias: str) -> Any:
        return _GuardedExecutor(lookup(alias), gate)

    scheduler._lookup_executor = guarded_lookup


class _GuardedExecutor:
    """An executor as the scheduler's job processing sees it: submissions gated."""

    def __init__(self, executor: Any, gate: _Gate) -> None:
        self._executor = executor
        self._gate = gate

    def submit_job(self, job: Any, run_times: list[datetime]) -> None:
        taken = self._gate.take_here(job, run_times)
        if taken is None:
            return
        lease, fresh = taken
        if isinstance(self._executor, ProcessPoolExecutor):  # pickled: the job as it is
            self._executor.submit_job(job, fresh)
        else:
            self._executor.submit_job(_LeasedJob(job, lease), fresh)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._executor, attr)


class _LeasedJob:
    """``job``, whose function runs with ``lease`` as ``current_lease()``, and not at all
    once the lease is lost (queued behind other jobs past the end of the term)."""

    def __init__(self, job: Any, lease: Lease) -> None:
        self._job = job
        self.func = _with_lease(job.func, lease, job.id)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._job, attr)

    def __str__(self) -> str:
        return str(self._job)

    def __repr__(self) -> str:
        return repr(self._job)


def _with_lease(func: Callable[..., Any], lease: Lease, job_id: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "func", None)  # a functools.partial of one
    ):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            if not _still_held(lease, job_id):
                return None
            with _use_lease(lease):
                return await func(*args, **kwargs)

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        if not _still_held(lease, job_id):
            return None
        with _use_lease(lease):
            return func(*args, **kwargs)

    return run


def _still_held(lease: Lease, job_id: str) -> bool:
    """Whether a job may start now: the lease it was submitted under is still held."""
    if lease.held:
        return True
    logger.warning("job %r not run: the lease was lost before it started", job_id)
    return False


def _scheduling(scheduler: BaseScheduler) -> bool:
    """Whether ``scheduler`` can still run jobs: its thread (a ``BackgroundScheduler``'s)
    is alive, or it has none of its own, or it was shut down on purpose. APScheduler lets
    an exception of a job store's ``update_job`` end that thread (django-apscheduler's
    ``DjangoJobStore`` raises "database is locked" on SQLite): the scheduler then says it
    runs, and runs nothing."""
    thread = getattr(scheduler, "_thread", None)
    return (
        not isinstance(thread, threading.Thread)
        or thread.is_alive()
        or scheduler.state == STATE_STOPPED
    )


def _quietly(call: Callable[[], None]) -> None:
    """``scheduler.pause()`` / ``resume()``, which a shut-down scheduler refuses."""
    with suppress(SchedulerNotRunningError):
        call()
