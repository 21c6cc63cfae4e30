"""Celery tasks of the test project, used by the Celery tests and ``bench/celery_*.py``.

Each task appends what it did as one JSON line to the file named by
``DJANGO_LEADER_CELERY_RECORD`` (one ``write()`` of a short line to a file opened with
``O_APPEND``: lines from concurrent pool processes never interleave). Without the variable
nothing is recorded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from celery import shared_task

from django_leader import current_lease
from django_leader.celery import singleton_task

#: Headers LeaderScheduler adds to each message it sends (see docs/celery.md).
BEAT_HEADERS = (
    "django_leader_entry",
    "django_leader_slot",
    "django_leader_token",
    "django_leader_holder",
)


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


@singleton_task(
    key="celery-test-retry-{tag}",
    ttl=10,
    on_locked="retry",
    default_retry_delay=0.2,
    max_retries=None,
)
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


# -- issue 10, defect 6: redelivery (acks_late), self-retry, hard time limit ---------------
def _hold_once(tag: str, marker: str) -> int:
    """The first execution (``marker`` file absent) creates it and holds its lock until its
    process is killed; a later execution (the redelivery) returns at once."""
    lease = current_lease()
    assert lease is not None
    first = not os.path.exists(marker)
    record("start", tag=tag, token=lease.token, name=lease.name, holder=lease.holder, first=first)
    if first:
        open(marker, "x").close()
        lease.lost.wait(120)
    record("end", tag=tag, token=lease.token, name=lease.name, lost=lease.lost.is_set())
    return lease.token


@singleton_task(
    key="celery-test-redeliver-{tag}", ttl=30, acks_late=True, reject_on_worker_lost=True
)
def singleton_redelivered(tag: str, marker: str) -> int:
    """acks_late + reject_on_worker_lost: redelivered at once when its process is killed;
    ``on_locked="skip"``."""
    return _hold_once(tag, marker)


@singleton_task(
    key="celery-test-redeliver-retry-{tag}",
    ttl=30,
    acks_late=True,
    reject_on_worker_lost=True,
    on_locked="retry",
    default_retry_delay=0.2,
)
def singleton_redelivered_retry(tag: str, marker: str) -> int:
    """As :func:`singleton_redelivered` with ``on_locked="retry"`` and Celery's default
    ``max_retries`` (3)."""
    return _hold_once(tag, marker)


@singleton_task(key="celery-test-self-retry-{tag}", ttl=10, bind=True)
def singleton_retries_itself(self: Any, tag: str, seconds: float) -> int:
    """The first attempt publishes its retry (``throw=False``) and goes on holding the lock
    for ``seconds``: the retry meets its own attempt's lock."""
    lease = current_lease()
    assert lease is not None
    retries = self.request.retries
    record("start", tag=tag, token=lease.token, name=lease.name, retries=retries)
    if retries == 0:
        self.retry(countdown=0, throw=False)
        time.sleep(seconds)
    record("end", tag=tag, token=lease.token, name=lease.name, retries=retries)
    return int(retries)


@singleton_task(key="celery-test-limit-{tag}", ttl=60, time_limit=2)
def singleton_time_limited(tag: str, seconds: float) -> int:
    """Holds its lock (ttl 60 s) past its hard time limit (2 s), deaf to SIGTERM (as a task
    stuck in a long C call is): the pool's SIGTERM does nothing, its SIGKILL 0.1 s later
    ends the process before it can release."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return _hold(tag, seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
