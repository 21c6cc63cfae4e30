"""The dashboard's alerts as plain functions (``django_leader.admin.alerts``): when a lease
without a leader is alarming, and when a lease flaps."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django_leader.admin.alerts import FLAPPING, NO_LEADER, flapping, no_leader
from django_leader.admin.constants import FLAPPING_TRANSITIONS, FLAPPING_WINDOW
from django_leader.admin.periods import Change

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
GRACE = timedelta(seconds=17)  # LEASE_TTL 15 + RETRY_INTERVAL 2


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def alert(holder: str = "", waiting: int = 0, last: Change | None = None) -> str | None:
    found = no_leader(holder=holder, waiting=waiting, last=last, now=NOW, grace=GRACE)
    return None if found is None else f"{found.key}: {found.detail}"


def test_a_held_lease_never_has_the_no_leader_alert() -> None:
    assert alert("alice", waiting=3, last=Change("acquired", "alice", 1, ago(3600))) is None


def test_a_release_with_nobody_waiting_is_idle() -> None:
    assert alert(last=Change("released", "alice", 1, ago(3600))) is None


def test_a_release_with_candidates_waiting_past_the_grace() -> None:
    last = Change("released", "alice", 1, ago(180))
    assert (
        alert(waiting=2, last=last) == f"{NO_LEADER}: released 3 min 0 s ago; 2 candidates waiting"
    )
    # Within the grace a candidate is still taking it over.
    assert alert(waiting=2, last=Change("released", "alice", 1, ago(10))) is None


def test_a_term_that_did_not_end_with_a_release() -> None:
    expired = Change("acquired", "alice", 4, ago(120))
    assert alert(last=expired) == f"{NO_LEADER}: the term of alice (token 4) expired unreleased"
    taken = Change("taken_over", "bob", 5, ago(120))
    assert alert(last=taken) == f"{NO_LEADER}: the term of bob (token 5) expired unreleased"
    lost = Change("lost", "alice", 4, ago(60))
    assert alert(waiting=1, last=lost) == (
        f"{NO_LEADER}: lost by alice 60 s ago; 1 candidate waiting"
    )
    forced = Change("forced_release", "alice", 4, ago(300))
    assert alert(last=forced) == f"{NO_LEADER}: force-released 5 min 0 s ago"
    assert alert(last=Change("forced_release", "alice", 4, ago(5))) is None  # grace


def test_without_history_only_waiting_candidates_alert() -> None:
    assert alert() is None
    assert alert(waiting=1) == f"{NO_LEADER}: 1 candidate waiting; no history says since when"


def test_flapping_is_more_than_the_limit_within_the_window() -> None:
    window, limit = FLAPPING_WINDOW, FLAPPING_TRANSITIONS
    assert (window, limit) == (timedelta(minutes=10), 5)  # the documented defaults
    assert flapping(limit, window=window, limit=limit) is None
    found = flapping(limit + 1, window=window, limit=limit)
    assert found is not None and found.key == FLAPPING
    assert found.detail == "6 transitions in the last 10 min (more than 5)"
