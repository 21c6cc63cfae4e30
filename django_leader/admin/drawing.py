"""The timeline picture: holding periods drawn as SVG.

Rendered on the server as plain SVG (no script, no external resources), so it works without
JavaScript and in a locked-down admin. Every value written into it is escaped.

The picture: a "leader" lane with every term in its holder's colour and what the time
without a term was (:func:`~django_leader.admin.periods.bands`: no leader, no history, not
read), one lane per holder below it, a time axis to the second, and a legend. Lane labels
fit their column: it grows with the longest label up to :data:`MAX_LABEL_WIDTH`, and a
longer holder id is cut with an ellipsis (its tooltip is the whole id).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import escape

from . import times
from .periods import NO_HISTORY, NO_LEADER, NOT_READ, Band, Period, bands, format_duration

#: The picture's geometry, in SVG user units (the picture scales to its box).
WIDTH = 960
MIN_LABEL_WIDTH = 110
MAX_LABEL_WIDTH = 280
LABEL_PAD = 8
RIGHT_PAD = 24
LANE_HEIGHT = 18
LANE_GAP = 7
TOP = 8
AXIS_HEIGHT = 36
LEGEND_ROW = 20
FONT_SIZE = 12
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
NO_HISTORY_COLOR = "#9a9a9a"
CURRENT_SUFFIX = " (leads now)"

#: What each kind of band is called, in the legend and in its tooltip.
BAND_LABELS = {
    NO_LEADER: "no leader",
    NO_HISTORY: "no history",
    NOT_READ: "history not read",
}

_TICK_STEPS = (
    [
        timedelta(seconds=s)
        for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
    ]
    + [timedelta(hours=12)]
    + [timedelta(days=d) for d in (1, 2, 7, 14, 28, 91, 182, 364)]
)

#: Advance widths of DejaVu Sans (the widest usual sans-serif, Debian's default), in ems,
#: for estimating a label's width on the server; other characters count as :data:`_WIDE`.
_EM = {
    **dict.fromkeys("0123456789", 0.64),
    **dict.fromkeys("abdeghnopqu", 0.64),
    **dict.fromkeys("ckvxyz", 0.6),
    **dict.fromkeys("ijl.,:;'|!", 0.28),
    **dict.fromkeys(" ", 0.32),
    **dict.fromkeys("frt-()[]/", 0.42),
    "s": 0.53,
    "m": 0.98,
    "w": 0.82,
    "_": 0.5,
    "…": 1.0,
}
_WIDE = 0.8
_BOLD = 1.12


def text_width(text: str, *, bold: bool = False, size: float = FONT_SIZE) -> float:
    """An upper estimate of ``text``'s width in user units, in DejaVu Sans at ``size``."""
    ems = sum(_EM.get(char, _WIDE) for char in text)
    return ems * size * (_BOLD if bold else 1.0)


def fit(text: str, width: float, *, bold: bool = False, suffix: str = "") -> str:
    """``text`` + ``suffix``, with ``text`` cut short ("…") so the whole fits ``width``."""
    width += 1e-6  # a width computed from the text's own, through other sums, still fits
    if text_width(text + suffix, bold=bold) <= width:
        return text + suffix
    cut = len(text)
    while cut > 1 and text_width(text[:cut] + "…" + suffix, bold=bold) > width:
        cut -= 1
    return text[:cut] + "…" + suffix


def render_svg(
    periods: Sequence[Period],
    *,
    start: datetime,
    now: datetime,
    current_holder: str = "",
    history_from: datetime | None = None,
    read_from: datetime | None = None,
    title: str = "",
) -> str:
    """An SVG picture of ``periods`` between ``start`` and ``now`` (escaped; safe to embed).

    One lane per holder (the most recent first, at most :data:`MAX_LANES`; the rest share
    one lane), above them a "leader" lane with every term and the time without one:
    hatched red where nobody led, grey before ``history_from`` (the lease's first recorded
    event; None: the first period's start) where the history says nothing, hatched grey
    before ``read_from`` where the history was not read. A legend explains each.
    """
    if history_from is None and periods:
        history_from = min(p.start for p in periods)
    visible = [p for p in periods if (p.end is None or p.end > start) and p.start < now]
    lanes = _lanes(visible, current_holder)
    colors = {holder: PALETTE[i % len(PALETTE)] for i, holder in enumerate(lanes)}
    others = any(p.holder not in colors for p in visible)
    lane_names = [*lanes, *(["…"] if others else [])]

    labels = {"": ("leader", "leader", True)}  # lane -> (shown, full, bold)
    wanted = [text_width("leader", bold=True)]
    for name in lane_names:
        full = name if name != "…" else "other holders"
        current = bool(current_holder) and name == current_holder
        suffix = CURRENT_SUFFIX if current else ""
        wanted.append(text_width(full + suffix, bold=current))
        labels[name] = (full + suffix, full, current)
    label_width = min(max(max(wanted) + 2 * LABEL_PAD, MIN_LABEL_WIDTH), MAX_LABEL_WIDTH)
    room = label_width - 2 * LABEL_PAD
    for name, (_shown, full, bold) in list(labels.items()):
        suffix = CURRENT_SUFFIX if bold and name else ""
        labels[name] = (fit(full, room, bold=bold, suffix=suffix), full, bold)

    span = max((now - start).total_seconds(), 1.0)
    plot_x = label_width
    plot_w = WIDTH - label_width - RIGHT_PAD

    def x(at: datetime) -> float:
        seconds = (min(max(at, start), now) - start).total_seconds()
        return plot_x + seconds / span * plot_w

    lane_y = {name: TOP + (i + 1) * (LANE_HEIGHT + LANE_GAP) for i, name in enumerate(lane_names)}
    axis_y = TOP + (len(lane_names) + 1) * (LANE_HEIGHT + LANE_GAP)
    empty = bands(visible, start, now, history_from=history_from, read_from=read_from)
    legend, legend_rows = _legend(axis_y + AXIS_HEIGHT + 14, {band.kind for band in empty})
    height = axis_y + AXIS_HEIGHT + legend_rows * LEGEND_ROW + 6

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="leader-timeline" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" font-family="system-ui, -apple-system, sans-serif" '
        f'font-size="{FONT_SIZE}" data-start="{start.isoformat()}" '
        f'data-now="{now.isoformat()}" data-plot-x="{plot_x:.1f}" data-width="{WIDTH}">',
        f"<title>{escape(title)}</title>",
        "<defs>"
        '<pattern id="leader-timeline-gap" patternUnits="userSpaceOnUse" width="6" height="6" '
        'patternTransform="rotate(45)">'
        f'<rect width="3" height="6" fill="{GAP_COLOR}" fill-opacity="0.55"/></pattern>'
        '<pattern id="leader-timeline-not-read" patternUnits="userSpaceOnUse" width="6" '
        'height="6" patternTransform="rotate(45)">'
        '<rect width="2" height="6" fill="#999" fill-opacity="0.45"/></pattern>'
        "</defs>",
    ]
    out += _grid(start, now, x, TOP + LANE_HEIGHT + LANE_GAP - 4, axis_y)

    leader_y = TOP
    for name, (shown, full, bold) in labels.items():
        y = leader_y if name == "" else lane_y[name]
        css = "lane-label" if name == "" else ("holder current" if bold else "holder")
        out.append(_label(shown, full, y, label_width, bold=bold, css=css))

    for band in empty:
        out.append(_band(band, x, leader_y))

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
    out += _axis(start, now, x, axis_y, plot_x)
    out += legend
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


def _period_title(period: Period, now: datetime) -> str:
    end = period.end or now
    text = (
        f"{period.holder}, token {period.token}: {times.plain(period.start)} to "
        + ("now (leading)" if period.end is None else times.plain(end))
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


def _fill(kind: str) -> str:
    if kind == NO_HISTORY:
        return f'fill="{NO_HISTORY_COLOR}" fill-opacity="0.18"'
    return f'fill="url(#leader-timeline-{kind})"'


def _band(band: Band, x: Any, y: float) -> str:
    what = BAND_LABELS[band.kind]
    duration = format_duration((band.end - band.start).total_seconds())
    if band.kind == NO_HISTORY:
        what += " (before the first recorded event)"
    tip = f"{what}: {times.plain(band.start)} to {times.plain(band.end)} ({duration})"
    x0, x1 = x(band.start), x(band.end)
    return (
        f'<g class="{band.kind}"><title>{escape(tip)}</title>'
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1.0):.1f}" '
        f'height="{LANE_HEIGHT}" {_fill(band.kind)}/></g>'
    )


def _label(shown: str, full: str, y: float, width: float, *, bold: bool, css: str) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text class="{css}" x="{width - LABEL_PAD:.1f}" y="{y + LANE_HEIGHT - 5:.1f}" '
        f'text-anchor="end" fill="currentColor"{weight}><title>{escape(full)}</title>'
        f"{escape(shown)}</text>"
    )


def _ticks(start: datetime, now: datetime) -> tuple[list[datetime], timedelta]:
    span = now - start
    step = next((s for s in _TICK_STEPS if span / s <= 8), _TICK_STEPS[-1])
    local = timezone.localtime(start)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    seconds = int(step.total_seconds())
    if step < timedelta(days=1):
        since_midnight = local.hour * 3600 + local.minute * 60 + local.second
        first = midnight + timedelta(seconds=(since_midnight // seconds + 1) * seconds)
    else:
        first = midnight + timedelta(days=1)
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


def _tick_label(tick: datetime, step: timedelta) -> str:
    local = timezone.localtime(tick)
    if step < timedelta(minutes=1):
        return local.strftime("%H:%M:%S")
    if step >= timedelta(days=28):
        return local.strftime("%d %b %Y")
    if step >= timedelta(days=1) or (local.hour == 0 and local.minute == 0):
        return local.strftime("%a %d %b")
    return local.strftime("%H:%M")


def _axis(start: datetime, now: datetime, x: Any, y: float, plot_x: float) -> list[str]:
    ticks, step = _ticks(start, now)
    out = [
        f'<line x1="{plot_x:.1f}" y1="{y}" x2="{WIDTH - RIGHT_PAD}" y2="{y}" '
        'stroke="currentColor" stroke-opacity="0.5"/>'
    ]
    for tick in ticks:
        out.append(
            f'<line x1="{x(tick):.1f}" y1="{y}" x2="{x(tick):.1f}" y2="{y + 4}" '
            'stroke="currentColor" stroke-opacity="0.5"/>'
            f'<text class="tick" x="{x(tick):.1f}" y="{y + 17}" text-anchor="middle" '
            f'fill="currentColor" fill-opacity="0.75">{escape(_tick_label(tick, step))}</text>'
        )
    out.append(
        f'<text class="range" x="{WIDTH - RIGHT_PAD}" y="{y + 32}" text-anchor="end" '
        f'fill="currentColor" fill-opacity="0.75">{escape(times.plain(start))} to now, '
        f"{escape(times.plain(now))}</text>"
    )
    return out


def _legend(y: float, shown: set[str]) -> tuple[list[str], int]:
    """The legend's items from the left, wrapped into rows; and how many rows."""
    items = [
        ("term", f'fill="{PALETTE[0]}"', "a term, in its holder's colour"),
        (NO_LEADER, _fill(NO_LEADER), "no leader"),
        (NO_HISTORY, _fill(NO_HISTORY), "no history (before the first recorded event)"),
        (
            "uncertain",
            f'fill="{PALETTE[0]}" fill-opacity="0.25" stroke="{PALETTE[0]}" stroke-dasharray="3 3"',
            "expired unreleased, end unknown",
        ),
    ]
    if NOT_READ in shown:
        items.append((NOT_READ, _fill(NOT_READ), "history not read (too many events)"))
    out = ['<g class="legend">']
    left, row = float(LABEL_PAD), 0
    for key, fill, text in items:
        width = 24 + text_width(text) + 22
        if left + width > WIDTH - RIGHT_PAD and left > LABEL_PAD:
            left, row = float(LABEL_PAD), row + 1
        top = y + row * LEGEND_ROW
        out.append(
            f'<g class="legend-item" data-key="{key}">'
            f'<rect x="{left:.1f}" y="{top - 10}" width="18" height="12" {fill} '
            'stroke-opacity="0.6"/>'
            f'<text x="{left + 24:.1f}" y="{top}" fill="currentColor" fill-opacity="0.8">'
            f"{escape(text)}</text></g>"
        )
        left += width
    out.append("</g>")
    return out, row + 1
