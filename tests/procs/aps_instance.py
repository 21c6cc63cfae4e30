"""One instance of an app that schedules with APScheduler 3 (``python -m
tests.procs.aps_instance``): a ``BackgroundScheduler`` with a job ``tick`` every second,
handed to ``django_leader.apscheduler.run_while_leader`` (unless ``DL_MP_APS_UNGUARDED``
is set: the app as it is without django-leader, which runs the job on every instance).

``DL_MP_APS_JOBSTORE``: ``memory`` (each instance its own copy of the schedule) or
``django`` (django-apscheduler's ``DjangoJobStore``, shared by the instances: the default
database is then the SQLite file ``DL_MP_APS_DB``, which ``DL_MP_APS_MIGRATE=1``
migrates). The interval starts at a whole second, so every instance has the same scheduled
times.

Reports (JSON lines, ``tests/procs/common.py``): ``ready``; ``ran`` for each run, with its
scheduled time (``at``) and the fencing token of ``current_lease()`` inside the job;
``elected`` / ``lost``; ``stopped``. SIGTERM: ``scheduler.shutdown()`` (which releases the
lease), then exit 0.
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import datetime, timezone
from typing import Any

from tests.procs.common import elector_options, emit, setup_django

JOB_PERIOD = 1.0


def tick() -> int | None:
    from django_leader import current_lease

    lease = current_lease()
    return None if lease is None else lease.token


def sqlite_options() -> dict[str, Any]:
    """The OPTIONS of a SQLite database that several threads and processes write: a busy
    timeout, and (Django 5.1+) ``BEGIN IMMEDIATE`` transactions."""
    import django

    options: dict[str, Any] = {"timeout": 20}
    if django.VERSION >= (5, 1):
        options["transaction_mode"] = "IMMEDIATE"
    return options


def main() -> None:
    jobstore = os.environ.get("DL_MP_APS_JOBSTORE", "memory")
    if jobstore == "django":
        # django-apscheduler in this app only, on a SQLite file of its own as the default
        # database (the instances share it): the test project does not install it.
        from django.conf import settings

        settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "django_apscheduler"]
        settings.DATABASES["default"]["NAME"] = os.environ["DL_MP_APS_DB"]
        # As docs/howto/apscheduler.md says for SQLite: DjangoJobStore's update_job and its
        # execution listener write from two threads, and a deferred transaction of one
        # fails at once ("database is locked") against the other, which ends APScheduler's
        # thread. Transactions that take the write lock first wait for it instead.
        settings.DATABASES["default"]["OPTIONS"] = sqlite_options()
    setup_django()
    if os.environ.get("DL_MP_APS_MIGRATE"):
        from django.core.management import call_command

        call_command("migrate", database="default", verbosity=0)
        emit("migrated")
        os._exit(0)
    from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
    from apscheduler.schedulers.background import BackgroundScheduler

    from django_leader.apscheduler import run_while_leader

    scheduler = BackgroundScheduler(timezone=timezone.utc)
    if jobstore == "django":
        from django_apscheduler.jobstores import DjangoJobStore

        scheduler.add_jobstore(DjangoJobStore(), "default")

    def ran(event: JobExecutionEvent) -> None:
        emit("ran", job=event.job_id, at=event.scheduled_run_time.isoformat(), token=event.retval)

    scheduler.add_listener(ran, EVENT_JOB_EXECUTED)
    scheduler.add_job(
        tick,
        "interval",
        seconds=JOB_PERIOD,
        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        id="tick",
        replace_existing=True,
        misfire_grace_time=30,
        coalesce=False,  # a stall of the scheduler still runs each time (within the grace)
    )
    if os.environ.get("DL_MP_APS_UNGUARDED"):
        scheduler.start()
    else:
        run_while_leader(scheduler, **elector_options())
    stopping = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    emit("ready")
    while not stopping.wait(0.2):  # a signal handler runs in the main thread, between waits
        pass
    # SIGTERM: leave as a deployment would.
    scheduler.shutdown()
    emit("stopped")
    os._exit(0)


if __name__ == "__main__":
    main()
