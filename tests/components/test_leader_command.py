"""``manage.py leader``: status, history, release, prune (in-process, every store).

:func:`run` runs the command line (``Command.run_from_argv``, what ``manage.py leader``
ends in) in this process, with the settings of the store under test; two tests run the
real ``manage.py leader`` in a process of its own, on the configured store, for the exit
status as a shell sees it."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_leader import backends
from django_leader.backends import get_backend
from django_leader.backends.base import Backend
from django_leader.election import Candidate
from django_leader.lease import LossReason
from django_leader.models import LeaseEvent
from django_leader.testing import MemoryBackend, leader_backend
from tests.support.counting import round_trips
from tests.support.stores import (
    CACHE_STORES,
    DATABASE_STORES,
    ROOT,
    child_env,
    history,
    open_store,
    store_settings,
    stores_db,
)
from tests.support.waiting import wait_until

pytestmark = stores_db
__all__ = ["leader_backend"]  # the fixture, imported for use below


def run(backend: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py leader ARGS`` in this process, on ``backend``'s store: the command line
    parsed and run as ``manage.py`` does (usage errors exit 2, a CommandError its
    returncode, the command its exit status), with ``DJANGO_LEADER`` naming the store, so
    that the command resolves its backend from the settings anew. What it wrote and its
    exit status, as a process's. The system checks are skipped (as by call_command()):
    this test's app registry is cut to the apps it flushes; the process tests run them."""
    from django_leader.management.commands.leader import Command

    argv = ["manage.py", "leader", "--skip-checks", *args]
    out, err = io.StringIO(), io.StringIO()
    with override_settings(DJANGO_LEADER={**settings.DJANGO_LEADER, **store_settings(backend)}):
        store = get_backend()  # built anew from these settings: the one the command uses
        try:
            with redirect_stdout(out), redirect_stderr(err):
                Command().run_from_argv(argv)  # its OutputWrappers write to out and err
            status = 0
        except SystemExit as stopped:
            code = stopped.code
            status = code if isinstance(code, int) else 0 if code is None else 1
        finally:
            # What the process's exit would do: its history written, its connections gone.
            store.flush_history(10)
            store.close()
            shutdown = getattr(store, "shutdown", None)  # a ZooKeeper session
            if shutdown is not None:
                shutdown()
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


def process(backend: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py leader ARGS`` in a process of its own, on ``backend``'s store."""
    return subprocess.run(
        [sys.executable, "manage.py", "leader", *args],
        cwd=ROOT,
        env=child_env(backend),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_json_of_held_lease(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", 30)
    result = run(backend, "status", lease_name, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["name"] == lease_name and data["state"] == "held"
    assert (data["holder"], data["token"], data["transitions"]) == ("alice", lease.token, 1)
    assert 0 < data["expires_in"] <= 30
    assert set(data) == {
        "name",
        "state",
        "holder",
        "token",
        "acquired_at",
        "renewed_at",
        "expires_at",
        "expires_in",
        "transitions",
        "candidates",
        "queue",
        "known",
    }
    assert data["candidates"] == [] and data["queue"] == [] and data["known"] is True


FORGED = "alice\n2026-11-27 10:00:00 INFO django_leader: bob acquired\x1b[2J\u202e"


def test_status_and_history_escape_control_characters_a_store_writer_put_there(
    backend: Any, lease_name: str
) -> None:
    """A holder with a newline and escape sequences, written by whoever can write to the
    store (the API refuses such identities): printed escaped, never as a forged log line or
    a cleared screen; JSON shows it exactly."""
    lease, _ = backend.acquire(lease_name, FORGED, 30)
    assert lease is not None
    assert backend.flush_history(10)  # a cache store writes its history afterwards
    for args in (["status", lease_name], ["history", lease_name]):
        result = run(backend, *args)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\u202e" not in result.stdout, result.stdout
        assert "\n2026" not in result.stdout, result.stdout
        assert "alice\\n2026" in result.stdout and "\\x1b[2J\\u202e" in result.stdout
    assert json.loads(run(backend, "status", lease_name, "--json").stdout)["holder"] == FORGED


def test_status_lists_candidates_waiting(backend: Any, lease_name: str) -> None:
    """Each candidate but the holder, in its place in the queue, with its priority, host,
    pid and how long ago the store last heard from it (by the store's clock)."""
    backend.acquire(lease_name, "alice", 30)
    for identity in ("alice", "bob", "carol"):  # the holder is not one waiting
        backend.announce(lease_name, Candidate(identity, 0, f"{identity}-host", 100), 30)
    data = json.loads(run(backend, "status", lease_name, "--json").stdout)
    assert data["candidates"] == ["bob", "carol"]
    assert [
        (c["place"], c["identity"], c["priority"], c["host"], c["pid"]) for c in data["queue"]
    ] == [(1, "bob", 0, "bob-host", 100), (2, "carol", 0, "carol-host", 100)]
    # Announced just now, by the store's clock.
    assert all(0 <= c["seen_ago"] < 30 for c in data["queue"]), data["queue"]
    assert data["queue"][0]["seen_at"] and data["queue"][0]["joined_at"]
    result = run(backend, "status", lease_name)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "  candidates waiting: bob, carol"
    assert re.fullmatch(
        r"    1\. bob  \(priority 0, bob-host pid 100, seen \d+\.\ds ago\)", lines[2]
    )
    assert lines[3].startswith("    2. carol  (priority 0, carol-host pid 100, seen ")


def test_status_queue_follows_the_election_mode(leader_backend: MemoryBackend) -> None:
    """In priority mode the queue is by priority (ties: join order), not join order."""
    from django.test import override_settings

    leader_backend.acquire("n", "alice", 30)
    for identity, priority in (("bob", 1), ("carol", 5), ("dave", 1)):
        leader_backend.announce("n", Candidate(identity, priority), 30)
    out = io.StringIO()
    with override_settings(DJANGO_LEADER={"ELECTION_MODE": "priority"}):
        call_command("leader", "status", "n", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["candidates"] == ["carol", "bob", "dave"]
    assert [(c["place"], c["priority"]) for c in data["queue"]] == [(1, 5), (2, 1), (3, 1)]


def test_status_exits_3_when_nobody_holds(backend: Any, lease_name: str) -> None:
    result = run(backend, "status", lease_name, "--json")
    assert result.returncode == 3
    assert json.loads(result.stdout)["state"] == "free"
    lease, _ = backend.acquire(lease_name, "alice", 30)
    backend.release(lease)
    assert run(backend, "status", lease_name).returncode == 3


def test_status_tells_an_unknown_name_from_a_free_lease(backend: Any, lease_name: str) -> None:
    """A name never taken, with no history and no candidates, is most likely a typo: it is
    reported as unknown (still exit 3: nobody holds it), with the names it resembles."""
    backend.acquire(lease_name, "alice", 30)
    typo = lease_name[:-1] + ("x" if lease_name[-1] != "x" else "y")
    result = run(backend, "status", typo)
    assert result.returncode == 3
    assert result.stdout.startswith(f"{typo}: unknown — no lease of that name was ever taken")
    assert f"did you mean {lease_name}" in result.stdout
    data = json.loads(run(backend, "status", typo, "--json").stdout)
    assert (data["state"], data["known"]) == ("free", False)

    released, _ = backend.acquire(typo, "bob", 30)  # now it has been taken, and released
    backend.release(released)
    result = run(backend, "status", typo)
    assert (result.returncode, result.stdout) == (3, f"{typo}: free\n")


def test_status_prints_candidates_only_when_some_wait(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "alice", 30)
    backend.announce(lease_name, Candidate("alice"), 30)  # the holder itself is not waiting
    result = run(backend, "status", lease_name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{lease_name}: held by alice")
    assert "candidates waiting" not in result.stdout


def test_status_of_all_lists_known_names(backend: Any, lease_name: str) -> None:
    """CI failure (stop 40, Redis, once): the name was listed free. The lease was taken for
    30 s, and ``status`` lists every name the shared store holds (thousands, by then, on a
    busy machine): a term as long as its sibling's below, and what the store said after."""
    assert backend.acquire(lease_name, "alice", 300)[0] is not None
    started = time.monotonic()
    result = run(backend, "status", "--json")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    after = backend.read(lease_name)
    assert rows[lease_name]["holder"] == "alice", (round(took, 3), len(rows), after)


@pytest.fixture(params=[*DATABASE_STORES, *CACHE_STORES])
def counted_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A backend of each store whose round trips ``round_trips()`` counts (ZooKeeper's
    requests are sent without waiting for each other's answers: not round trips)."""
    yield from open_store(request.param)


def test_status_of_all_reads_many_names_in_a_few_round_trips(
    counted_store: Any, lease_name: str
) -> None:
    """CI failure (stop 37): ``leader status`` read each name's lease, then its candidates,
    one round trip each. With the thousands of names a test run leaves in the shared Redis,
    it took 39 s, and the 30 s lease it was to show had expired by the time its turn came.
    Now a batch of names per round trip: far fewer round trips than names (two per name
    before), whatever else the store holds (SCAN still walks its keys, a few hundred each)."""
    backend = counted_store
    names = [f"{lease_name}-{i:04d}" for i in range(1000)]
    for name in names:
        assert backend.acquire(name, "alice", 300)[0] is not None
    backend.announce(names[7], Candidate("bob"), 300)
    with round_trips() as trips:
        result = run(backend, "status", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {rows[name]["holder"] for name in names} == {"alice"}
    if backend.candidates(names[7]) is not None:
        assert rows[names[7]]["candidates"] == ["bob"]
    assert len(trips) < len(rows) / 10, (len(trips), len(rows))


def test_release_is_recorded_and_history_shows_it(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", 30)
    result = run(backend, "release", lease_name, "--reason", "maintenance")
    assert result.returncode == 0, result.stderr
    assert backend.read(lease_name) is None
    assert backend.renew(lease, 30) is None
    event = history(backend, lease_name)[-1]
    assert event[0] == "forced_release" and event[4].startswith("manage.py leader release")
    assert run(backend, "release", lease_name).returncode == 3  # nobody holds it now

    shown = run(backend, "history", lease_name, "--json", "--limit", "1")
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["kind"], row["holder"], row["detail"]) == ("forced_release", "alice", "maintenance")


def test_usage_errors_exit_2(backend: Any) -> None:
    assert run(backend, "status", "").returncode == 2
    assert run(backend, "history", "x", "--limit", "0").returncode == 2
    assert run(backend, "bogus").returncode == 2


def test_manage_py_leader_exits_with_the_status_a_shell_sees(store: Any, lease_name: str) -> None:
    """The real entry point, in a process of its own (``run`` stops short of the
    interpreter's exit): 3 for a name nobody holds, 2 for a usage error; 1 and 0 are seen
    from a process in test_handover_exit_codes_on_the_command_line."""
    nobody = process(store, "status", lease_name)
    assert nobody.returncode == 3, nobody.stderr
    assert nobody.stdout.startswith(f"{lease_name}: unknown — no lease of that name")
    usage = process(store, "bogus")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr, usage.stderr


def test_prune_keeps_recent_and_the_newest_of_each_name(db_alias: str, lease_name: str) -> None:
    from django.test import override_settings

    old = timezone.now() - timedelta(days=40)
    events = LeaseEvent.objects.using(db_alias)
    for token in (1, 2, 3):
        events.create(name=lease_name, kind="acquired", holder="h", token=token, at=old)
    events.create(
        name=lease_name + "-recent", kind="acquired", holder="h", token=1, at=timezone.now()
    )
    with override_settings(DJANGO_LEADER={"DATABASE": db_alias}):
        call_command("leader", "prune", "--days", "30", stdout=io.StringIO())
    left = sorted(events.filter(name__startswith=lease_name).values_list("name", "token"))
    assert left == [(lease_name, 3), (lease_name + "-recent", 1)]


def test_prune_keeps_the_greatest_token_even_if_not_newest(db_alias: str, lease_name: str) -> None:
    from django.test import override_settings

    old = timezone.now() - timedelta(days=40)
    events = LeaseEvent.objects.using(db_alias)
    events.create(name=lease_name, kind="acquired", holder="new", token=9, at=old)
    events.create(name=lease_name, kind="lost", holder="old", token=8, at=old)  # noticed late
    with override_settings(DJANGO_LEADER={"DATABASE": db_alias}):
        call_command("leader", "prune", "--days", "30", stdout=io.StringIO())
    assert list(events.filter(name=lease_name).values_list("token", flat=True)) == [9]


def test_prune_of_many_names_takes_a_few_statements_per_batch(
    db_alias: str, lease_name: str
) -> None:
    """2,000 names with two old events each: the lower token of each goes, in a few
    statements per batch (PRUNE_BATCH), never one per name, and never with more
    parameters than a batch (SQLite's limit lowered to 999 here; it was one per name)."""
    from django.db import connections
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    old = timezone.now() - timedelta(days=40)
    events = LeaseEvent.objects.using(db_alias)
    names = [f"{lease_name}-{i:05d}" for i in range(2000)]
    events.bulk_create(
        [
            LeaseEvent(name=name, kind="acquired", holder="h", token=token, at=old)
            for name in names
            for token in (1, 2)
        ],
        batch_size=500,
    )
    connection = connections[db_alias]
    connection.ensure_connection()
    limit = None
    variables = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", None)  # Python 3.11+
    if connection.vendor == "sqlite" and variables is not None:
        limit = connection.connection.setlimit(variables, 999)
    try:
        with (
            override_settings(DJANGO_LEADER={"DATABASE": db_alias}),
            CaptureQueriesContext(connection) as queries,
        ):
            call_command("leader", "prune", "--days", "30", stdout=io.StringIO())
    finally:
        if limit is not None:
            connection.connection.setlimit(variables, limit)
    left = events.filter(name__startswith=f"{lease_name}-")
    assert left.count() == 2000 and set(left.values_list("token", flat=True)) == {2}
    # A few statements per batch of 500 (PRUNE_BATCH) and a few more; one per name before.
    assert len(queries) <= 30, len(queries)


def test_prune_deletes_long_expired_candidacies(db_alias: str, lease_name: str) -> None:
    from django.test import override_settings

    from django_leader.models import LeaseCandidate

    now = timezone.now()
    candidates = LeaseCandidate.objects.using(db_alias)
    for identity, expires in (("gone", -timedelta(days=3)), ("live", timedelta(seconds=60))):
        candidates.create(name=lease_name, identity=identity, seen_at=now, expires_at=now + expires)
    with override_settings(DJANGO_LEADER={"DATABASE": db_alias}):
        out = io.StringIO()
        call_command("leader", "prune", stdout=out)
    assert "deleted 1 expired candidacies" in out.getvalue()
    assert list(candidates.filter(name=lease_name).values_list("identity", flat=True)) == ["live"]


def test_prune_cutoff_is_the_same_instant_whatever_the_session_time_zone(
    db_alias: str, lease_name: str
) -> None:
    """History times are UTC instants; the cutoff of ``prune --days 1`` must be one too.
    On MySQL, Django's ``Now()`` is the session's local time compared with columns of
    naive UTC: with the session 5 hours behind UTC, an event 25 hours old was kept (and,
    ahead of UTC, one 23 hours old deleted). PostgreSQL compares instants whatever the
    zone; SQLite has no session zone."""
    from django.db import connections
    from django.test import override_settings

    zone = {"mysql": "SET time_zone = '-05:00'", "postgresql": "SET TIME ZONE 'Etc/GMT+5'"}
    connection = connections[db_alias]
    events = LeaseEvent.objects.using(db_alias)
    now = timezone.now()
    for label, age in (("old", timedelta(hours=25)), ("recent", timedelta(hours=23))):
        events.create(
            name=f"{lease_name}-{label}", kind="acquired", holder="h", token=1, at=now - age
        )
        # And a greater token of each name, so that the retention's rule (keep the
        # greatest token of every name) does not keep the event under test.
        events.create(name=f"{lease_name}-{label}", kind="acquired", holder="h", token=2, at=now)
    if connection.vendor in zone:
        with connection.cursor() as cursor:
            cursor.execute(zone[connection.vendor])
    try:
        with override_settings(DJANGO_LEADER={"DATABASE": db_alias}):
            call_command("leader", "prune", "--days", "1", stdout=io.StringIO())
    finally:
        connection.close()  # the session's zone goes with it
    left = sorted(events.filter(name__startswith=lease_name).values_list("name", "token"))
    assert left == [
        (f"{lease_name}-old", 2),
        (f"{lease_name}-recent", 1),
        (f"{lease_name}-recent", 2),
    ]


def test_call_command_returns_instead_of_exiting(lease_name: str) -> None:
    """Exit status 3 is for the command line; from Python the answer is in the output."""
    from django_leader.management.commands.leader import Command

    store = get_backend()  # the one call_command() uses
    command, out = Command(), io.StringIO()
    call_command(command, "status", lease_name, "--json", stdout=out)
    assert json.loads(out.getvalue())["state"] == "free"
    assert command.exit_code == 3
    store.acquire(lease_name, "alice", 30)
    call_command(command, "status", lease_name, stdout=out)
    assert command.exit_code == 0


# -- handover ----------------------------------------------------------------------------


def handover(*args: str) -> tuple[Any, dict[str, Any]]:
    """``leader handover ARGS --json`` in this process: the command and its JSON answer."""
    from django_leader.management.commands.leader import Command

    command, out = Command(), io.StringIO()
    call_command(command, "handover", *args, "--json", stdout=out, stderr=io.StringIO())
    return command, json.loads(out.getvalue())


def queue_up(store: MemoryBackend, name: str, *candidates: tuple[str, int]) -> None:
    for identity, priority in candidates:
        store.announce(name, Candidate(identity, priority), 30)


def test_handover_to_a_named_candidate_gates_the_lease_to_it(
    leader_backend: MemoryBackend,
) -> None:
    """``--to``: the holder's next renewal names the candidate, and once it lets go only
    that candidate may acquire — not the holder, not the next in line."""
    lease, _ = leader_backend.acquire("n", "alice", 10)
    assert lease is not None
    queue_up(leader_backend, "n", ("bob", 0), ("carol", 0))
    command, answer = handover("n", "--to", "carol")
    assert command.exit_code == 0
    assert (answer["holder"], answer["token"], answer["to"], answer["held"]) == (
        "alice",
        lease.token,
        "carol",
        True,
    )
    assert answer["actor"].startswith("manage.py leader handover (")
    assert answer["window"] == 20.0  # LEASE_TTL + RENEW_INTERVAL of the settings
    assert leader_backend.events[-1] == ("handover", "n", "alice", 0)
    renewed = leader_backend.renew(lease, 30)
    assert renewed is not None and renewed.handover_to == "carol"
    assert leader_backend.release(renewed)
    for other in ("alice", "bob"):
        assert leader_backend.acquire("n", other, 30)[0] is None, other
    taken, _ = leader_backend.acquire("n", "carol", 30)
    assert taken is not None and taken.holder == "carol"


def test_handover_without_to_goes_to_the_next_in_line_by_mode(
    leader_backend: MemoryBackend,
) -> None:
    from django.test import override_settings

    leader_backend.acquire("n", "alice", 30)
    queue_up(leader_backend, "n", ("alice", 9), ("bob", 1), ("carol", 5))
    assert handover("n")[1]["to"] == "bob"  # race (the default) and fifo: join order
    with override_settings(DJANGO_LEADER={"ELECTION_MODE": "priority"}):
        assert handover("n")[1]["to"] == "carol"  # the highest priority but the holder's


def test_handover_refuses_what_it_cannot_do(leader_backend: MemoryBackend) -> None:
    """A clear error (exit 1), and no request made: ``--to`` not a live candidate (the
    candidates are listed), the holder itself, nobody waiting, a store that cannot."""
    from django.core.management.base import CommandError

    leader_backend.acquire("n", "alice", 30)
    with pytest.raises(CommandError, match="no candidate is waiting for 'n'"):
        handover("n")
    queue_up(leader_backend, "n", ("bob", 0), ("carol", 0))
    with pytest.raises(CommandError, match=r"dave is not a live candidate .*: bob, carol$"):
        handover("n", "--to", "dave")
    with pytest.raises(CommandError, match="alice already holds 'n'"):
        handover("n", "--to", "alice")
    assert [event[0] for event in leader_backend.events] == ["acquired"]

    class NoHandover(MemoryBackend):
        request_handover = Backend.request_handover

    cannot = NoHandover()
    cannot.acquire("n", "alice", 30)
    queue_up(cannot, "n", ("bob", 0))
    with (
        mock.patch.object(backends, "_override", cannot),
        pytest.raises(CommandError, match="cannot hand 'n' over: NoHandover cannot hand"),
    ):
        handover("n")


def test_handover_wait_follows_real_electors(leader_backend: MemoryBackend) -> None:
    """Two Electors: ``--wait`` returns once the named one leads; the old leader stepped
    down as handed over and did not win the lease back."""
    from django_leader import Elector

    timing = {"ttl": 1.0, "renew_interval": 0.1, "retry_interval": 0.05}
    alice = Elector("n", identity="alice", **timing)  # type: ignore[arg-type]
    alice.start()
    bob = Elector("n", identity="bob", **timing)  # type: ignore[arg-type]
    try:
        assert alice.wait_for_leadership(5)
        first = alice.lease
        assert first is not None
        bob.start()
        wait_until(lambda: leader_backend.candidates("n"), timeout=5, message="bob never queued")
        command, answer = handover("n", "--to", "bob", "--wait", "5")
        assert command.exit_code == 0, answer
        assert answer["handed_over"] is True and answer["now"]["holder"] == "bob", answer
        assert answer["now"]["token"] > first.token
        assert first.lost_cause is LossReason.HANDED_OVER
        assert bob.is_leader and not alice.is_leader
        assert [e[2] for e in leader_backend.events if e[0] == "acquired"] == ["alice", "bob"]
    finally:
        bob.stop()
        alice.stop()


def test_handover_wait_fails_when_the_candidate_does_not_take_it(
    leader_backend: MemoryBackend,
) -> None:
    """Nobody renews this lease, so the holder never hears of the request: after ``--wait``
    the command says who holds it and exits 4."""
    leader_backend.acquire("n", "alice", 30)
    queue_up(leader_backend, "n", ("bob", 0))
    command, answer = handover("n", "--wait", "0.3")
    assert command.exit_code == 4
    assert answer["handed_over"] is False and answer["now"]["holder"] == "alice"
    assert answer["waited"] >= 0.3


def test_handover_window_covers_a_holder_with_a_longer_ttl() -> None:
    """An Elector may run with a longer ttl than LEASE_TTL, and renew as rarely as every
    ttl / 2: the gate stands at least one of its TTLs, so it sees the request."""
    from datetime import datetime, timezone

    from django_leader.conf import get_settings
    from django_leader.handover import window_for
    from django_leader.lease import Lease

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    short = Lease("n", "a", 1, at, at, at + timedelta(seconds=5), 1)
    long = Lease("n", "a", 1, at, at, at + timedelta(seconds=120), 1)
    timing = get_settings().timing
    assert window_for(short) == timing.ttl + timing.renew_interval
    assert window_for(long) == 120.0


def test_handover_exit_codes_on_the_command_line(store: Any, lease_name: str) -> None:
    """3 for a name nobody holds (an unknown one said so), 2 for a usage error, 1 with the
    error on stderr; done, the history names the operator and the candidate."""
    from django.core.management.base import CommandError

    from django_leader.management.commands.leader import Command

    command, out = Command(), io.StringIO()
    call_command(command, "handover", lease_name, stdout=out)
    assert command.exit_code == 3
    assert out.getvalue().startswith(f"{lease_name}: unknown — no lease of that name")
    with pytest.raises(CommandError) as usage:
        call_command("leader", "handover", lease_name, "--wait", "0")
    assert usage.value.returncode == 2

    lease, _ = store.acquire(lease_name, "alice", 30)
    store.announce(lease_name, Candidate("bob"), 30)
    refused = process(store, "handover", lease_name, "--to", "carol")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "carol is not a live candidate" in refused.stderr and "bob" in refused.stderr
    done = process(store, "handover", lease_name, "--reason", "deploy")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{lease_name}: alice (token {lease.token}) hands over to bob")
    kind, holder, _, token, actor = history(store, lease_name)[-1]
    assert (kind, holder, token) == ("handover", "alice", lease.token)
    assert actor.startswith("manage.py leader handover (")
    event = LeaseEvent.objects.filter(name=lease_name, kind="handover").get()
    assert event.detail == "to bob: deploy"
