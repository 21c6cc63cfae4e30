"""Celery integration: a highly available beat and tasks that never overlap.

* :class:`LeaderScheduler` — ``celery beat -S django_leader.celery:LeaderScheduler`` on
  every host: one is elected and sends, a failover neither repeats nor drops a slot.
* :func:`singleton_task` — a ``shared_task`` with at most one execution per lock key at a
  time across all workers.

See ``docs/celery.md``. Needs Celery (``pip install "django-leader[celery]"``).
"""

from __future__ import annotations

from .beat import (
    HEADER_ENTRY,
    HEADER_HOLDER,
    HEADER_SLOT,
    HEADER_TOKEN,
    BeatElector,
    LeaderScheduler,
)
from .tasks import singleton_task
from .wrapped import wrapped_scheduler_class

__all__ = [
    "HEADER_ENTRY",
    "HEADER_HOLDER",
    "HEADER_SLOT",
    "HEADER_TOKEN",
    "BeatElector",
    "LeaderScheduler",
    "singleton_task",
    "wrapped_scheduler_class",
]
