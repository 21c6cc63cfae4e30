"""The guard process between ``runleader`` and its payload, run as runleader runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django_leader import guard as guard_module
from tests.support.waiting import wait_until

GUARD = [sys.executable, guard_module.__file__]


def guard(*args: str, stdin: int | None = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([*GUARD, *args], stdin=stdin, stderr=subprocess.PIPE, text=True)


def deadline_in(seconds: float) -> str:
    """An absolute deadline on the guard's clock, as runleader sends it."""
    return repr(guard_module.clock() + seconds)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def alive(pid: int) -> bool:
    """Not gone and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_exits_with_the_payloads_status() -> None:
    proc = guard(
        "--deadline", deadline_in(30), "--grace", "1", "--", sys.executable, "-c", "exit(7)"
    )
    assert proc.wait(30) == 7


def test_a_command_that_cannot_run_is_one_line_and_status_127() -> None:
    proc = guard("--deadline", deadline_in(30), "--grace", "1", "--", "/nonexistent/payload")
    assert proc.wait(30) == 127
    assert proc.stderr is not None
    assert proc.stderr.read().strip().splitlines() == [
        "django_leader.guard: cannot run /nonexistent/payload: No such file or directory"
    ]


def test_kills_the_payload_when_the_deadline_passes(tmp_path: Path) -> None:
    """Nobody renews (a frozen runleader): SIGKILL at the deadline, whatever the grace."""
    started = time.monotonic()
    proc = guard("--deadline", deadline_in(0.5), "--grace", "30", "--", "sleep", "30")
    assert proc.wait(30) == 128 + 9
    assert time.monotonic() - started < 10
    assert proc.stderr is not None and "lease deadline passed" in proc.stderr.read()


def test_a_moved_deadline_keeps_the_payload_running() -> None:
    """A renewal (``D``) moves the deadline: the payload outlives the first one."""
    proc = guard("--deadline", deadline_in(1.0), "--grace", "1", "--", "sleep", "2")
    assert proc.stdin is not None
    proc.stdin.write(f"D {deadline_in(30)}\n")  # read at once: the pipe holds it meanwhile
    proc.stdin.flush()
    assert proc.wait(30) == 0


def test_a_deadline_past_at_start_up_never_runs_the_payload(tmp_path: Path) -> None:
    """Deadlines are absolute (boot clock): a guard that starts late, after the lease's
    deadline, does not give the payload the time it took to start."""
    ran = tmp_path / "ran"
    proc = guard(
        "--deadline", deadline_in(-0.001), "--grace", "30",
        "--", "sh", "-c", f"touch {ran}; sleep 30",
    )  # fmt: skip
    assert proc.wait(10) == 128 + 9
    assert not ran.exists()
    assert proc.stderr is not None and "lease deadline passed" in proc.stderr.read()


def test_a_deadline_that_passed_in_the_pipe_kills_at_once() -> None:
    """A ``D`` line read after its deadline (the pipe was slow) kills: it is not a
    fresh grant of that many seconds."""
    proc = guard("--deadline", deadline_in(30), "--grace", "30", "--", "sleep", "30")
    assert proc.stdin is not None
    proc.stdin.write(f"D {deadline_in(-0.001)}\n")
    proc.stdin.flush()
    assert proc.wait(10) == 128 + 9


def test_the_payload_dies_with_its_guard() -> None:
    """SIGKILL of the guard: the payload gets SIGKILL from the kernel (parent-death signal)."""
    proc = guard("--deadline", deadline_in(60), "--grace", "30", "--", "sleep", "60")
    payload = wait_until(lambda: children(proc.pid), timeout=15, message="no payload started")[0]
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not alive(payload), timeout=10, message="the payload did not die")
    finally:
        if alive(payload):
            os.kill(payload, signal.SIGKILL)
