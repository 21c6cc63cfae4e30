"""Who held a lease when: holding periods built from the history, drawn as an SVG picture.

The admin shows this on each lease's page. It is rendered on the server as plain SVG (no
script, no external resources), so it works without JavaScript and in a locked-down admin.

How the history becomes periods (:func:`holding_periods`): an ``acquired`` or ``taken_over``
event starts a holding period; ``released``, ``lost`` and ``forced_release`` of the same
fencing token end it, and so does the next acquisition. A period still open at the end is
either the current term (the store says that holder still holds that token) or a lease that
expired unreleased: it ends at the lease's ``expires_at`` when the store still knows it (the
database backend keeps the row), else at an unknown time after its last possible expiry.
Time not covered by any period is time without a leader, and the picture shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.utils import timezone
from django.utils.html import escape

#: Event kinds that start a holding period.
STARTS = frozenset({"acquired", "taken_over"})
#: Event kinds that end the holding period of the same fencing token.
ENDS = frozenset({"released", "lost", "forced_release"})

#: The ranges the admin offers: name -> (label, length).
RANGES: dict[str, tuple[str, timedelta]] = {
    "hour": ("last hour", timedelta(hours=1)),
    "day": ("last day", timedelta(days=1)),
    "week": ("last week", timedelta(weeks=1)),
}


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


# -- drawing ------------------------------------------------------------------------------

WIDTH = 960
LABEL_WIDTH = 200
RIGHT_PAD = 24
LANE_HEIGHT = 18
LANE_GAP = 7
TOP = 8
AXIS_HEIGHT = 34
LEGEND_HEIGHT = 22
MAX_LANES = 10
PALETTE = (
    "#417690",
    "#e07b39",
    "#5a9e4b",
    "#8e6bbf",
    "#c9a227",
    "#2b9fb3",
    "#c4577a",
    "#6d7f3a",
    "#b0622b",
    "#4f6fcf",
)
OTHERS_COLOR = "#8a8a8a"
GAP_COLOR = "#d9534f"

_TICK_STEPS = [
    timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880)
]


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


def render_svg(
    periods: Sequence[Period],
    *,
    start: datetime,
    now: datetime,
    current_holder: str = "",
    known_from: datetime | None = None,
    title: str = "",
) -> str:
    """An SVG picture of ``periods`` between ``start`` and ``now`` (escaped; safe to embed).

    One lane per holder (the most recent first, at most :data:`MAX_LANES`; the rest share
    one lane), above them a "leader" lane with every term and, hatched red, the gaps without
    a leader. Before ``known_from`` the history is incomplete: drawn grey, not as a gap.
    """
    span = max((now - start).total_seconds(), 1.0)
    plot_x = LABEL_WIDTH
    plot_w = WIDTH - LABEL_WIDTH - RIGHT_PAD

    def x(at: datetime) -> float:
        seconds = (min(max(at, start), now) - start).total_seconds()
        return plot_x + seconds / span * plot_w

    visible = [p for p in periods if (p.end is None or p.end > start) and p.start < now]
    lanes = _lanes(visible, current_holder)
    colors = {holder: PALETTE[i % len(PALETTE)] for i, holder in enumerate(lanes)}
    others = any(p.holder not in colors for p in visible)
    lane_names = [*lanes, *(["…"] if others else [])]
    lane_y = {name: TOP + (i + 1) * (LANE_HEIGHT + LANE_GAP) for i, name in enumerate(lane_names)}
    axis_y = TOP + (len(lane_names) + 1) * (LANE_HEIGHT + LANE_GAP)
    height = axis_y + AXIS_HEIGHT + LEGEND_HEIGHT

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="leader-timeline" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" font-family="system-ui, -apple-system, sans-serif" '
        f'font-size="12" data-start="{start.isoformat()}" data-now="{now.isoformat()}">',
        f"<title>{escape(title)}</title>",
        "<defs>"
        '<pattern id="leader-timeline-gap" patternUnits="userSpaceOnUse" width="6" height="6" '
        'patternTransform="rotate(45)">'
        f'<rect width="3" height="6" fill="{GAP_COLOR}" fill-opacity="0.55"/></pattern>'
        '<pattern id="leader-timeline-unknown" patternUnits="userSpaceOnUse" width="6" '
        'height="6" patternTransform="rotate(45)">'
        '<rect width="2" height="6" fill="#999" fill-opacity="0.45"/></pattern>'
        "</defs>",
    ]
    out += _grid(start, now, x, TOP + LANE_HEIGHT + LANE_GAP - 4, axis_y)

    # Lane labels.
    leader_y = TOP
    out.append(_label("leader", leader_y, bold=True, css="lane-label"))
    for name in lane_names:
        is_current = name == current_holder and bool(current_holder)
        label = name if name != "…" else "other holders"
        out.append(
            _label(
                label + (" (leads now)" if is_current else ""),
                lane_y[name],
                bold=is_current,
                css="holder current" if is_current else "holder",
                full=label,
            )
        )

    # Gaps without a leader, and stretches the history does not cover.
    known_start = max(start, known_from) if known_from else start
    if known_from and known_from > start:
        out.append(_band(x(start), x(known_start), leader_y, "unknown", "history not available"))
    for gap_start, gap_end in _gaps(visible, known_start, now):
        out.append(
            _band(
                x(gap_start),
                x(gap_end),
                leader_y,
                "gap",
                f"no leader: {_when(gap_start)} to {_when(gap_end)} "
                f"({format_duration((gap_end - gap_start).total_seconds())})",
            )
        )

    # Terms, once in the leader lane and once in their holder's lane.
    for period in visible:
        color = colors.get(period.holder, OTHERS_COLOR)
        lane = period.holder if period.holder in colors else "…"
        tip = _period_title(period, now)
        for y in (leader_y, lane_y[lane]):
            out.append(_period_rect(period, x, y, color, tip, now))

    out.append(
        f'<line class="now" x1="{plot_x + plot_w:.1f}" y1="{TOP - 2}" '
        f'x2="{plot_x + plot_w:.1f}" y2="{axis_y}" stroke="currentColor" stroke-width="1.5"/>'
    )
    out += _axis(start, now, x, axis_y)
    out += _legend(height - LEGEND_HEIGHT + 14)
    out.append("</svg>")
    return "".join(out)


def _lanes(periods: Sequence[Period], current_holder: str) -> list[str]:
    """Holders by their latest term, most recent first; the current holder always shown."""
    latest: dict[str, datetime] = {}
    for period in periods:
        latest[period.holder] = max(latest.get(period.holder, period.start), period.start)
    ordered = sorted(latest, key=lambda holder: latest[holder], reverse=True)
    if current_holder and current_holder in ordered:
        ordered.remove(current_holder)
        ordered.insert(0, current_holder)
    return ordered[: MAX_LANES - 1] if len(ordered) > MAX_LANES else ordered


def _gaps(
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


def _when(at: datetime) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S")


def _period_title(period: Period, now: datetime) -> str:
    end = period.end or now
    text = (
        f"{period.holder}, token {period.token}: {_when(period.start)} to "
        + ("now (leading)" if period.end is None else _when(end))
        + f" ({format_duration((end - period.start).total_seconds())})"
    )
    if period.uncertain:
        text += "; expired unreleased at an unknown time between then and now"
    elif period.ended_by:
        text += f"; ended: {period.ended_by.replace('_', ' ')}"
    return text


def _period_rect(period: Period, x: Any, y: float, color: str, tip: str, now: datetime) -> str:
    x0 = x(period.start)
    x1 = x(period.end or now)
    width = max(x1 - x0, 1.5)  # a short term stays visible
    rect = (
        f'<g class="period" data-holder="{escape(period.holder)}" data-token="{period.token}">'
        f"<title>{escape(tip)}</title>"
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{width:.1f}" height="{LANE_HEIGHT}" '
        f'rx="2" fill="{color}"/>'
    )
    if period.uncertain:
        x_now = x(now)
        if x_now > x1:
            rect += (
                f'<rect class="uncertain" x="{x1:.1f}" y="{y:.1f}" width="{x_now - x1:.1f}" '
                f'height="{LANE_HEIGHT}" fill="{color}" fill-opacity="0.25" '
                f'stroke="{color}" stroke-dasharray="3 3"/>'
            )
    return rect + "</g>"


def _band(x0: float, x1: float, y: float, css: str, tip: str) -> str:
    return (
        f'<g class="{css}"><title>{escape(tip)}</title>'
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1.0):.1f}" '
        f'height="{LANE_HEIGHT}" fill="url(#leader-timeline-{css})"/></g>'
    )


def _label(text: str, y: float, *, bold: bool, css: str, full: str | None = None) -> str:
    shown = text if len(text) <= 30 else text[:29] + "…"
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text class="{css}" x="{LABEL_WIDTH - 8}" y="{y + LANE_HEIGHT - 5:.1f}" '
        f'text-anchor="end" fill="currentColor"{weight}><title>{escape(full or text)}</title>'
        f"{escape(shown)}</text>"
    )


def _ticks(start: datetime, now: datetime) -> tuple[list[datetime], timedelta]:
    span = now - start
    step = next((s for s in _TICK_STEPS if span / s <= 8), _TICK_STEPS[-1])
    local = timezone.localtime(start)
    base = local.replace(hour=0, minute=0, second=0, microsecond=0)
    minutes = int(step.total_seconds() // 60)
    since_midnight = local.hour * 60 + local.minute
    if minutes < 1440:
        first = base + timedelta(minutes=(since_midnight // minutes + 1) * minutes)
    else:
        first = base + timedelta(days=1)
    ticks = []
    tick = first
    while tick < now:
        ticks.append(tick)
        tick = tick + step
    return ticks, step


def _grid(start: datetime, now: datetime, x: Any, top: float, bottom: float) -> list[str]:
    ticks, _ = _ticks(start, now)
    return [
        f'<line class="grid" x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{bottom}" '
        'stroke="currentColor" stroke-opacity="0.12"/>'
        for t in ticks
    ]


def _axis(start: datetime, now: datetime, x: Any, y: float) -> list[str]:
    ticks, step = _ticks(start, now)
    out = [
        f'<line x1="{LABEL_WIDTH}" y1="{y}" x2="{WIDTH - RIGHT_PAD}" y2="{y}" '
        'stroke="currentColor" stroke-opacity="0.5"/>'
    ]
    for tick in ticks:
        local = timezone.localtime(tick)
        daily = step >= timedelta(days=1) or (local.hour == 0 and local.minute == 0)
        label = local.strftime("%a %d %b") if daily else local.strftime("%H:%M")
        out.append(
            f'<line x1="{x(tick):.1f}" y1="{y}" x2="{x(tick):.1f}" y2="{y + 4}" '
            'stroke="currentColor" stroke-opacity="0.5"/>'
            f'<text x="{x(tick):.1f}" y="{y + 17}" text-anchor="middle" fill="currentColor" '
            f'fill-opacity="0.75">{escape(label)}</text>'
        )
    out.append(
        f'<text x="{WIDTH - RIGHT_PAD}" y="{y + 31}" text-anchor="end" fill="currentColor" '
        f'fill-opacity="0.75">now: {escape(_when(now))} '
        f"{escape(timezone.localtime(now).tzname() or '')}</text>"
    )
    return out


def _legend(y: float) -> list[str]:
    items = (
        ("url(#leader-timeline-gap)", "no leader"),
        ("url(#leader-timeline-unknown)", "history not available"),
    )
    out = []
    left = LABEL_WIDTH
    for fill, text in items:
        out.append(
            f'<rect x="{left}" y="{y - 10}" width="18" height="12" fill="{fill}" '
            'stroke="currentColor" stroke-opacity="0.3"/>'
            f'<text x="{left + 24}" y="{y}" fill="currentColor" fill-opacity="0.75">'
            f"{escape(text)}</text>"
        )
        left += 24 + 8 * len(text) + 24
    out.append(
        f'<text x="{left}" y="{y}" fill="currentColor" fill-opacity="0.75">'
        "dashed: expired unreleased, end unknown</text>"
    )
    return out


def utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive values are UTC, as the stores write them)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt_timezone.utc)
    return value.astimezone(dt_timezone.utc)
