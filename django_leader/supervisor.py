"""A tiny guard process between ``manage.py runleader`` and its payload.

``runleader`` cannot protect the lease from its own payload when it is frozen (SIGSTOP, a
long GC or swap pause) or killed: a frozen process kills nothing. So the payload runs
under this guard, a separate process that imports nothing but the standard library and is
told, through a pipe, each new lease deadline:

* ``D <seconds>``: the lease is valid for this many more seconds (sent after every
  successful renewal; the guard keeps its own monotonic deadline);
* ``T``: stop the payload gracefully: SIGTERM, then SIGKILL after ``--grace`` seconds.

The guard SIGKILLs the payload's whole process group the moment the last deadline passes
without a new one (the parent is frozen, or lost the lease), and stops it as for ``T`` if
the pipe closes (the parent died). It exits with the payload's exit status (128 + signal
number if it was killed by a signal), so the parent sees what the payload did.

Run as ``python path/to/supervisor.py --deadline S --grace G -- CMD ARGS...`` (by path, so
that it imports nothing but the standard library).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time

POLL = 0.05  # seconds between checks of the payload, the pipe and the clock


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# The clock of django_leader.lease.clock(): it keeps counting through a suspend.
clock = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _default_signals() -> None:
    """In the payload, before exec: ignored signals would stay ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def supervise(cmd: list[str], deadline_in: float, grace: float) -> int:
    # The guard must outlive a SIGTERM/SIGINT sent to runleader's process group: the
    # parent decides, and tells it through the pipe (or by closing it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = clock() + deadline_in
    try:
        child = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_default_signals
        )
    except OSError as exc:  # as a shell says it, with a shell's status
        sys.stderr.write(f"django_leader.supervisor: cannot run {cmd[0]}: {exc.strerror}\n")
        return 126 if isinstance(exc, PermissionError) else 127
    pgid = child.pid  # start_new_session: the payload leads its own process group
    stdin = sys.stdin.buffer
    buffer = b""
    pipe_open = True
    kill_at: float | None = None  # set once SIGTERM was sent: SIGKILL at this time

    def terminate(why: str) -> None:
        nonlocal kill_at
        if kill_at is None:
            sys.stderr.write(f"django_leader.supervisor: {why}: SIGTERM to pid {child.pid}\n")
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
                f"django_leader.supervisor: lease deadline passed: SIGKILL to pid {child.pid}\n"
            )
            _signal_group(pgid, signal.SIGKILL)
            child.wait()
            return 128 + signal.SIGKILL
        if kill_at is not None and now >= kill_at:
            sys.stderr.write(
                f"django_leader.supervisor: grace period over: SIGKILL to pid {child.pid}\n"
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
                deadline = clock() + float(parts[1])
            elif parts[0] == "T":
                terminate("asked to stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m django_leader.supervisor")
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command")
    return supervise(cmd, args.deadline, args.grace)


if __name__ == "__main__":
    sys.exit(main())
