"""One instance of a Django app that runs huey (``python -m tests.procs.huey_instance``):
``huey.contrib.djhuey`` installed, ``settings.HUEY`` a ``RedisHuey`` named ``DL_MP_LEASE``
on ``DL_MP_HUEY_URL``, a periodic task ``tick`` due at every check, checked every second,
and ``manage.py run_huey`` (one worker thread), as huey's Django integration documents.
``django_leader.huey.run_while_leader(HUEY)`` is called first, unless ``DL_MP_HUEY_UNGUARDED``
is set (the app as it is without django-leader: every consumer enqueues every check).

Reports (JSON lines, ``tests/procs/common.py``): ``ready``; ``enqueued`` (by this
instance's scheduler) and ``ran`` (by this instance's worker) with the slot (``at``: the
task's ``eta``, set by django-leader; unguarded, the second the run started); ``elected`` /
``lost``; ``stopped`` once ``run_huey`` returned (SIGTERM), then exit 0.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from typing import Any

from tests.procs.common import elector_options, emit, setup_django

#: Seconds between two checks of the periodic tasks (huey's default is 60).
CHECK_EVERY = 1


def main() -> None:
    from django.conf import settings

    unguarded = bool(os.environ.get("DL_MP_HUEY_UNGUARDED"))
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "huey.contrib.djhuey"]
    settings.HUEY = {
        "huey_class": "huey.RedisHuey",
        "name": os.environ["DL_MP_LEASE"],
        "url": os.environ["DL_MP_HUEY_URL"],
        "immediate": False,
        "utc": True,
        "consumer": {"workers": 1, "worker_type": "thread", "scheduler_interval": 1},
    }
    setup_django()
    from django.core.management import call_command
    from huey.contrib.djhuey import HUEY, periodic_task
    from huey.signals import SIGNAL_ENQUEUED

    def slot(task: Any) -> str:
        if task.eta is not None:
            return task.eta.replace(tzinfo=timezone.utc).isoformat()
        now = datetime.now(timezone.utc)
        return now.replace(microsecond=0).isoformat()

    @periodic_task(lambda timestamp: True, context=True, name="tick")
    def tick(task: Any = None) -> None:
        emit("ran", at=slot(task), id=task.id)

    @HUEY.signal(SIGNAL_ENQUEUED)
    def enqueued(signal: str, task: Any) -> None:
        if task.name == "tick":
            emit("enqueued", at=slot(task), id=task.id)

    if unguarded:
        from huey.consumer import Scheduler

        Scheduler.periodic_task_seconds = CHECK_EVERY  # the same schedule, unguarded
    else:
        from django_leader.huey import run_while_leader

        run_while_leader(HUEY, interval=CHECK_EVERY, **elector_options())
    threading.Timer(0.5, emit, ("ready",)).start()  # run_huey blocks from here
    call_command("run_huey")  # SIGTERM: huey's consumer stops, the scheduler releases
    emit("stopped")
    os._exit(0)


if __name__ == "__main__":
    main()
