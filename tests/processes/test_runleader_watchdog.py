"""``manage.py runleader --watchdog S`` with real processes: a payload that stops showing it
is alive is stopped, the lease let go, and another runleader leads."""

from __future__ import annotations

import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.processes.test_runleader import (
    GRACE,
    RENEW,
    TIMING,
    WAIT,
    Fleet,
    alive,
    assert_one_writer_at_a_time,
    fleet,
    lines,
    next_writer,
    wait_started,
)
from tests.support.stores import history, open_store, stores_db
from tests.support.waiting import wait_until

__all__ = ["fleet"]  # the fixture, imported for use below

pytestmark = [stores_db, pytest.mark.multiprocess]

WATCHDOG = 1.0

# The child: appends "<pid> <token> <time>" to OUT every 0.1 s, and touches its heartbeat
# file for BEATS seconds first, noting "<pid> <time> <heartbeat file>" in OUT.touches each
# time. The first child to get that far then stops touching (its heartbeat is "deadlocked")
# but goes on writing; later ones touch for ever. With "deaf", it ignores SIGTERM.
CHILD = """
import os, signal, sys, time
out, beats, deaf = sys.argv[1], float(sys.argv[2]), sys.argv[3:] == ["deaf"]
if deaf:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
heartbeat = os.environ["DJANGO_LEADER_HEARTBEAT_FILE"]
token = os.environ["DJANGO_LEADER_TOKEN"]
hung = out + ".hung"
started = time.time()
while True:
    now = time.time()
    if now - started < beats or os.path.exists(hung) and not open(hung).read() == str(os.getpid()):
        os.utime(heartbeat)
        with open(out + ".touches", "a") as touches:
            touches.write(f"{os.getpid()} {time.time():.3f} {heartbeat}\\n")
    elif not os.path.exists(hung):
        with open(hung, "w") as mark:
            mark.write(str(os.getpid()))
    with open(out, "a") as writes:
        writes.write(f"{os.getpid()} {token} {now:.3f}\\n")
    time.sleep(0.1)  # the child's pace
"""


@pytest.fixture
def store() -> Iterator[Any]:
    """One store: the watchdog is runleader's, the same on every store (the Elector's is
    tested on each in tests/components/test_watchdog.py). SQLite, where followers poll."""
    yield from open_store("sqlite")


def start_pair(fleet: Fleet, name: str, out: Path, beats: float, *child_args: str) -> None:
    for identity in ("r1", "r2"):
        fleet.start(
            identity, name, *TIMING, "--grace", str(GRACE), "--watchdog", str(WATCHDOG),
            "--", sys.executable, "-c", CHILD, str(out), str(beats), *child_args,
        )  # fmt: skip


def touches(out: Path, pid: int) -> list[tuple[float, str]]:
    """``(time, heartbeat file)`` of each touch by ``pid``."""
    found = []
    for raw in Path(f"{out}.touches").read_text().splitlines():
        touched_by, at, path = raw.split()
        if int(touched_by) == pid:
            found.append((float(at), path))
    return found


def first_holder(fleet: Fleet, name: str) -> str:
    kind, holder, *_ = history(fleet.backend, name)[0]
    assert kind == "acquired"
    return str(holder)


def holder_changed(fleet: Fleet, name: str, holder: str) -> float:
    """Wait until ``holder`` no longer holds ``name``; when that was seen (time.time())."""
    wait_until(
        lambda: getattr(fleet.backend.read(name), "holder", None) != holder,
        timeout=WAIT,
        interval=0.02,
        message=lambda: f"{holder} still leads:\n{fleet.log(holder)}",
    )
    return time.time()


def test_child_that_stops_touching_is_stopped_and_another_leads(
    fleet: Fleet, lease_name: str, tmp_path: Path
) -> None:
    out = tmp_path / "writes.txt"
    start_pair(fleet, lease_name, out, 2 * WATCHDOG)
    wait_until(lambda: Path(f"{out}.hung").exists(), timeout=WAIT, message="no child hung")
    first = lines(out)[0]
    leader = first_holder(fleet, lease_name)
    last_touch, heartbeat = touches(out, first[0])[-1]
    # Touched, the file kept the lease for longer than the watchdog.
    same_term = [at for pid, token, at in lines(out) if token == first[1]]
    assert same_term[-1] - same_term[0] > WATCHDOG
    directory = Path(heartbeat).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    released_after = holder_changed(fleet, lease_name, leader) - last_touch
    print(f"watchdog {WATCHDOG}s: released {released_after:.3f}s after the last touch")
    # The acceptance bound: the lease goes within watchdog + RENEW_INTERVAL (the child
    # dies of its SIGTERM at once).
    assert released_after <= WATCHDOG + RENEW, released_after
    after = next_writer(out, first)
    assert not alive(first[0])
    assert_one_writer_at_a_time(lines(out))
    follower = "r2" if leader == "r1" else "r1"
    assert fleet.backend.read(lease_name).holder == follower
    log = fleet.log(leader)
    assert "did not touch DJANGO_LEADER_HEARTBEAT_FILE" in log, log
    assert "payload stopped by the watchdog" in log, log
    events = [event[:2] for event in history(fleet.backend, lease_name)]
    assert events[:3] == [("acquired", leader), ("released", leader), ("acquired", follower)]
    # The new child has a heartbeat file of its own, and touches it.
    assert touches(out, after[0][0])[0][1] != heartbeat

    # The old leader campaigns on; on SIGTERM it exits, and its heartbeat file goes.
    assert fleet.procs[leader].poll() is None
    fleet.procs[leader].send_signal(signal.SIGTERM)
    assert fleet.procs[leader].wait(WAIT) == 0
    assert not directory.exists()


def test_child_deaf_to_sigterm_is_killed_before_the_lease_goes(
    fleet: Fleet, lease_name: str, tmp_path: Path
) -> None:
    """A payload never outlives its lease: the lease is let go only once the child,
    which ignores SIGTERM, was killed after --grace."""
    out = tmp_path / "writes.txt"
    start_pair(fleet, lease_name, out, 0.5, "deaf")
    wait_until(lambda: Path(f"{out}.hung").exists(), timeout=WAIT, message="no child hung")
    first = lines(out)[0]
    leader = first_holder(fleet, lease_name)
    last_touch = touches(out, first[0])[-1][0]

    released_after = holder_changed(fleet, lease_name, leader) - last_touch
    assert released_after >= WATCHDOG + GRACE, released_after
    after = next_writer(out, first)
    old_last = max(at for pid, _, at in lines(out) if pid == first[0])
    assert old_last < after[0][2], f"the old child wrote after the new one began: {lines(out)}"
    assert not alive(first[0])
    assert_one_writer_at_a_time(lines(out))
    assert "grace period over: SIGKILL" in fleet.log(leader), fleet.log(leader)


def test_call_that_stops_beating_loses_the_lease_and_exits(fleet: Fleet, lease_name: str) -> None:
    """--call: the callable calls lease.heartbeat(); once it does not, the Elector's
    watchdog lets the lease go, and runleader exits 1 once --grace passed."""
    proc, out = fleet.start_call(
        "beats_then_hangs", lease_name, "--watchdog", str(WATCHDOG), "--grace", str(GRACE)
    )
    wait_started(out)
    fleet.start_call("obedient", lease_name)
    wait_until(lambda: "hang" in out.read_text(), timeout=WAIT, message="it never hung")
    hung_at = float(out.read_text().split()[-1])  # just before its last heartbeat

    released_after = holder_changed(fleet, lease_name, "beats_then_hangs") - hung_at
    print(f"watchdog {WATCHDOG}s: released {released_after:.3f}s after the last heartbeat")
    assert released_after <= WATCHDOG + RENEW, released_after
    wait_until(
        lambda: getattr(fleet.backend.read(lease_name), "holder", None) == "obedient",
        timeout=WAIT,
        message="the other runleader does not lead",
    )
    assert proc.wait(WAIT) == 1
    assert "stopped calling lease.heartbeat()" in fleet.log("beats_then_hangs")
    events = [event[:2] for event in history(fleet.backend, lease_name)]
    assert events[:3] == [
        ("acquired", "beats_then_hangs"),
        ("released", "beats_then_hangs"),
        ("acquired", "obedient"),
    ]


CALL = ["--call", "tests.runleader_callables.obedient"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watchdog", "0", *CALL], "--watchdog must be a number of seconds > 0"),
        (["--watchdog", "-1", *CALL], "--watchdog must be a number of seconds > 0"),
        (["--watchdog", "inf", *CALL], "--watchdog must be a number of seconds > 0"),
        (["--watchdog", "5", "--beat"], "--watchdog cannot be used with --beat"),
    ],
)
def test_bad_watchdog_is_a_usage_error(lease_name: str, args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as raised:
        call_command("runleader", lease_name, *args)
    assert raised.value.returncode == 2
