"""The guard process between ``runleader`` and its payload, run as runleader runs it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from django_leader import supervisor

GUARD = [sys.executable, supervisor.__file__]


def guard(*args: str, stdin: int | None = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GUARD, *args], stdin=stdin, stderr=subprocess.PIPE, text=True
    )


def test_exits_with_the_payloads_status() -> None:
    proc = guard("--deadline", "30", "--grace", "1", "--", sys.executable, "-c", "exit(7)")
    assert proc.wait(30) == 7


def test_a_command_that_cannot_run_is_one_line_and_status_127() -> None:
    proc = guard("--deadline", "30", "--grace", "1", "--", "/nonexistent/payload")
    assert proc.wait(30) == 127
    assert proc.stderr is not None
    assert proc.stderr.read().strip().splitlines() == [
        "django_leader.supervisor: cannot run /nonexistent/payload: No such file or directory"
    ]


def test_kills_the_payload_when_the_deadline_passes(tmp_path: Path) -> None:
    """Nobody renews (a frozen runleader): SIGKILL at the deadline, whatever the grace."""
    started = time.monotonic()
    proc = guard("--deadline", "0.5", "--grace", "30", "--", "sleep", "30")
    assert proc.wait(30) == 128 + 9
    assert time.monotonic() - started < 10
    assert proc.stderr is not None and "lease deadline passed" in proc.stderr.read()


def test_a_moved_deadline_keeps_the_payload_running() -> None:
    """A renewal (``D``) moves the deadline: the payload outlives the first one."""
    proc = guard("--deadline", "1.0", "--grace", "1", "--", "sleep", "2")
    assert proc.stdin is not None
    proc.stdin.write("D 30\n")  # read at once: the pipe holds it until the guard looks
    proc.stdin.flush()
    assert proc.wait(30) == 0
