"""The lease page's timeline: the history of one lease over a range, read for the picture.

The queries stay on the index (``name``, ``-at``, ``-id``): the lease's first event (where
its history begins, and the start of the default range, :func:`range_start`), the newest
events of the range, and, when the range holds them all, the last acquisition before it
with the end of that term. :mod:`~django_leader.admin.periods` turns them into terms, and
:mod:`~django_leader.admin.drawing` draws those.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..conf import get_settings
from ..models import Lease, LeaseEvent, from_orm, to_orm
from . import drawing, periods
from .constants import LEADING, TIMELINE_EVENTS, UNKNOWN
from .store import Store


def first_event(store: Store, name: str) -> datetime | None:
    """When the history of ``name`` begins: its oldest recorded event (None: it has none)."""
    events = LeaseEvent.objects.using(store.history_db).filter(name=name)
    first = events.order_by("at", "id").values_list("at", flat=True).first()
    return from_orm(first, store.history_db) if first is not None else None


def range_start(first: datetime | None, now: datetime, length: timedelta | None) -> datetime:
    """Where a range of ``length`` ending ``now`` begins; None: fitted to the history."""
    if length is None:
        return periods.fitted_start(first, now)
    return now - length


def timeline_svg(
    store: Store,
    row: Lease,
    state: str,
    now: datetime,
    start: datetime,
    label: str,
    first: datetime | None,
) -> str:
    """The SVG picture of who held ``row`` between ``start`` and ``now`` (the store's clock).

    ``first`` is the lease's first recorded event (:func:`first_event`): before it the
    picture says "no history". Reads at most :data:`TIMELINE_EVENTS` events of the window,
    newest first (beyond that, the oldest part of the window is drawn as "history not
    read"), plus the term already running when the window opens; the store's view of the
    lease (``row``, in ``state``) ends the last term.
    """
    database = store.history_db
    events = LeaseEvent.objects.using(database).filter(name=row.name)
    fields = ("kind", "holder", "token", "at")
    window = list(
        events.filter(at__gte=to_orm(start, database))
        .order_by("-at", "-id")
        .values_list(*fields)[: TIMELINE_EVENTS + 1]
    )
    read_from = None
    before: list[Any] = []
    if len(window) > TIMELINE_EVENTS:
        window = window[:TIMELINE_EVENTS]
        read_from = window[-1][3]
    else:
        # Who held the lease when the window opens: its last acquisition before, unless
        # that term ended before the window too.
        opening = (
            events.filter(at__lt=to_orm(start, database), kind__in=periods.STARTS)
            .order_by("-at", "-id")
            .values_list(*fields)
            .first()
        )
        if opening is not None:
            before.append(opening)
            ended = (
                events.filter(
                    at__gte=opening[3],
                    at__lt=to_orm(start, database),
                    token=opening[2],
                    kind__in=periods.ENDS,
                )
                .order_by("at", "id")
                .values_list(*fields)
                .first()
            )
            if ended is not None:
                before.append(ended)
    changes = [
        periods.Change(kind, holder, int(token), from_orm(at, database))
        for kind, holder, token, at in [*before, *reversed(window)]
    ]
    if state == UNKNOWN:
        current = None
    elif store.live:
        current = periods.Current(
            row.holder,
            row.token if row.holder else None,
            from_orm(row.expires_at, database) if row.holder and row.expires_at else None,
        )
    else:
        current = periods.Current(
            row.holder,
            row.token,
            from_orm(row.expires_at, store.lease_db) if row.expires_at else None,
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
        history_from=first,
        read_from=from_orm(read_from, database) if read_from else None,
        title=f"Who held {row.name}, {label}",
    )
