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
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One store: the watchdog is runleader's, the same on every store (the Elector's is
    tested on each in tests/components/test_watchdog.py). SQLite, where followers poll,
    unless a test names another (``indirect``)."""
    yield from open_store(getattr(request, "param", "sqlite"))


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


# A --call callable that stalls: the elector's watchdog (STUCK_WATCHDOG) fires, the
# callable acts once more STALL seconds after its election, and runleader exits
# STUCK_WATCHDOG + STUCK_GRACE after it. STUCK_GRACE > STALL - STUCK_WATCHDOG, so that a
# lease let go when the watchdog fires would have a second leader act before the stuck one
# does; STUCK_TTL is short, for the expiry after runleader exits.
STUCK_WATCHDOG, STALL, STUCK_GRACE, STUCK_TTL = 0.5, 2.0, 2.5, 1.5


def acts(out: Path) -> list[tuple[int, int, float]]:
    """``(pid, token, time)`` of each act noted by ``stalls_then_acts``, in the order
    written."""
    if not out.exists():
        return []
    found = []
    for raw in out.read_text().splitlines():
        pid, what, token, at = raw.split()
        if what == "act":
            found.append((int(pid), int(token), float(at)))
    return found


# PostgreSQL, where the defect was found: a follower is woken by the release at once.
@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_stuck_call_keeps_the_lease_until_runleader_exits(
    fleet: Fleet, lease_name: str, tmp_path: Path
) -> None:
    """--call with --watchdog: a callable that stops beating and ignores lease.lost cannot
    be stopped. The elector steps down but keeps the lease renewed, so that no other
    runleader acts while it may still act; runleader exits --grace later without releasing,
    and another leads once the lease expired. Acts never go back to an older token."""
    out = tmp_path / "acts.txt"
    options = [
        *TIMING, "--ttl", str(STUCK_TTL), "--grace", str(STUCK_GRACE),
        "--watchdog", str(STUCK_WATCHDOG), "--call", "tests.runleader_callables.stalls_then_acts",
    ]  # fmt: skip
    env = {"DJANGO_LEADER_TEST_OUT": str(out), "DJANGO_LEADER_TEST_STALL": str(STALL)}
    for identity in ("s1", "s2"):
        fleet.start(identity, lease_name, *options, **env)
    wait_until(lambda: acts(out), timeout=WAIT, message="nobody acted")
    first = acts(out)[0]
    leader = first_holder(fleet, lease_name)
    follower = "s2" if leader == "s1" else "s1"
    # Once the stuck runleader is gone, its callable can act no more: then compare.
    assert fleet.procs[leader].wait(WAIT) == 1
    wait_until(
        lambda: any(token > first[1] for _, token, _ in acts(out)),
        timeout=WAIT,
        message=lambda: f"no other leader acted: {acts(out)}",
    )
    found = acts(out)
    print(f"acts (pid, token, time): {found}")
    tokens = [token for _, token, _ in found]
    assert tokens == sorted(tokens), f"an act with an older token after a newer one: {found}"
    # The stuck callable did act again, with its token, before the next leader's first act.
    stuck = [at for pid, token, at in found if pid == first[0]]
    assert len(stuck) == 2, found
    assert max(stuck) < min(at for _, token, at in found if token > first[1]), found

    log = fleet.log(leader)
    assert "stopped calling lease.heartbeat()" in log, log
    assert "exiting without releasing the lease" in log, log
    events = [event[:2] for event in history(fleet.backend, lease_name)]
    # Not released: it expired after runleader exited, and the follower took it over.
    assert events[:2] == [("acquired", leader), ("taken_over", follower)], events
    assert ("released", leader) not in events, events


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
