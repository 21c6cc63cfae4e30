"""Who held a lease when: holding periods built from the history. Pure logic, no Django.

How the history becomes periods (:func:`holding_periods`): an ``acquired`` or ``taken_over``
event starts a holding period; ``released``, ``lost`` and ``forced_release`` of the same
fencing token end it, and so does the next acquisition. A period still open at the end is
either the current term (the store says that holder still holds that token) or a lease that
expired unreleased: it ends at the lease's ``expires_at`` when the store still knows it (the
database backend keeps the row), else at an unknown time after its last possible expiry.
Time not covered by any period is time without a leader (:func:`gaps`), except before the
lease's first recorded event: there the history says nothing, and the picture says so
(:func:`bands`: "no history", not "no leader"). The default range of the picture fits the
history (:func:`fitted_start`).

The admin reads the history (:mod:`django_leader.admin.timeline`) and draws the periods
(:mod:`django_leader.admin.drawing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from ..lease import EventKind

#: Event kinds that start a holding period.
STARTS = frozenset({EventKind.ACQUIRED.value, EventKind.TAKEN_OVER.value})
#: Event kinds that end the holding period of the same fencing token.
ENDS = frozenset({EventKind.RELEASED.value, EventKind.LOST.value, EventKind.FORCED_RELEASE.value})
#: Event kinds that neither start nor end a holding period (a hand-over request: the
#: release that follows ends the term).
MARKS = frozenset({EventKind.HANDOVER.value})

#: What the leader lane shows where no term is (:class:`Band`): nobody led; the history
#: does not reach back that far; the history is there but was not read (too many events).
NO_LEADER, NO_HISTORY, NOT_READ = "gap", "no-history", "not-read"
#: A range fitted to a history spans at least this long, and starts this fraction of its
#: length before the first event, so the first term does not begin on the picture's edge.
FITTED_MIN_SPAN = timedelta(seconds=10)
FITTED_MARGIN = 0.05


@dataclass(frozen=True)
class Change:
    """One history row, as much of it as the timeline needs."""

    kind: str
    holder: str
    token: int
    at: datetime


@dataclass(frozen=True)
class Current:
    """What the store says about the lease now.

    ``holder`` is ``""`` when nobody holds it. ``token`` and ``expires_at`` are None when
    the store does not know them (the Redis store forgets an expired lease entirely).
    """

    holder: str
    token: int | None
    expires_at: datetime | None


@dataclass(frozen=True)
class Period:
    """One term of one holder.

    ``end`` is None while the term goes on. ``uncertain`` marks a term that expired at an
    unknown time: it certainly lasted until ``end`` and may have lasted until now.
    """

    holder: str
    token: int
    start: datetime
    end: datetime | None
    ended_by: str = ""
    uncertain: bool = False


def holding_periods(
    changes: Iterable[Change],
    *,
    now: datetime,
    current: Current | None = None,
    min_term: timedelta = timedelta(0),
) -> list[Period]:
    """The holding periods told by ``changes`` (oldest first), ending with the store's view.

    ``current`` is the store's state now (None: unknown). ``min_term`` is how long a lease
    lives at least once acquired (its TTL): an unreleased term whose expiry is unknown is
    drawn that long for certain.
    """
    periods: list[Period] = []
    open_: Period | None = None
    for change in changes:
        if change.kind in STARTS:
            if open_ is not None:
                periods.append(_close(open_, change.at, change.kind))
            open_ = Period(change.holder, change.token, change.at, None)
        elif change.kind in ENDS and open_ is not None and change.token == open_.token:
            periods.append(_close(open_, change.at, change.kind))
            open_ = None
        # An end of another token (a late "lost" after a takeover) changes nothing.
    if open_ is not None:
        periods.append(_finish(open_, now, current, min_term))
    return periods


def _close(period: Period, at: datetime, ended_by: str) -> Period:
    return Period(period.holder, period.token, period.start, max(at, period.start), ended_by)


def _finish(period: Period, now: datetime, current: Current | None, min_term: timedelta) -> Period:
    if current is not None and current.token == period.token:
        if (
            current.holder == period.holder
            and current.expires_at is not None
            and current.expires_at > now
        ):
            return period  # the current term
        if current.expires_at is not None:
            return _close(period, min(current.expires_at, now), "expired")
    if current is not None and current.holder == period.holder and current.token is None:
        return period  # held, token unknown: trust the store's holder
    # Expired (or replaced) without a record: it lasted at least one TTL, maybe until now.
    end = min(period.start + min_term, now)
    return Period(period.holder, period.token, period.start, end, "expired", uncertain=True)


def gaps(
    periods: Sequence[Period], start: datetime, now: datetime
) -> list[tuple[datetime, datetime]]:
    """Stretches of [start, now] that no period covers; an uncertain tail is not a gap."""
    covered = sorted(
        (max(p.start, start), now if p.end is None or p.uncertain else min(p.end, now))
        for p in periods
    )
    gaps: list[tuple[datetime, datetime]] = []
    cursor = start
    for begin, end in covered:
        if begin > cursor:
            gaps.append((cursor, begin))
        cursor = max(cursor, end)
    if cursor < now:
        gaps.append((cursor, now))
    return [(a, b) for a, b in gaps if b > a]


@dataclass(frozen=True)
class Band:
    """A stretch of the leader lane without a term: ``kind`` is :data:`NO_LEADER`,
    :data:`NO_HISTORY` or :data:`NOT_READ`."""

    kind: str
    start: datetime
    end: datetime


def fitted_start(first_event: datetime | None, now: datetime) -> datetime:
    """The start of a range that fits a history whose first event is ``first_event``.

    The range ends at ``now`` and begins a margin (:data:`FITTED_MARGIN` of its length)
    before the first event; it spans at least :data:`FITTED_MIN_SPAN`. Without any event it
    is just that minimum.
    """
    span = now - first_event if first_event is not None else timedelta(0)
    span = max(span, FITTED_MIN_SPAN)
    return now - span * (1 + FITTED_MARGIN)


def bands(
    periods: Sequence[Period],
    start: datetime,
    now: datetime,
    *,
    history_from: datetime | None,
    read_from: datetime | None = None,
) -> list[Band]:
    """The stretches of [start, now] the leader lane shows without a term, oldest first.

    ``history_from`` is the lease's first recorded event (None: it has none): before it the
    history says nothing, :data:`NO_HISTORY`, whatever the store does now. ``read_from`` is
    the oldest event read when the reader stopped at its limit: from the first event to
    there the history exists but was not read, :data:`NOT_READ`. The rest of the time that
    no period covers is :data:`NO_LEADER` (:func:`gaps`).
    """
    out: list[Band] = []
    known = start
    if history_from is None or history_from >= now:
        return [Band(NO_HISTORY, start, now)] if now > start else []
    if history_from > known:
        out.append(Band(NO_HISTORY, known, history_from))
        known = history_from
    if read_from is not None and read_from > known:
        out.append(Band(NOT_READ, known, min(read_from, now)))
        known = min(read_from, now)
    out += [Band(NO_LEADER, a, b) for a, b in gaps(periods, known, now)]
    return out


def utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive values are UTC, as the stores write them)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt_timezone.utc)
    return value.astimezone(dt_timezone.utc)


def format_duration(seconds: float) -> str:
    """A short human duration: ``45 s``, ``4 min 59 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 10:
        return f"{minutes} min {int(seconds % 60)} s"
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
