"""The lease page's timeline: the history of one lease over a range, read for the picture.

The queries stay on the index (``name``, ``-at``, ``-id``): the newest events of the range,
and, when the range holds them all, the last acquisition before it with the end of that
term. :mod:`~django_leader.admin.periods` turns them into terms, and
:mod:`~django_leader.admin.drawing` draws those.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..conf import get_settings
from ..models import Lease, LeaseEvent
from . import drawing, periods
from .constants import LEADING, TIMELINE_EVENTS, UNKNOWN
from .store import Store


def timeline_svg(
    store: Store, row: Lease, state: str, now: datetime, start: datetime, label: str
) -> str:
    """The SVG picture of who held ``row`` between ``start`` and ``now`` (the store's clock).

    Reads at most :data:`TIMELINE_EVENTS` events of the window, newest first (beyond that,
    the oldest part of the window is drawn as "history not available"), plus the term
    already running when the window opens; the store's view of the lease (``row``, in
    ``state``) ends the last term.
    """
    events = LeaseEvent.objects.using(store.history_db).filter(name=row.name)
    fields = ("kind", "holder", "token", "at")
    window = list(
        events.filter(at__gte=start)
        .order_by("-at", "-id")
        .values_list(*fields)[: TIMELINE_EVENTS + 1]
    )
    known_from = None
    before: list[Any] = []
    if len(window) > TIMELINE_EVENTS:
        window = window[:TIMELINE_EVENTS]
        known_from = window[-1][3]
    else:
        # Who held the lease when the window opens: its last acquisition before, unless
        # that term ended before the window too.
        first = (
            events.filter(at__lt=start, kind__in=periods.STARTS)
            .order_by("-at", "-id")
            .values_list(*fields)
            .first()
        )
        if first is not None:
            before.append(first)
            ended = (
                events.filter(at__gte=first[3], at__lt=start, token=first[2], kind__in=periods.ENDS)
                .order_by("at", "id")
                .values_list(*fields)
                .first()
            )
            if ended is not None:
                before.append(ended)
    changes = [
        periods.Change(kind, holder, int(token), periods.utc(at))
        for kind, holder, token, at in [*before, *reversed(window)]
    ]
    if state == UNKNOWN:
        current = None
    elif store.live:
        current = periods.Current(
            row.holder,
            row.token if row.holder else None,
            periods.utc(row.expires_at) if row.holder and row.expires_at else None,
        )
    else:
        current = periods.Current(
            row.holder, row.token, periods.utc(row.expires_at) if row.expires_at else None
        )
    terms = periods.holding_periods(
        changes,
        now=now,
        current=current,
        min_term=timedelta(seconds=get_settings().timing.ttl),
    )
    return drawing.render_svg(
        terms,
        start=start,
        now=now,
        current_holder=row.holder if state == LEADING else "",
        known_from=periods.utc(known_from) if known_from else None,
        title=f"Who held {row.name}, {label}",
    )
