"""django.tasks tasks of the test project (tests/*/test_django_tasks.py; its Celery tasks
are in tasks.py): each appends a JSON line to the file ``DJANGO_LEADER_TASKS_LOG`` names
(start and end of an execution, with its pid and time), or does nothing without it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from django_leader import current_lease
from django_leader.tasks import singleton_task


def record(event: str, **fields: Any) -> None:
    path = os.environ.get("DJANGO_LEADER_TASKS_LOG")
    if not path:
        return
    line = json.dumps(
        {"ev": event, "pid": os.getpid(), "t": time.clock_gettime(time.CLOCK_BOOTTIME), **fields}
    )
    with open(path, "a") as out:  # one write of one line: whole, with O_APPEND
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


@singleton_task(key="report-{customer}", ttl=5)
def report(customer: int, seconds: float = 0.3) -> str:
    """Takes ``seconds``, at most one execution per customer at a time."""
    lease = current_lease()
    record("start", key=f"report-{customer}", token=lease.token if lease else None)
    time.sleep(seconds)
    record("end", key=f"report-{customer}")
    return f"report {customer}"


@singleton_task(key="areport-{customer}", ttl=5)
async def areport(customer: int, seconds: float = 0.3) -> str:
    """:func:`report` as a coroutine function (locked with alock)."""
    record("start", key=f"areport-{customer}")
    await asyncio.sleep(seconds)
    record("end", key=f"areport-{customer}")
    return f"areport {customer}"


@singleton_task(key="retried-{0}", on_locked="retry", retry_delay=0.2)
def retried(customer: int, seconds: float = 0.3) -> None:
    record("start", key=f"retried-{customer}")
    time.sleep(seconds)
    record("end", key=f"retried-{customer}")


@singleton_task(on_locked="raise")
def exclusive() -> None:
    time.sleep(0.3)


@singleton_task
def tick(slot: str = "") -> str:
    """The scheduled task: records the slot it was enqueued for."""
    record("tick", slot=slot)
    return slot
