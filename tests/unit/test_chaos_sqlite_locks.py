"""How the chaos harness tells a `stop` that froze a candidate inside a read or a write of
the SQLite file (tests/chaos/stores.py ``sqlite_locks``, harness ``stopped``): with real
SQLite locks, taken by this process and by a stopped child."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos import harness
from tests.chaos.harness import stopped
from tests.chaos.stores import sqlite_locks
from tests.unit.test_chaos_checker import fault, term

pytestmark = pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks"
)


def test_a_write_transaction_shows_as_a_write_lock_of_this_process(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE t (x)")
    assert sqlite_locks(path, os.getpid()) == ""
    db.execute("BEGIN IMMEDIATE")  # SQLite's RESERVED lock (and a SHARED one)
    held = sqlite_locks(path, os.getpid())
    assert "WRITE" in held
    # Another process's pid holds nothing on it.
    assert sqlite_locks(path, os.getppid()) == ""
    db.execute("COMMIT")
    assert sqlite_locks(path, os.getpid()) == ""
    db.close()


def test_a_process_stopped_inside_a_read_keeps_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
        db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    # The child reads one row of a query not yet drained (a SHARED lock, held until the
    # statement ends), says so, then stops itself.
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import os, signal, sqlite3, sys\n"
            f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "rows = db.execute('SELECT x FROM t')\n"
            "rows.fetchone()\n"
            "print('reading', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGSTOP)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reading"
        assert stopped(child.pid, timeout=10)
        held = sqlite_locks(path, child.pid)
        assert "READ" in held
        # What the harness relies on: no other process can write meanwhile.
        writer = sqlite3.connect(path, timeout=0.2)
        with pytest.raises(sqlite3.OperationalError, match="locked"), writer:
            writer.execute("INSERT INTO t VALUES (99)")
        writer.close()
    finally:
        child.send_signal(signal.SIGCONT)
        child.wait(timeout=10)
    assert sqlite_locks(path, child.pid) == ""


def test_stopped_is_false_for_a_running_or_gone_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not stopped(child.pid, timeout=0.2)
        child.send_signal(signal.SIGSTOP)
        assert stopped(child.pid, timeout=10)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert not stopped(child.pid, timeout=0.1)


def test_a_stop_that_caught_a_lock_counts_from_the_sigcont(tmp_path: Path) -> None:
    """The records of a SQLite run where the leader, stopped at 10 s inside a write, kept
    every takeover out until its SIGCONT at 14 s: the follower acts 0.2 s after it. Counted
    from the SIGCONT (``ready``, as the harness records such a stop) that is in time, and
    the report's notes say why; counted from the stop it would be late (4.2 s > 3.5 s)."""
    stop = {**fault("stop", 10.0, ready=14.0), "target": "a", "token": 1,
            "locks": "WRITE 1073741825-1073741825"}  # fmt: skip
    history = [*term("a", 1, 0.0, 10.0), stop, *term("b", 2, 14.2, 20.0)]
    run = {"ev": "run", "t": 0.0, "store": "sqlite", "duration": 20.0, "seed": 1}
    records = [run, *history, {"ev": "run_end", "t": 20.0}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    outcome = harness.recheck(tmp_path)
    assert outcome.result.violations == []
    assert [round(r.seconds or 0, 1) for r in outcome.result.recoveries] == [0.2]
    assert outcome.notes and "1 of the 1 faults (stop)" in outcome.notes[0]
    assert "SIGCONT" in outcome.notes[0]

    stop["ready"] = stop["t"]  # as a stop that held no lock is recorded
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    late = harness.recheck(tmp_path).result.violations
    assert [v.check for v in late] == ["liveness"]
