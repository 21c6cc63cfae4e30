"""Celery tasks of the test project, used by ``tests/test_celery*.py`` and ``bench/celery_*.py``.

Each task appends what it did as one JSON line to the file named by
``DJANGO_LEADER_CELERY_RECORD`` (one ``write()`` of a short line to a file opened with
``O_APPEND``: lines from concurrent pool processes never interleave). Without the variable
nothing is recorded.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import shared_task

from django_leader import current_lease
from django_leader.celery import singleton_task

#: Headers LeaderScheduler adds to each message it sends (see docs/celery.md).
BEAT_HEADERS = ("django_leader_entry", "django_leader_slot", "django_leader_token",
                "django_leader_holder")


def record(ev: str, **fields: Any) -> None:
    """Append one event to the record file, stamped with ``time.time()`` and the pid."""
    path = os.environ.get("DJANGO_LEADER_CELERY_RECORD")
    if not path:
        return
    line = json.dumps({"ev": ev, "t": time.time(), "pid": os.getpid(), **fields}, default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@shared_task(bind=True)
def record_slot(self: Any) -> None:
    """The periodic task of the beat tests: records which slot of which entry it runs, and
    which beat (holder, fencing token) sent it."""
    request = self.request
    headers = {name: getattr(request, name, None) for name in BEAT_HEADERS}
    record(
        "slot",
        task_id=request.id,
        origin=request.origin,  # "gen<pid>@<host>": the process that sent it
        periodic_task_name=getattr(request, "periodic_task_name", None),
        **headers,
    )


def _interval(tag: str, seconds: float) -> int:
    lease = current_lease()
    assert lease is not None, "no current_lease() inside a singleton_task"
    record("start", tag=tag, token=lease.token, name=lease.name, holder=lease.holder)
    time.sleep(seconds)
    record("end", tag=tag, token=lease.token, name=lease.name, lost=lease.lost.is_set())
    return lease.token


@singleton_task(key="celery-test-{tag}", ttl=10)
def singleton_interval(tag: str, seconds: float) -> int:
    """Holds lock ``celery-test-<tag>`` for ``seconds``; records start and end; skips if
    the lock is held."""
    return _interval(tag, seconds)


@singleton_task(key="celery-test-retry-{tag}", ttl=10, on_locked="retry",
                default_retry_delay=0.2, max_retries=None)
def singleton_retry_interval(tag: str, seconds: float) -> int:
    """Like :func:`singleton_interval`, but retried (every 0.2 s) while the lock is held."""
    return _interval(tag, seconds)


def _hold(tag: str, seconds: float) -> int:
    lease = current_lease()
    assert lease is not None
    record("start", tag=tag, token=lease.token, name=lease.name, holder=lease.holder)
    lease.lost.wait(seconds)
    record("end", tag=tag, token=lease.token, name=lease.name, lost=lease.lost.is_set())
    return lease.token


@singleton_task(key="celery-test-hold-{tag}", ttl=3)
def singleton_hold(tag: str, seconds: float) -> int:
    """Holds lock ``celery-test-hold-<tag>`` (ttl 3 s) for ``seconds``: killed mid-task in
    the tests."""
    return _hold(tag, seconds)


@singleton_task(key="celery-test-long-{tag}", ttl=60)
def singleton_hold_long(tag: str, seconds: float) -> int:
    """Like :func:`singleton_hold` with a 60 s ttl: revoked mid-task in the tests."""
    return _hold(tag, seconds)


@shared_task
def plain_noop() -> None:
    """Does nothing (the baseline of bench/celery_overhead.py)."""


@singleton_task(key="bench-singleton-noop")
def singleton_noop() -> None:
    """Does nothing under a lock (bench/celery_overhead.py)."""
