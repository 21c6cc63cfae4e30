"""A tiny guard process between ``manage.py runleader`` and its payload.

``runleader`` cannot protect the lease from its own payload when it is frozen (SIGSTOP, a
long GC or swap pause) or killed: a frozen process kills nothing. So the payload runs
under this guard, a separate process that imports nothing but the standard library and is
told, through a pipe on its stdin, each new lease deadline.

The protocol. Deadlines are *absolute* times on the boot clock (``CLOCK_BOOTTIME``, the
clock of ``django_leader.lease.clock``; ``time.monotonic`` where there is none). That
clock is system-wide, so runleader and the guard read the same one, and a deadline that
spent time in the pipe, or in the guard's start-up, is not made later by that delay:

* ``--deadline T`` on the command line: the lease's deadline when the payload is started.
  If it has already passed, the payload is not started at all;
* ``D T`` (a line on stdin): the lease was renewed, its deadline is now ``T``; sent after
  every successful renewal. A ``T`` already past makes the guard kill at once;
* ``T``: stop the payload gracefully: SIGTERM, then SIGKILL after ``--grace`` seconds.

The guard SIGKILLs the payload's whole process group the moment the last deadline passes
without a new one (the parent is frozen, or lost the lease), and stops it as for ``T`` if
the pipe closes (the parent died). It exits with the payload's exit status (128 + signal
number if it was killed by a signal), so the parent sees what the payload did.

If the guard itself dies (SIGKILL, OOM killer), the payload does not outlive it: on Linux
the payload is started with the parent-death signal ``SIGKILL`` (``PR_SET_PDEATHSIG``),
set just before exec. With ``--pid-fd N`` the payload writes its pid (which is also its
process group id: it leads a session of its own) as one line to descriptor N before exec,
so that runleader can kill what the payload started and confirm the group is gone before
it lets the lease go.

Run as ``python path/to/guard.py --deadline T --grace G [--pid-fd N] -- CMD ARGS...``
(by path, so that it imports nothing but the standard library).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

POLL = 0.05  # seconds between checks of the payload, the pipe and the clock


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# The clock of django_leader.lease.clock(): it keeps counting through a suspend.
clock = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl() on Linux, else None (loaded before the fork, not in the child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


def _payload_setup(guard_pid: int, pid_fd: int | None) -> Callable[[], None]:
    """What the payload does between fork and exec (the guard is single-threaded, so
    this runs safely; and the guard forks from its main thread, the thread whose exit
    the parent-death signal follows)."""
    prctl = _load_prctl()

    def setup() -> None:
        # Ignored signals would stay ignored across exec.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os.write(2, b"django_leader.guard: prctl(PR_SET_PDEATHSIG) failed\n")
            os._exit(126)
        if os.getppid() != guard_pid:
            os._exit(128 + signal.SIGKILL)  # the guard died before the signal was armed
        if pid_fd is not None:
            os.write(pid_fd, f"{os.getpid()}\n".encode())

    return setup


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def supervise(cmd: list[str], deadline: float, grace: float, pid_fd: int | None = None) -> int:
    """Run ``cmd`` until it exits, is stopped, or ``deadline`` (absolute, on
    :func:`clock`) passes without a new one."""
    # The guard must outlive a SIGTERM/SIGINT sent to runleader's process group: the
    # parent decides, and tells it through the pipe (or by closing it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if clock() >= deadline:
        _close(pid_fd)
        sys.stderr.write("django_leader.guard: lease deadline passed before the payload started\n")
        return 128 + signal.SIGKILL
    try:
        child = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_payload_setup(os.getpid(), pid_fd),
        )
    except OSError as exc:  # as a shell says it, with a shell's status
        sys.stderr.write(f"django_leader.guard: cannot run {cmd[0]}: {exc.strerror}\n")
        return 126 if isinstance(exc, PermissionError) else 127
    finally:
        _close(pid_fd)
    pgid = child.pid  # start_new_session: the payload leads its own process group
    stdin = sys.stdin.buffer
    buffer = b""
    pipe_open = True
    kill_at: float | None = None  # set once SIGTERM was sent: SIGKILL at this time

    def terminate(why: str) -> None:
        nonlocal kill_at
        if kill_at is None:
            sys.stderr.write(f"django_leader.guard: {why}: SIGTERM to pid {child.pid}\n")
            _signal_group(pgid, signal.SIGTERM)
            kill_at = clock() + grace

    while True:
        status = child.poll()
        if status is not None:
            _signal_group(pgid, signal.SIGKILL)  # leftovers of the payload's group
            return status if status >= 0 else 128 - status
        now = clock()
        if now >= deadline:
            sys.stderr.write(
                f"django_leader.guard: lease deadline passed: SIGKILL to pid {child.pid}\n"
            )
            _signal_group(pgid, signal.SIGKILL)
            child.wait()
            return 128 + signal.SIGKILL
        if kill_at is not None and now >= kill_at:
            sys.stderr.write(
                f"django_leader.guard: grace period over: SIGKILL to pid {child.pid}\n"
            )
            _signal_group(pgid, signal.SIGKILL)
            child.wait()
            return 128 + signal.SIGKILL
        if not pipe_open:
            time.sleep(min(POLL, max(0.0, deadline - now)))
            continue
        ready, _, _ = select.select([stdin], [], [], min(POLL, max(0.0, deadline - now)))
        if not ready:
            continue
        chunk = os.read(stdin.fileno(), 4096)
        if not chunk:
            pipe_open = False
            terminate("runleader is gone")
            continue
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            parts = line.decode().split()
            if not parts:
                continue
            if parts[0] == "D" and len(parts) == 2:
                deadline = float(parts[1])
            elif parts[0] == "T":
                terminate("asked to stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m django_leader.guard")
    parser.add_argument("--deadline", type=float, required=True, help="absolute, on clock()")
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("--pid-fd", type=int, help="the payload writes its pid here")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command")
    return supervise(cmd, args.deadline, args.grace, args.pid_fd)


if __name__ == "__main__":
    sys.exit(main())
