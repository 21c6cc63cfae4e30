"""``manage.py leader``: status, history, release, prune (in-process, every store)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import timedelta
from typing import Any

from django.core.management import call_command
from django.utils import timezone

from django_leader.backends import get_backend
from django_leader.election import Candidate
from django_leader.models import LeaseEvent
from tests.support.stores import ROOT, child_env, history, stores_db

pytestmark = stores_db


def run(backend: Any, *args: str) -> subprocess.CompletedProcess[str]:
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
        "known",
    }
    assert data["candidates"] == [] and data["known"] is True


def test_status_lists_candidates_waiting(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "alice", 30)
    for identity in ("alice", "bob", "carol"):  # the holder is not one waiting
        backend.announce(lease_name, Candidate(identity), 30)
    data = json.loads(run(backend, "status", lease_name, "--json").stdout)
    assert data["candidates"] == ["bob", "carol"]
    result = run(backend, "status", lease_name)
    assert result.returncode == 0, result.stderr
    assert "candidates waiting: bob, carol" in result.stdout


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
    backend.acquire(lease_name, "alice", 30)
    result = run(backend, "status", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows[lease_name]["holder"] == "alice"


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
