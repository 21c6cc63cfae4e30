"""``manage.py runleader``: run a payload only while elected.

    runleader NAME --call dotted.path         f(lease) in this process
    runleader NAME -- CMD ARGS...             a child process, under a guard
    runleader NAME --beat [beat options]      ``celery beat`` as the child process
    runleader NAME --tasks                    the django.tasks schedule, in this process

The payload starts only after the lease is held and is stopped when leadership ends; the
lease is released only after the payload stopped. ``--watchdog S``: a callable must call
``lease.heartbeat()``, a child must touch the file named by ``DJANGO_LEADER_HEARTBEAT_FILE``,
at least every S seconds (not with ``--beat``). A child that does not is stopped, then the
lease released. A callable that does not cannot be stopped: the elector steps down
(``lease.lost``) but keeps the lease renewed while it runs, releases it if it returns, and
if it is still running ``--grace`` later runleader exits without releasing (the lease then
expires after its TTL): a stuck callable never acts beside the next leader's payload.
SIGTERM/SIGINT: stop the payload, release, exit 0; a second signal forces exit. Exit codes:
0 ok, 1 error (including a ``--call`` callable that ignored ``lease.lost`` past ``--grace``),
2 usage.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from django_leader.backends.db import require_tables
from django_leader.conf import resolve_timing, validate_identity, validate_name
from django_leader.elector import Elector
from django_leader.lease import Lease, LossReason
from django_leader.payload import ON_EXIT, PayloadRunner

logger = logging.getLogger("django_leader")


def option_names(message: str) -> str:
    """A timing error worded with this command's options (``--renew-interval``, not
    ``renew_interval``)."""
    return re.sub(
        r"\b(ttl|renew_interval|retry_interval)\b",
        lambda m: "--" + m.group(1).replace("_", "-"),
        message,
    )


def usage(message: str) -> CommandError:
    return CommandError(message, returncode=2)


class Command(BaseCommand):
    help = (
        "Campaign for lease NAME and run a payload only while elected: --call dotted.path, "
        "-- CMD ARGS..., --beat [celery beat options], or --tasks (django.tasks schedule)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the lease to campaign for")
        parser.add_argument("--call", metavar="DOTTED.PATH", help="run f(lease) while elected")
        parser.add_argument(
            "--beat",
            action="store_true",
            help="run `celery beat` while elected; options after --beat go to it",
        )
        parser.add_argument(
            "--tasks",
            action="store_true",
            help="enqueue DJANGO_LEADER['TASKS_SCHEDULE'] (django.tasks) while elected",
        )
        parser.add_argument("--ttl", type=float)
        parser.add_argument("--renew-interval", type=float)
        parser.add_argument("--retry-interval", type=float)
        parser.add_argument("--identity")
        parser.add_argument(
            "--grace",
            type=float,
            default=10.0,
            help="seconds a stopped payload gets before it is killed (10)",
        )
        parser.add_argument(
            "--on-exit",
            choices=ON_EXIT,
            default="release",
            help="when the child exits on its own: release the lease and "
            "campaign again after a back-off (default), restart it, "
            "or exit with its status",
        )
        parser.add_argument(
            "--watchdog",
            type=float,
            metavar="S",
            help="the payload must show it is alive every S seconds (--call: "
            "lease.heartbeat(); a child: touch $DJANGO_LEADER_HEARTBEAT_FILE), else it "
            "is stopped and the lease let go (a callable that cannot be stopped: exit "
            "after --grace, the lease left to expire); not with --beat",
        )
        parser.add_argument("command", nargs="*", help="after --: the child command")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after `--beat` belongs to celery beat, and everything after `--` is the
        # child command: split them off before argparse sees options it does not know.
        self._beat_options: list[str] = []
        self._child: list[str] = []
        if "--" in argv:
            cut = argv.index("--")
            argv, self._child = argv[:cut], argv[cut + 1 :]
        if "--beat" in argv:
            cut = argv.index("--beat")
            argv, self._beat_options = argv[: cut + 1], argv[cut + 1 :]
        super().run_from_argv(argv)

    # -- validation -----------------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        child = list(getattr(self, "_child", [])) or list(options.get("command") or [])
        beat_options = list(getattr(self, "_beat_options", []))
        payloads = [options["call"], options["beat"], options["tasks"], child]
        if sum(bool(payload) for payload in payloads) != 1:
            raise usage(
                "give exactly one payload: --call dotted.path, --beat [options], --tasks, "
                "or -- CMD ARGS"
            )
        try:
            name = validate_name(options["name"])
            timing = resolve_timing(
                options["ttl"], options["renew_interval"], options["retry_interval"]
            )
            identity = validate_identity(options["identity"]) if options["identity"] else None
        except (TypeError, ValueError) as exc:
            raise usage(option_names(str(exc))) from None
        if child and shutil.which(child[0]) is None:
            raise usage(f"command not found (or not executable): {child[0]}")
        if options["grace"] < 0:
            raise usage(f"--grace must be 0 or more, got {options['grace']}")
        watchdog = options.get("watchdog")
        if watchdog is not None:
            if not 0 < watchdog < float("inf"):
                raise usage(f"--watchdog must be a number of seconds > 0, got {watchdog}")
            if options["beat"]:
                raise usage(
                    "--watchdog cannot be used with --beat: celery beat does not touch "
                    "DJANGO_LEADER_HEARTBEAT_FILE"
                )
        call: Callable[[Lease], Any] | None = None
        if options["call"]:
            try:
                call = import_string(options["call"])
            except ImportError as exc:
                raise usage(f"cannot import --call {options['call']!r}: {exc}") from None
            if not callable(call):
                raise usage(f"--call {options['call']!r} is not callable")
        if options["beat"]:
            child = celery_beat_command(beat_options)
        if options["tasks"]:
            call = tasks_schedule()
        self._configure_logging(options["verbosity"])
        try:
            require_tables()  # else every campaign fails, logged for ever
        except ImproperlyConfigured as exc:
            raise usage(str(exc)) from None

        elector = Elector(
            name,
            ttl=timing.ttl,
            renew_interval=timing.renew_interval,
            retry_interval=timing.retry_interval,
            identity=identity,
            # A callable beats itself; a child's heartbeat file is watched by the runner,
            # which lets the lease go only once the child is gone.
            watchdog=watchdog if call is not None else None,
        )
        runner = PayloadRunner(
            elector,
            call=call,
            child=child,
            grace=float(options["grace"]),
            on_exit=options["on_exit"],
            watchdog=watchdog if call is None else None,
        )
        try:
            code = run(elector, runner)
        finally:
            runner.close()
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        package_logger = logging.getLogger("django_leader")
        if not package_logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
            )
            package_logger.addHandler(handler)
        package_logger.setLevel(logging.WARNING if verbosity == 0 else logging.INFO)


def tasks_schedule() -> Callable[[Lease], Any]:
    """The work of ``--tasks``: django_leader.tasks' enqueuer, its schedule checked now
    (every entry's task imported)."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        from django_leader.tasks import load_schedule, run_schedule

        entries = load_schedule()
        for entry in entries:
            entry.resolve()
    except ImproperlyConfigured as exc:
        raise usage(f"--tasks: {exc}") from None
    if not entries:
        raise usage("--tasks: DJANGO_LEADER['TASKS_SCHEDULE'] has no entry")
    return lambda lease: run_schedule(lease, schedule=entries)


def run(elector: Elector, runner: PayloadRunner) -> int:
    """Campaign with ``runner`` as the work until the elector stops; the exit status.
    The first SIGTERM/SIGINT stops the payload, then releases; a second forces exit."""
    signals_seen = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1  # only a counter: the main loop below acts on it

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        thread = elector.start(runner.work)
        stopping = False
        while thread.is_alive():
            thread.join(0.1)
            if signals_seen >= 2:
                logger.error("second signal: forcing exit without waiting for the payload")
                runner.kill()
                runner.close()
                os._exit(1)
            if signals_seen == 1 and not stopping:
                stopping = True
                logger.info(
                    "signal received: stopping the payload, then releasing %r", elector.name
                )
                runner.stop()
            # A callable deaf to lease.lost cannot be stopped: exit, and leave the lease
            # (kept renewed until now, so that nobody led beside it) to expire on its own.
            # The elector's thread is a daemon, blocked until the callable returns: it
            # releases nothing on the way out.
            overdue = runner.overdue()
            if overdue is not None and runner.lost_cause is LossReason.WATCHDOG:
                logger.error(
                    "--call %s stopped calling lease.heartbeat() and ignored lease.lost for "
                    "%.1fs (grace %.1fs): exiting without releasing the lease, which "
                    "expires on its own",
                    runner.call_name,
                    overdue,
                    runner.grace,
                )
                return 1
            if overdue is not None:
                logger.error(
                    "--call %s ignored lease.lost for %.1fs (grace %.1fs): exiting without "
                    "releasing the lease, which expires on its own",
                    runner.call_name,
                    overdue,
                    runner.grace,
                )
                return 1
        return runner.exit_code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def celery_beat_command(options: list[str]) -> list[str]:
    """The child command of ``--beat``: ``python -m celery [-A APP] beat [options]``,
    with the project's Celery app when ``options`` give none (a usage error if there is
    none, or if Celery is not installed)."""
    try:
        from django_leader.celery.app import beat_command, default_beat_app
    except ModuleNotFoundError as exc:
        if exc.name != "celery" and not (exc.name or "").startswith("celery."):
            raise
        raise usage(f'--beat needs Celery (pip install "django-leader[celery]"): {exc}') from None
    try:
        return beat_command(options, default_app=default_beat_app)
    except ImproperlyConfigured as exc:
        raise usage(f"--beat: {exc}") from None
