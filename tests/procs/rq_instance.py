"""One instance of an app that repeats a job with RQ's cron scheduler (``python -m
tests.procs.rq_instance``): a ``CronScheduler`` on ``DL_MP_RQ_URL`` with a job ``tick``
every second on the queue ``DL_MP_LEASE``, handed to ``django_leader.rq.run_while_leader``
(unless ``DL_MP_RQ_UNGUARDED`` is set: the app as ``rq cron`` runs it without
django-leader, every instance enqueuing every time), then started.

Reports (JSON lines, ``tests/procs/common.py``): ``ready``; ``enqueued`` for each job RQ
enqueues, with its due time (``at``, a timestamp: the job's next enqueue time, or now for
its first run) and the RQ job id; ``elected`` / ``lost``; ``stopped`` once ``start()``
returned (SIGTERM: RQ's own handler stops it, and the lease is released), then exit 0.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from typing import Any

from tests.procs.common import elector_options, emit, setup_django

#: Seconds between two enqueues of the job.
INTERVAL = 1


def tick() -> None:
    """The job (no worker runs it here: the test counts what is enqueued)."""


def main() -> None:
    setup_django()
    from redis import Redis
    from rq.cron import CronJob, CronScheduler

    enqueue = CronJob.enqueue

    def noted(job: CronJob, connection: Any) -> Any:
        # (run_while_leader defers RQ's stop request until the enqueue returned: its report
        # is never cut off.)
        due = job.next_enqueue_time if job.latest_enqueue_time or job.cron else None
        enqueued = enqueue(job, connection)
        emit("enqueued", at=due.timestamp() if due else time.time(), job=enqueued.id)
        return enqueued

    CronJob.enqueue = noted  # type: ignore[method-assign,assignment]  # what the test sees
    lease = os.environ["DL_MP_LEASE"]
    cron = CronScheduler(connection=Redis.from_url(os.environ["DL_MP_RQ_URL"]))
    named: dict[str, Any] = (
        {"name": lease} if "name" in inspect.signature(cron.register).parameters else {}
    )
    from tests.procs import rq_instance  # not __main__'s: RQ refuses those

    cron.register(rq_instance.tick, lease, interval=INTERVAL, **named)
    if not os.environ.get("DL_MP_RQ_UNGUARDED"):
        from django_leader.rq import run_while_leader

        run_while_leader(cron, **elector_options())
    threading.Timer(0.5, emit, ("ready",)).start()  # start() blocks from here
    cron.start()
    emit("stopped")
    os._exit(0)


if __name__ == "__main__":
    main()
