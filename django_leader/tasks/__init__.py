"""Django's own tasks framework (``django.tasks``, Django 6; the ``django-tasks`` backport
before it): tasks that run once at a time, and a schedule enqueued by the elected process.

- :func:`singleton_task` — a drop-in for ``django.tasks.task`` (or ``django_tasks.task``)
  that runs at most one execution per lock key at a time, across every worker.
- :func:`run_schedule` — the leader-only periodic enqueuer of
  ``DJANGO_LEADER["TASKS_SCHEDULE"]``: ``manage.py runleader NAME --tasks`` runs it while
  elected. Each slot is recorded, fenced by the lease, before it is enqueued (the beat's
  slot records), so a failover never enqueues a slot twice.

See docs/django-tasks.md.
"""

from __future__ import annotations

from .schedule import Entry, load_schedule, run_schedule
from .singleton import singleton_task

__all__ = ["Entry", "load_schedule", "run_schedule", "singleton_task"]
