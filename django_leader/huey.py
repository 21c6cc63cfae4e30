"""huey's periodic tasks enqueued by the elected consumer only: :func:`run_while_leader`.

Every huey consumer (``manage.py run_huey``, ``huey_consumer``) runs a scheduler that
enqueues the periodic tasks due each minute: with three consumers, each periodic task is
enqueued three times (huey leaves this to its users: coleifer/huey #716, #558, #609).
After :func:`run_while_leader(huey) <run_while_leader>`, the consumers of ``huey`` campaign
for one lease, in their schedulers, and only the one that leads enqueues periodic tasks.

A check of the periodic tasks (every ``interval`` seconds, huey's minute by default) is a
**slot**: its time, rounded down to the interval. Before a periodic task is enqueued for a
slot, the slot is recorded under the lease's fencing token (``django_leader.slot_gate``),
so across a failover no slot is enqueued twice, and a newly elected consumer checks at once
instead of waiting for its next minute. The enqueued task carries its slot as ``task.eta``.

What is not periodic is unchanged: tasks scheduled with ``schedule()`` / ``delay=`` are
taken from huey's storage by one consumer (huey's own rule), and every consumer's workers
run what is enqueued, whichever consumer enqueued it.
"""

from __future__ import annotations

import logging
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .elector import Elector
from .lease import Lease
from .slot_gate import SlotGate

try:
    from huey import Huey
    from huey.consumer import Consumer, Scheduler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('django_leader.huey needs huey: pip install "django-leader[huey]"') from exc

logger = logging.getLogger("django_leader.huey")

__all__ = ["run_while_leader"]

#: Seconds a stopping consumer waits for its scheduler to give the lease back.
STOP_WAIT = 10.0


@dataclass(frozen=True)
class _Leadership:
    """What the schedulers of a huey's consumers campaign with."""

    name: str
    interval: float
    elector_options: dict[str, Any] = field(default_factory=dict)


def run_while_leader(
    huey: Huey, name: str | None = None, *, interval: float = 60, **elector_options: Any
) -> None:
    """From now on, the consumers of ``huey`` enqueue its periodic tasks only while they
    hold the lease ``name`` (default ``huey:<huey.name>``).

    Call it where the ``huey`` instance is made, before the consumer starts (with
    ``huey.contrib.djhuey``: in an ``AppConfig.ready()``, on ``djhuey.HUEY``). Only the
    consumers campaign: a web process that imports ``huey`` to enqueue tasks does not.
    ``interval``: seconds between two checks of the periodic tasks (huey checks every
    60 s; a task whose ``validate_datetime`` is finer than a minute needs less).
    ``elector_options``: those of :class:`~django_leader.Elector` (``ttl``, ``backend``,
    ``identity``, ...).
    """
    if not isinstance(huey, Huey):
        raise TypeError(f"run_while_leader() takes a huey.Huey, not {type(huey).__name__}")
    if getattr(huey, "_django_leader", None) is not None:
        raise RuntimeError("this huey is run by run_while_leader() already")
    if not 0 < interval <= 3600:
        raise ValueError(f"interval must be in (0, 3600] seconds, not {interval!r}")
    name = f"huey:{huey.name}" if name is None else name
    Elector(name, **elector_options)  # bad options fail here, not in the consumer
    huey._django_leader = _Leadership(name, float(interval), elector_options)

    def create_consumer(**options: Any) -> Consumer:
        return _LeaderConsumer(huey, **options)

    huey.create_consumer = create_consumer


class _LeaderScheduler(Scheduler):
    """huey's scheduler, campaigning: periodic tasks enqueued while it leads, each slot
    once. Its election runs where the scheduler runs (a thread of the consumer, or a
    process of its own with ``-k process``)."""

    def initialize(self) -> None:
        super().initialize()
        leadership: _Leadership = self.huey._django_leader
        self.periodic_task_seconds = leadership.interval
        self._leadership = leadership
        self._elected = threading.Event()
        self._elector = Elector(leadership.name, **leadership.elector_options)
        self._gate = SlotGate(self._elector.backend.slots(), "periodic task", logger)
        self._elector.start(self._lead)

    def _lead(self, lease: Lease) -> None:
        self._gate.open(lease)
        self._elected.set()  # check at once: the next minute may be a minute away
        logger.info("%r leads: huey's periodic tasks are enqueued here", self._leadership.name)
        try:
            lease.lost.wait()
        finally:
            self._gate.close()
            logger.info("%r no longer leads: periodic tasks not enqueued", self._leadership.name)

    def loop(self, now: datetime | None = None) -> None:
        if self._elected.is_set():
            self._elected.clear()
            if self.periodic:
                self.enqueue_periodic_tasks(now)
        super().loop(now)

    def enqueue_periodic_tasks(self, now: datetime | None) -> None:
        if not self._gate.leads:
            logger.debug("periodic tasks not checked: this consumer does not lead")
            return
        timestamp = self.huey._get_timestamp() if now is None else now
        slot = _slot(timestamp, self.periodic_task_seconds, utc=self.huey.utc)
        for task in self.huey.read_periodic(timestamp):
            if self._gate.take(task.name, [slot]) is None:
                continue
            task.eta = _huey_time(slot, utc=self.huey.utc)
            logger.info("Enqueueing periodic task %s.", task)
            try:
                self.huey.enqueue(task)
            except Exception:  # huey's own rule: log, and go on with the others
                logger.exception("Error enqueueing periodic task %s.", task)

    def shutdown(self) -> None:
        try:
            self._elector.stop(timeout=self._elector.timing.ttl)
        finally:
            super().shutdown()


class _LeaderConsumer(Consumer):
    scheduler_class = _LeaderScheduler

    def stop(self, graceful: bool = False) -> None:
        super().stop(graceful)
        # The scheduler gives the lease back as it ends (its shutdown()); the consumer's
        # threads are daemons, gone when the process exits: wait for it, bounded.
        with suppress(Exception):
            self.scheduler.join(STOP_WAIT)


def _slot(timestamp: datetime, interval: float, *, utc: bool) -> datetime:
    """The slot of a check at huey's ``timestamp`` (naive: UTC if ``utc``, else local
    time): rounded down to ``interval``, aware, in UTC."""
    at = timestamp.replace(tzinfo=timezone.utc) if utc else timestamp.astimezone(timezone.utc)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    seconds = (at - epoch).total_seconds()
    return epoch + timedelta(seconds=seconds - seconds % interval)


def _huey_time(at: datetime, *, utc: bool) -> datetime:
    """An aware time as huey keeps times: naive, in UTC if ``utc``, else local time."""
    return at.replace(tzinfo=None) if utc else at.astimezone().replace(tzinfo=None)
