"""The timeline's period logic as plain functions: history events -> who led when, the
gaps without a leader, the time before the history begins, and the range fitted to a
history. No database, no templates (``django_leader.admin.periods``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django_leader.admin.periods import (
    ENDS,
    FITTED_MARGIN,
    FITTED_MIN_SPAN,
    MARKS,
    NO_HISTORY,
    NO_LEADER,
    NOT_READ,
    STARTS,
    Band,
    Change,
    Current,
    Period,
    bands,
    fitted_start,
    format_duration,
    gaps,
    holding_periods,
    utc,
)
from django_leader.lease import EventKind

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
TTL = timedelta(minutes=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_every_event_kind_starts_or_ends_a_term() -> None:
    assert {kind.value for kind in EventKind} == STARTS | ENDS | MARKS
    assert not STARTS & ENDS and not (STARTS | ENDS) & MARKS
    # Plain strings, as the history rows hold them.
    assert "acquired" in STARTS and "forced_release" in ENDS


def test_an_acquisition_without_release_ends_the_previous_term() -> None:
    changes = [
        Change("acquired", "alice", 1, at(0)),
        Change("taken_over", "bob", 2, at(5)),
        Change("released", "bob", 2, at(8)),
    ]
    terms = holding_periods(changes, now=at(10))
    assert [(p.holder, p.start, p.end, p.ended_by) for p in terms] == [
        ("alice", at(0), at(5), "taken_over"),
        ("bob", at(5), at(8), "released"),
    ]


def test_an_end_with_no_term_open_or_of_another_token_changes_nothing() -> None:
    changes = [
        Change("lost", "zoe", 7, at(0)),  # its start is before the history we read
        Change("acquired", "alice", 8, at(1)),
        Change("released", "zoe", 7, at(2)),
    ]
    (term,) = holding_periods(changes, now=at(10), current=Current("alice", 8, at(11)))
    assert (term.holder, term.start, term.end) == ("alice", at(1), None)


def test_an_end_recorded_before_its_start_makes_an_empty_term() -> None:
    # Clocks of different writers: the end is never drawn before the start.
    changes = [Change("acquired", "alice", 1, at(5)), Change("released", "alice", 1, at(4))]
    (term,) = holding_periods(changes, now=at(10))
    assert (term.start, term.end) == (at(5), at(5))


def test_the_store_holding_another_token_ends_the_term_as_expired_for_certain() -> None:
    # The store knows the token's expiry (the database row) though another holder now has it.
    changes = [Change("acquired", "alice", 3, at(0))]
    (term,) = holding_periods(changes, now=at(10), current=Current("bob", 3, at(4)))
    assert (term.end, term.ended_by, term.uncertain) == (at(4), "expired", False)


def test_a_known_expiry_after_now_ends_the_term_at_now() -> None:
    changes = [Change("acquired", "alice", 3, at(0))]
    (term,) = holding_periods(changes, now=at(10), current=Current("", 3, at(12)))
    assert (term.end, term.ended_by, term.uncertain) == (at(10), "expired", False)


def test_the_same_holder_with_an_unknown_token_still_leads() -> None:
    changes = [Change("acquired", "alice", 3, at(0))]
    (term,) = holding_periods(changes, now=at(10), current=Current("alice", None, None))
    assert term.end is None


def test_an_unknown_store_state_makes_the_last_term_uncertain() -> None:
    changes = [Change("acquired", "alice", 3, at(0))]
    (term,) = holding_periods(changes, now=at(10), current=None, min_term=TTL)
    assert (term.end, term.ended_by, term.uncertain) == (at(1), "expired", True)
    # Never past now, however long the TTL.
    (young,) = holding_periods(changes, now=at(0.5), current=None, min_term=TTL)
    assert young.end == at(0.5)


def test_gaps_merge_overlapping_terms_and_clip_to_the_window() -> None:
    terms = [
        Period("alice", 1, at(-5), at(2), "released"),  # began before the window
        Period("bob", 2, at(4), at(8), "taken_over"),
        Period("carol", 3, at(6), at(9), "released"),  # overlaps bob's
    ]
    assert gaps(terms, at(0), at(12)) == [(at(2), at(4)), (at(9), at(12))]


def test_gaps_of_an_empty_history_and_of_open_or_uncertain_terms() -> None:
    assert gaps([], at(0), at(10)) == [(at(0), at(10))]
    running = Period("alice", 1, at(3), None)
    assert gaps([running], at(0), at(10)) == [(at(0), at(3))]
    uncertain = Period("alice", 1, at(3), at(4), "expired", uncertain=True)
    assert gaps([uncertain], at(0), at(10)) == [(at(0), at(3))]


def test_utc_reads_naive_times_as_utc_and_converts_aware_ones() -> None:
    naive = datetime(2026, 1, 1, 12, 0)
    assert utc(naive) == T0 and utc(naive).tzinfo is timezone.utc
    paris = datetime(2026, 1, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))
    assert utc(paris) == T0 and utc(paris).tzinfo is timezone.utc


def test_format_duration_edges() -> None:
    assert format_duration(-3) == "0.0 s"
    assert format_duration(120) == "2 min 0 s"
    assert format_duration(7200) == "2 h"
    assert format_duration(48 * 3600) == "2 d"


# -- the range fitted to a history, and what the leader lane shows without a term ----------


def test_the_fitted_range_begins_just_before_the_first_event() -> None:
    start = fitted_start(at(0), at(60))
    assert start == at(-3)  # a margin of 5 % of the hour before the first event
    assert at(-5) < start < at(0)


def test_the_fitted_range_of_a_new_lease_spans_at_least_the_minimum() -> None:
    now = at(0) + timedelta(seconds=2)
    start = fitted_start(at(0), now)
    assert now - start == FITTED_MIN_SPAN * (1 + FITTED_MARGIN)
    assert fitted_start(None, now) == start  # no history at all: the minimum too


def test_before_the_first_event_is_no_history_not_no_leader() -> None:
    # A new lease, held since its first event: nothing red before it.
    terms = [Period("alice", 1, at(0), None)]
    assert bands(terms, at(-60), at(10), history_from=at(0)) == [Band(NO_HISTORY, at(-60), at(0))]
    # A release, then a gap until the next holder: that gap is "no leader".
    terms = [Period("alice", 1, at(0), at(5), "released"), Period("bob", 2, at(8), None)]
    assert bands(terms, at(-60), at(10), history_from=at(0)) == [
        Band(NO_HISTORY, at(-60), at(0)),
        Band(NO_LEADER, at(5), at(8)),
    ]


def test_a_history_that_begins_before_the_range_has_no_no_history_band() -> None:
    terms = [Period("alice", 1, at(-90), at(5), "released")]
    assert bands(terms, at(-60), at(10), history_from=at(-90)) == [Band(NO_LEADER, at(5), at(10))]


def test_a_lease_without_history_is_all_no_history() -> None:
    assert bands([], at(0), at(10), history_from=None) == [Band(NO_HISTORY, at(0), at(10))]


def test_history_not_read_comes_between_no_history_and_the_terms_read() -> None:
    terms = [Period("alice", 7, at(4), None)]
    assert bands(terms, at(0), at(10), history_from=at(1), read_from=at(3)) == [
        Band(NO_HISTORY, at(0), at(1)),
        Band(NOT_READ, at(1), at(3)),
        Band(NO_LEADER, at(3), at(4)),
    ]
