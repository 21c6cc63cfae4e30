"""``manage.py runleader``: run a payload only while elected.

    runleader NAME --call dotted.path         f(lease) in this process
    runleader NAME -- CMD ARGS...             a child process, under a guard
    runleader NAME --beat [beat options]      ``celery beat`` as the child process

The payload starts only after the lease is held and is stopped when leadership ends; the
lease is released only after the payload stopped. SIGTERM/SIGINT: stop the payload,
release, exit 0; a second signal forces exit. Exit codes: 0 ok, 1 error (including a
``--call`` callable that ignored ``lease.lost`` past ``--grace``), 2 usage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from django_leader import guard as guard_process
from django_leader.conf import resolve_timing, validate_identity, validate_name
from django_leader.elector import Elector
from django_leader.lease import Lease, clock

logger = logging.getLogger("django_leader")

ON_EXIT = ("release", "restart", "exit")
#: Longest back-off between restarts of a payload that keeps exiting (--on-exit=release).
MAX_BACKOFF = 60.0
#: A payload that ran this long is not crash-looping: its next back-off starts afresh.
STABLE_RUN = 30.0
#: Seconds runleader waits, once the guard is gone, for the SIGKILLed processes of the
#: payload's group to be gone; past it, it exits without releasing the lease.
KILL_WAIT = 5.0


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
        "-- CMD ARGS..., or --beat [celery beat options]."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_lock = threading.Lock()
        self.keep_lease = False  # set for good once a payload could not be confirmed gone

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the lease to campaign for")
        parser.add_argument("--call", metavar="DOTTED.PATH", help="run f(lease) while elected")
        parser.add_argument(
            "--beat",
            action="store_true",
            help="run `celery beat` while elected; options after --beat go to it",
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
        payloads = [bool(options["call"]), bool(options["beat"]), bool(child)]
        if sum(payloads) != 1:
            raise usage(
                "give exactly one payload: --call dotted.path, --beat [options], or -- CMD ARGS"
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
        call: Callable[[Lease], Any] | None = None
        if options["call"]:
            try:
                call = import_string(options["call"])
            except ImportError as exc:
                raise usage(f"cannot import --call {options['call']!r}: {exc}") from None
            if not callable(call):
                raise usage(f"--call {options['call']!r} is not callable")
        if options["beat"]:
            child = beat_command(beat_options, default_app=default_beat_app)
        self._configure_logging(options["verbosity"])

        self.grace = float(options["grace"])
        self.on_exit = options["on_exit"]
        self.exit_code = 0
        self.elector = Elector(
            name,
            ttl=timing.ttl,
            renew_interval=timing.renew_interval,
            retry_interval=timing.retry_interval,
            identity=identity,
        )
        self.runner = PayloadRunner(self, call, child)
        code = self._run()
        if code:
            sys.exit(code)

    def stop_elector(self, release: bool = True) -> None:
        """Stop campaigning; ``release=False`` is for good. ``Elector.stop`` keeps the last
        word on releasing, so a SIGTERM handled by the main loop just after the work thread
        found a payload it cannot confirm gone would turn that "do not release" back into
        a release (SPEC rule 8). Both threads stop through here, under a lock."""
        with self._stop_lock:
            if not release:
                self.keep_lease = True
            self.elector.stop(release=not self.keep_lease, timeout=0)

    def _configure_logging(self, verbosity: int) -> None:
        package_logger = logging.getLogger("django_leader")
        if not package_logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
            )
            package_logger.addHandler(handler)
        package_logger.setLevel(logging.WARNING if verbosity == 0 else logging.INFO)

    # -- running --------------------------------------------------------------------------
    def _run(self) -> int:
        signals_seen = 0

        def on_signal(signum: int, frame: FrameType | None) -> None:
            nonlocal signals_seen
            signals_seen += 1  # only a counter: the main loop below acts on it

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            thread = self.elector.start(self.runner.work)
            stopping = False
            while thread.is_alive():
                thread.join(0.1)
                if signals_seen >= 2:
                    logger.error("second signal: forcing exit without waiting for the payload")
                    self.runner.kill()
                    os._exit(1)
                if signals_seen == 1 and not stopping:
                    stopping = True
                    logger.info(
                        "signal received: stopping the payload, then releasing %r",
                        self.elector.name,
                    )
                    self.stop_elector()
                overdue = self.runner.overdue()
                if overdue is not None:
                    logger.error(
                        "--call %s ignored lease.lost for %.1fs (grace %.1fs): exiting without "
                        "releasing the lease, which expires on its own",
                        self.runner.call_name,
                        overdue,
                        self.grace,
                    )
                    return 1
            return self.exit_code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def settings_package() -> str | None:
    """The package of the settings module (``proj`` for ``proj.settings``), if any."""
    from django.conf import settings

    module = getattr(settings, "SETTINGS_MODULE", None) or ""
    return module.rpartition(".")[0] or None


def project_celery_app() -> str | None:
    """The Celery app of the project as ``-A`` takes it: ``<proj>.celery`` when the
    settings package has that module (Celery's documented Django layout), else None."""
    from importlib import import_module

    package = settings_package()
    if package is None:
        return None
    try:
        import_module(f"{package}.celery")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"{package}.celery", package):
            raise  # the module exists but imports something missing: say what
        return None
    return f"{package}.celery"


def default_beat_app() -> str | None:
    """The app for ``--beat`` given without ``-A``: None if Celery will read ``CELERY_APP``,
    else the project's ``celery`` module; a usage error if there is none."""
    if os.environ.get("CELERY_APP"):
        return None
    try:
        app = project_celery_app()
    except ImportError as exc:
        raise usage(f"--beat: cannot import the project's Celery app: {exc}") from None
    if app is None:
        raise usage(
            "--beat: give the Celery app, e.g. --beat -A proj (no "
            f"{settings_package() or '<project>'}.celery module was found)"
        )
    return app


def beat_command(
    options: list[str], default_app: Callable[[], str | None] | None = None
) -> list[str]:
    """``python -m celery [-A app] beat [options]`` from the options given after --beat;
    without ``-A``/``--app`` there, the app ``default_app()`` names, if any."""
    app: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(options):
        option = options[i]
        if option in ("-A", "--app") and i + 1 < len(options):
            app += [option, options[i + 1]]
            i += 2
            continue
        if option.startswith("--app=") or (option.startswith("-A") and len(option) > 2):
            app.append(option)
        else:
            rest.append(option)
        i += 1
    if not app and default_app is not None and (name := default_app()) is not None:
        app = ["-A", name]
    return [sys.executable, "-m", "celery", *app, "beat", *rest]


def guard_deadline(lease: Lease) -> str:
    """The lease's local deadline as the guard is told it: absolute, on the boot clock
    (``lease.clock``, which the guard reads too), exactly (``repr``). Not derived from
    ``lease.time_left()``, which is 0 once ``lost`` is set: while a stopping payload winds
    down, the lease is still renewed and the deadline still moves, and the guard must wait
    for ``--grace``, not kill at once. A lease without a deadline is already over."""
    return repr(0.0 if lease.deadline is None else lease.deadline)


def live_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are not zombies (a zombie runs no
    code). From ``/proc``; without it, ``[pgid]`` while the group can be signalled."""
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # After the command's ")": state, ppid, pgrp, ...
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def kill_group(pgid: int, give_up: float) -> bool:
    """SIGKILL process group ``pgid`` until none of its processes is left alive; False if
    some still are at ``give_up`` (on :func:`clock`). The group id is only signalled
    while the scan finds live members, so it is still in use, not a recycled pid."""
    while members := live_members(pgid):
        if clock() >= give_up:
            logger.error("payload process group %s still alive: pids %s", pgid, members)
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.01)  # SIGKILL is not instant; there is no event to wait for
    return True


def read_payload_pid(fd: int, give_up: float) -> int | None:
    """The pid the payload wrote to the guard's ``--pid-fd`` (None if it never got so
    far), read to end of file, which comes once the guard and the payload closed it."""
    data = b""
    try:
        while clock() < give_up:
            ready, _, _ = select.select([fd], [], [], max(0.0, give_up - clock()))
            if not ready:
                break
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    text = data.decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


class PayloadRunner:
    """The work given to the Elector: the callable, or the child under its guard."""

    def __init__(
        self, command: Command, call: Callable[[Lease], Any] | None, child: list[str]
    ) -> None:
        self.command = command
        self.call = call
        self.call_name = getattr(call, "__qualname__", repr(call))
        self.child = child
        self.guard: subprocess.Popen[bytes] | None = None
        self._lost_at: float | None = None
        self._running = threading.Event()
        self._backoff = 0.0

    # The work: runs in the Elector's work thread, once per election.
    def work(self, lease: Lease) -> None:
        self._lost_at = None
        self._running.set()
        try:
            if self.call is not None:
                threading.Thread(target=self._watch_lost, args=(lease,), daemon=True).start()
                self._call(lease)
            else:
                self._supervise(lease)
        finally:
            self._running.clear()

    def _call(self, lease: Lease) -> None:
        assert self.call is not None
        started = clock()
        try:
            self.call(lease)
        except Exception as exc:
            if lease.lost.is_set():
                # The way out the docs suggest once the lease is lost (lease.check(),
                # fenced()): an ordinary end of the term, not a crash.
                logger.info("--call %s ended with %r after the lease was lost", self.call_name, exc)
                return
            # As for a crashing child: release, and campaign again after a back-off that
            # grows while it keeps failing, rather than take a new term every retry.
            self._next_backoff(clock() - started)
            logger.exception(
                "--call %s raised; releasing the lease, campaigning again in %.1fs",
                self.call_name,
                self._backoff,
            )
            self.command.elector.resign(self._backoff)

    def _next_backoff(self, ran: float) -> None:
        """Back-off after a payload that ended on its own after ``ran`` seconds: none after
        a stable run, else from RETRY_INTERVAL doubling up to MAX_BACKOFF."""
        retry = self.command.elector.timing.retry_interval
        self._backoff = (
            0.0 if ran >= STABLE_RUN else min(MAX_BACKOFF, max(retry, self._backoff * 2))
        )

    def _watch_lost(self, lease: Lease) -> None:
        lease.lost.wait()
        self._lost_at = clock()

    def overdue(self) -> float | None:
        """Seconds past ``--grace`` that a callable ignores ``lease.lost``, else None."""
        if self.call is None or self._lost_at is None or not self._running.is_set():
            return None
        late = clock() - self._lost_at
        return late if late > self.command.grace else None

    def _supervise(self, lease: Lease) -> None:
        elector = self.command.elector
        while True:
            started = clock()
            status, lost = self._run_child(lease)
            if lost:
                return
            self._next_backoff(clock() - started)
            on_exit = self.command.on_exit
            if on_exit == "restart":
                logger.info(
                    "payload exited with %s; restarting it in %.1fs (--on-exit=restart)",
                    status,
                    self._backoff,
                )
                if lease.lost.wait(self._backoff):  # keeps the lease meanwhile
                    return
                continue
            if on_exit == "exit":
                logger.info(
                    "payload exited with %s; releasing and exiting (--on-exit=exit)", status
                )
                self.command.exit_code = status
                self.command.stop_elector()
                return
            logger.info(
                "payload exited with %s; releasing the lease, campaigning again in %.1fs",
                status,
                self._backoff,
            )
            elector.resign(self._backoff)
            return

    def _run_child(self, lease: Lease) -> tuple[int, bool]:
        """Start the child under a guard and wait for it; returns (status, lost)."""
        env = {
            **os.environ,
            "DJANGO_LEADER_NAME": lease.name,
            "DJANGO_LEADER_TOKEN": str(lease.token),
            "DJANGO_LEADER_HOLDER": lease.holder,
        }
        # The payload writes its pid (= its process group id) here before exec, so that
        # runleader can finish it off should the guard die under it.
        pid_read, pid_write = os.pipe()
        try:
            guard = self.guard = subprocess.Popen(
                # By path, not -m: the guard then imports nothing but the standard library.
                [
                    sys.executable,
                    guard_process.__file__,
                    "--deadline",
                    guard_deadline(lease),
                    "--grace",
                    str(self.command.grace),
                    "--pid-fd",
                    str(pid_write),
                    "--",
                    *self.child,
                ],
                stdin=subprocess.PIPE,
                env=env,
                pass_fds=(pid_write,),
            )
        except BaseException:
            os.close(pid_read)
            raise
        finally:
            os.close(pid_write)
        assert guard.stdin is not None
        logger.info(
            "payload started: %s (guard pid %s, token %s)",
            " ".join(self.child),
            guard.pid,
            lease.token,
        )
        told = lease.deadline
        asked_to_stop = False
        while guard.poll() is None:
            try:
                if lease.lost.is_set() and not asked_to_stop:
                    asked_to_stop = True
                    guard.stdin.write(b"T\n")
                    guard.stdin.flush()
                # While the lease is renewed (also while a stopping payload winds down),
                # the guard's deadline moves with it; after a loss it no longer does.
                if lease.deadline != told:
                    told = lease.deadline
                    guard.stdin.write(f"D {guard_deadline(lease)}\n".encode())
                    guard.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # the guard is exiting; poll() tells
            lease.lost.wait(0.05)
        status = guard.returncode
        guard.stdin.close()
        if status < 0:  # the guard never dies of a signal on its own: it was killed
            logger.error(
                "guard pid %s was killed by signal %s: killing its payload", guard.pid, -status
            )
            status = 128 - status
        # However the guard ended, nothing of the payload may outlive it (SPEC rule 8): the
        # lease is released or handed on only once the payload's group is confirmed gone.
        give_up = clock() + KILL_WAIT
        payload = read_payload_pid(pid_read, give_up)
        if payload is not None and not kill_group(payload, give_up):
            logger.error(
                "cannot confirm that the payload is gone: exiting without releasing %r, "
                "which expires on its own",
                lease.name,
            )
            self.command.exit_code = 1
            self.command.stop_elector(release=False)
            return status, True
        logger.info("payload stopped: guard pid %s exited with %s", guard.pid, status)
        # `held`, not `lost`: the guard may have killed the payload at the deadline before
        # the renewer thread noticed that it passed.
        return status, not lease.held

    def kill(self) -> None:
        """Forced exit: close the guard's pipe; it stops the payload (SIGTERM, then SIGKILL
        after the grace period or at the lease deadline, whichever is first)."""
        guard = self.guard
        if guard is not None and guard.stdin is not None:
            with contextlib.suppress(OSError):
                guard.stdin.close()
