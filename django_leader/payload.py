"""Running ``manage.py runleader``'s payload for an :class:`~django_leader.Elector`.

:class:`PayloadRunner` is the work given to ``Elector.start``: each term it runs either a
callable in this process or a child process under the guard (:mod:`django_leader.guard`),
and stops it when the term ends. The lease is let go only once the payload stopped: a
payload never outlives its lease (see docs/safety.md). What the runner needs is given to
it: the elector (to resign, stop, and for its retry interval), the payload, ``--grace``,
``--on-exit`` and ``--watchdog``; the command keeps argument parsing and signal handling.

The watchdog of a child (``--watchdog S``) is the runner's, not the Elector's: the child
touches the file named by ``DJANGO_LEADER_HEARTBEAT_FILE``; once it has not for S seconds,
the runner stops the child as at the end of a term (SIGTERM, SIGKILL after ``--grace``)
and resigns only once it is gone. A ``--call`` callable has the Elector's watchdog: it
calls ``lease.heartbeat()``; once it has not for S seconds the Elector steps down but keeps
the lease renewed until the callable returns, and ``runleader`` exits without releasing
should it still run ``--grace`` seconds after (:meth:`PayloadRunner.overdue`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import IO, Any

from django_leader import guard
from django_leader.elector import Elector
from django_leader.lease import Lease, LossReason, clock

logger = logging.getLogger("django_leader")

#: What to do when the child exits on its own while the lease is held (``--on-exit``).
ON_EXIT = ("release", "restart", "exit")
#: Longest back-off between restarts of a payload that keeps exiting (--on-exit=release).
MAX_BACKOFF = 60.0
#: A payload that ran this long is not crash-looping: its next back-off starts afresh.
STABLE_RUN = 30.0
#: Seconds runleader waits, once the guard is gone, for the SIGKILLed processes of the
#: payload's group to be gone; past it, it exits without releasing the lease.
KILL_WAIT = 5.0
#: The environment variable naming the file a child touches to feed the watchdog.
HEARTBEAT_ENV = "DJANGO_LEADER_HEARTBEAT_FILE"


class Ended(Enum):
    """How a child's run ended (:meth:`PayloadRunner._run_child`)."""

    EXITED = "exited"  # on its own, the lease still held
    LOST = "lost"  # the term ended (lost, stopped), or the child cannot be confirmed gone
    WATCHDOG = "watchdog"  # stopped because it did not touch its heartbeat file in time


class HeartbeatFile:
    """The file a child touches to say it is alive (``runleader --watchdog``), in a private
    directory of its own (mode 0700) that :meth:`close` removes.

    A beat is any change of the file's status: a new modification time (``touch``, a
    write), a new change time (``touch -d`` of the same date again), a new inode (the file
    replaced). Each change is timed on runleader's own clock when it is seen: the times
    in the file are compared, never read as times, so that neither the date the child
    sets nor a step of the wall clock can make a stale file look fresh or a fresh one
    stale.
    """

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="django-leader-")
        self.path = os.path.join(self.directory, "heartbeat")
        self._seen: tuple[int, int, int] | None = None
        self._beat = clock()

    def reset(self) -> None:
        """A child starts: it has the whole watchdog period from now."""
        if not self._ours():
            # A cleaner of the temporary directory took it: whatever sits at that path now
            # (another user's directory, a symlink) is not used; a new one, as at the start.
            self.directory = tempfile.mkdtemp(prefix="django-leader-")
            self.path = os.path.join(self.directory, "heartbeat")
        # Never through a symlink, even in a directory only this user can write to.
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        self._seen = self._status()
        self._beat = clock()

    def _ours(self) -> bool:
        """Whether the directory is still the one made for this file: a real directory of
        this user that no one else may enter."""
        try:
            st = os.lstat(self.directory)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077

    def idle(self) -> float:
        """Seconds since the child last touched the file (or since :meth:`reset`)."""
        status = self._status()
        if status is not None and status != self._seen:
            self._seen = status
            self._beat = clock()
        return clock() - self._beat

    def _status(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:  # removed by the child: no beat until it is back
            return None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


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
    """The work given to ``elector``: ``call(lease)``, or ``child`` under its guard.

    ``grace`` is the time a stopped payload gets before it is killed; ``on_exit`` (one of
    :data:`ON_EXIT`) what happens when the child exits on its own; ``watchdog`` (a child
    only) the seconds the child may go without touching its heartbeat file (a callable's
    watchdog is the Elector's). After the elector's thread ends, :attr:`exit_code` is the
    status the command should exit with; :meth:`close` removes the heartbeat file.
    """

    def __init__(
        self,
        elector: Elector,
        *,
        call: Callable[[Lease], Any] | None = None,
        child: Sequence[str] = (),
        grace: float = 10.0,
        on_exit: str = "release",
        watchdog: float | None = None,
    ) -> None:
        if (call is None) == (not child):
            raise ValueError("give exactly one payload: call or child")
        if on_exit not in ON_EXIT:
            raise ValueError(f"on_exit must be one of {ON_EXIT}, got {on_exit!r}")
        if watchdog is not None and (call is not None or not 0 < watchdog < float("inf")):
            raise ValueError(
                f"watchdog is for a child, in seconds > 0, got {watchdog!r} "
                "(a callable's watchdog is the Elector's)"
            )
        self.elector = elector
        self.call = call
        self.call_name = getattr(call, "__qualname__", repr(call))
        self.child = list(child)
        self.grace = grace
        self.on_exit = on_exit
        self.exit_code = 0
        self.keep_lease = False  # set for good once a payload could not be confirmed gone
        #: Why the callable's current term ended, once it did (for the command's log).
        self.lost_cause: LossReason | None = None
        self._stop_lock = threading.Lock()
        self._guard: subprocess.Popen[bytes] | None = None
        self._lost_at: float | None = None
        self._running = threading.Event()
        self._backoff = 0.0
        self.watchdog = watchdog
        self.heartbeat = HeartbeatFile() if watchdog is not None else None

    def close(self) -> None:
        """Remove the heartbeat file and its directory (after the elector's thread ended)."""
        if self.heartbeat is not None:
            self.heartbeat.close()

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; ``release=False`` is for good. ``Elector.stop`` keeps the last
        word on releasing, so a SIGTERM handled by the main thread just after the work
        thread found a payload it cannot confirm gone would turn that "do not release"
        back into a release, letting the lease go while the payload may still act (see
        docs/safety.md). Both threads stop through here, under a lock."""
        with self._stop_lock:
            if not release:
                self.keep_lease = True
            self.elector.stop(release=not self.keep_lease, timeout=0)

    # The work: runs in the Elector's work thread, once per election.
    def work(self, lease: Lease) -> None:
        self._lost_at = None
        self.lost_cause = None
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
            self.elector.resign(self._backoff)

    def _next_backoff(self, ran: float) -> None:
        """Back-off after a payload that ended on its own after ``ran`` seconds: none after
        a stable run, else from RETRY_INTERVAL doubling up to MAX_BACKOFF."""
        retry = self.elector.timing.retry_interval
        self._backoff = (
            0.0 if ran >= STABLE_RUN else min(MAX_BACKOFF, max(retry, self._backoff * 2))
        )

    def _watch_lost(self, lease: Lease) -> None:
        lease.lost.wait()
        self.lost_cause = lease.lost_cause
        self._lost_at = clock()

    def overdue(self) -> float | None:
        """Seconds past ``grace`` that a callable ignores ``lease.lost``, else None. Then
        the command exits without releasing: the lease, kept renewed while the callable
        ran, expires after its TTL, and the callable cannot act beside the next leader."""
        if self.call is None or self._lost_at is None or not self._running.is_set():
            return None
        late = clock() - self._lost_at
        return late if late > self.grace else None

    def _supervise(self, lease: Lease) -> None:
        while True:
            started = clock()
            status, ended = self._run_child(lease)
            if ended is Ended.LOST:
                return
            self._next_backoff(clock() - started)
            if ended is Ended.WATCHDOG:
                # Whatever --on-exit says (that is for a child that exits on its own): a
                # stuck child costs this candidate its term. It waits at least two retry
                # intervals, so that a polling follower gets to try first.
                self._backoff = max(self._backoff, 2 * self.elector.timing.retry_interval)
                logger.warning(
                    "payload stopped by the watchdog (exit status %s); releasing the lease, "
                    "campaigning again in %.1fs",
                    status,
                    self._backoff,
                )
                self.elector.resign(self._backoff)
                return
            if self.on_exit == "restart":
                logger.info(
                    "payload exited with %s; restarting it in %.1fs (--on-exit=restart)",
                    status,
                    self._backoff,
                )
                if lease.lost.wait(self._backoff):  # keeps the lease meanwhile
                    return
                continue
            if self.on_exit == "exit":
                logger.info(
                    "payload exited with %s; releasing and exiting (--on-exit=exit)", status
                )
                self.exit_code = status
                self.stop()
                return
            logger.info(
                "payload exited with %s; releasing the lease, campaigning again in %.1fs",
                status,
                self._backoff,
            )
            self.elector.resign(self._backoff)
            return

    def _run_child(self, lease: Lease) -> tuple[int, Ended]:
        """Start the child under a guard and wait for it; returns its status and how it
        ended."""
        env = {
            **os.environ,
            "DJANGO_LEADER_NAME": lease.name,
            "DJANGO_LEADER_TOKEN": str(lease.token),
            "DJANGO_LEADER_HOLDER": lease.holder,
        }
        heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat.reset()
            env[HEARTBEAT_ENV] = heartbeat.path
        # The payload writes its pid (= its process group id) here before exec, so that
        # runleader can finish it off should the guard die under it.
        pid_read, pid_write = os.pipe()
        try:
            process = self._guard = subprocess.Popen(
                # By path, not -m: the guard then imports nothing but the standard library.
                [
                    sys.executable,
                    guard.__file__,
                    "--deadline",
                    guard_deadline(lease),
                    "--grace",
                    str(self.grace),
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
        assert process.stdin is not None
        logger.info(
            "payload started: %s (guard pid %s, token %s)",
            " ".join(self.child),
            process.pid,
            lease.token,
        )
        told = lease.deadline
        asked_to_stop = stale = False
        while process.poll() is None:
            try:
                if not asked_to_stop and heartbeat is not None and self.watchdog is not None:
                    idle = heartbeat.idle()
                    if idle >= self.watchdog:
                        # Stopped as at the end of a term, and the lease is renewed
                        # meanwhile: it is let go only once the child is gone.
                        logger.warning(
                            "payload did not touch %s for %.1fs (--watchdog %gs): stopping it",
                            HEARTBEAT_ENV,
                            idle,
                            self.watchdog,
                        )
                        stale = True
                if (stale or lease.lost.is_set()) and not asked_to_stop:
                    asked_to_stop = True
                    process.stdin.write(b"T\n")
                    process.stdin.flush()
                # While the lease is renewed (also while a stopping payload winds down),
                # the guard's deadline moves with it; after a loss it no longer does.
                if lease.deadline != told:
                    told = lease.deadline
                    process.stdin.write(f"D {guard_deadline(lease)}\n".encode())
                    process.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # the guard is exiting; poll() tells
            lease.lost.wait(0.05)
        status = process.returncode
        close_pipe(process.stdin)
        if status < 0:  # the guard never dies of a signal on its own: it was killed
            logger.error(
                "guard pid %s was killed by signal %s: killing its payload", process.pid, -status
            )
            status = 128 - status
        # However the guard ended, nothing of the payload may outlive it (a payload never
        # outlives its lease): the lease is released or handed on only once the payload's
        # group is confirmed gone.
        give_up = clock() + KILL_WAIT
        payload = read_payload_pid(pid_read, give_up)
        if payload is not None and not kill_group(payload, give_up):
            logger.error(
                "cannot confirm that the payload is gone: exiting without releasing %r, "
                "which expires on its own",
                lease.name,
            )
            self.exit_code = 1
            self.stop(release=False)
            return status, Ended.LOST
        logger.info("payload stopped: guard pid %s exited with %s", process.pid, status)
        # `held`, not `lost`: the guard may have killed the payload at the deadline before
        # the renewer thread noticed that it passed.
        if not lease.held:
            return status, Ended.LOST
        return status, Ended.WATCHDOG if stale else Ended.EXITED

    def kill(self) -> None:
        """Forced exit: close the guard's pipe; it stops the payload (SIGTERM, then SIGKILL
        after the grace period or at the lease deadline, whichever is first)."""
        process = self._guard
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()


def close_pipe(pipe: IO[bytes]) -> None:
    """Close our end of the pipe to the guard. A write the guard never read (it exited
    as we wrote: BrokenPipeError) stays in the buffer, and ``close()`` tries to flush it
    again; the file is closed all the same, and the error says nothing new."""
    with contextlib.suppress(BrokenPipeError):
        pipe.close()
