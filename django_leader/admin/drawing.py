"""The timeline picture: holding periods drawn as SVG.

Rendered on the server as plain SVG (no script, no external resources), so it works without
JavaScript and in a locked-down admin. Every value written into it is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import escape

from .periods import Period, format_duration, gaps

#: The picture's geometry, in SVG user units (the picture scales to its box).
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
    for gap_start, gap_end in gaps(visible, known_start, now):
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
