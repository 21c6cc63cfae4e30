"""The peers' tasks of the celery part of ``bench/report.py``: a no-op task made unique
by celery-singleton (its lock, of the task's name and arguments, is taken by ``apply_async`` in the
caller, in Redis, and released by the worker when the task has ended), beside ``singleton_noop`` of
``testproject/demoapp/tasks.py``."""

from __future__ import annotations

from celery import shared_task
from celery_singleton import Singleton


@shared_task(name="bench.peer_tasks.celery_singleton_noop", base=Singleton, lock_expiry=60)
def celery_singleton_noop(call: int) -> None:
    """Does nothing, one at a time (celery-singleton)."""
