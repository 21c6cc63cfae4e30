"""The timeline picture (``django_leader.admin.drawing``) as a function: what a newcomer
could not read in it before — red before the lease existed, a clipped holder label, no
legend, ticks to the minute — checked on the SVG text."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from django_leader.admin import drawing
from django_leader.admin.periods import Period

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
LONG = "celery@report-worker-7f9c8d6b5-x2x9q.prod.eu-west-1.example.internal:48213"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def labels(svg: str) -> dict[str, str]:
    """Each lane label's full text (its tooltip) -> the text shown."""
    found = re.findall(
        r'<text class="(?:holder[^"]*|lane-label)"[^>]*><title>([^<]*)</title>([^<]*)<', svg
    )
    return dict(found)


def number(pattern: str, svg: str) -> float:
    found = re.search(pattern, svg)
    assert found is not None, pattern
    return float(found.group(1))


def test_a_new_lease_is_no_history_then_its_holder_never_no_leader() -> None:
    svg = drawing.render_svg(
        [Period("alice", 1, at(0), None)],
        start=at(-60),
        now=at(1),
        current_holder="alice",
        history_from=at(0),
    )
    assert 'class="gap"' not in svg
    assert svg.count('class="no-history"') == 1
    assert "no history (before the first recorded event): 2026-01-01 11:00:00 UTC" in svg


def test_the_legend_names_every_kind_of_bar() -> None:
    svg = drawing.render_svg([Period("alice", 1, at(0), at(5))], start=at(-5), now=at(10))
    legend = svg[svg.index('<g class="legend">') :]
    keys = re.findall(r'class="legend-item" data-key="([^"]+)"', legend)
    assert keys == ["term", "gap", "no-history", "uncertain"]
    for text in ("a term, in its holder", "no leader", "no history", "end unknown"):
        assert text in legend
    # "history not read" only when part of the history was not read.
    assert "not read" not in legend
    truncated = drawing.render_svg(
        [Period("alice", 1, at(4), None)],
        start=at(0),
        now=at(10),
        history_from=at(1),
        read_from=at(3),
    )
    assert 'data-key="not-read"' in truncated and 'class="not-read"' in truncated


def test_a_long_holder_label_is_cut_to_fit_with_the_whole_id_as_its_tooltip() -> None:
    terms = [Period("bob", 1, at(0), at(5), "released"), Period(LONG, 2, at(6), None)]
    svg = drawing.render_svg(terms, start=at(0), now=at(10), current_holder=LONG)
    shown = labels(svg)
    assert shown["bob"] == "bob"
    current = shown[LONG]
    assert current.endswith("… (leads now)") and current.startswith("celery@report-")
    plot_x = number(r'data-plot-x="([\d.]+)"', svg)
    assert plot_x <= drawing.MAX_LABEL_WIDTH
    room = plot_x - 2 * drawing.LABEL_PAD
    assert drawing.text_width(current, bold=True) <= room
    # The label's right end is LABEL_PAD left of the plot, its left end inside the picture.
    x = number(r'class="holder current" x="([\d.]+)"', svg)
    assert x == plot_x - drawing.LABEL_PAD
    assert x - drawing.text_width(current, bold=True) >= drawing.LABEL_PAD


def test_short_labels_leave_the_plot_its_room() -> None:
    svg = drawing.render_svg([Period("a", 1, at(0), None)], start=at(0), now=at(10))
    plot_x = number(r'data-plot-x="([\d.]+)"', svg)
    assert plot_x == drawing.MIN_LABEL_WIDTH


def test_a_label_that_fits_is_never_cut() -> None:
    # The column is as wide as the widest label: that one is shown whole.
    for holder in ("alice", "worker-b:5123", "web-7:1234:abcdef"):
        svg = drawing.render_svg(
            [Period(holder, 1, at(0), None)], start=at(0), now=at(10), current_holder=holder
        )
        assert labels(svg)[holder] == f"{holder} (leads now)"


def test_fit_cuts_only_what_does_not_fit() -> None:
    assert drawing.fit("worker-a:4711", 200) == "worker-a:4711"
    cut = drawing.fit(LONG, 150, suffix=" (leads now)", bold=True)
    assert cut.endswith("… (leads now)")
    assert drawing.text_width(cut, bold=True) <= 150


def test_a_range_of_minutes_has_ticks_to_the_second() -> None:
    svg = drawing.render_svg([Period("a", 1, at(0), None)], start=at(0), now=at(0.5))
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)<', svg)
    assert ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", tick) for tick in ticks), ticks
    assert "2026-01-01 12:00:00 UTC to now, 2026-01-01 12:00:30 UTC" in svg


def test_a_history_of_months_is_labelled_by_date() -> None:
    svg = drawing.render_svg([Period("a", 1, at(0), None)], start=at(0), now=at(60 * 24 * 200))
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)<', svg)
    assert 1 <= len(ticks) <= 8 and all(re.fullmatch(r"\d\d \w{3} \d{4}", t) for t in ticks)
