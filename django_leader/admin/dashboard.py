"""The dashboard: every lease on one page, with its leader, the candidates waiting, its last
transition and its alerts (:mod:`~django_leader.admin.alerts`).

Everything comes through the backend contract: the names (``names()``), the leases as the
store says they are now (``read_many()``, by the store's clock), their candidates
(``candidates_many()``: both a few round trips for the whole page, not one per lease) and
the store's clock (``now()``); the last transition and the count of recent transitions
come from the history (two queries on the ``name, -at, -id`` index per lease). At most
:data:`~django_leader.admin.constants.DASHBOARD_LEASES` leases are read; a search narrows
the list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib.admin import ModelAdmin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from ..conf import get_settings
from ..election import Candidate
from ..exceptions import BackendUnavailable
from ..lease import Lease
from ..models import LeaseEvent, from_orm, to_orm
from ..tasks.entries import Entry, load_schedule
from . import alerts, periods
from .constants import DASHBOARD_LEASES, FLAPPING_TRANSITIONS, FLAPPING_WINDOW
from .readonly import ReadOnly
from .store import Store


@dataclass
class LeaseRow:
    """One lease as the dashboard shows it."""

    name: str
    url: str
    history_url: str | None = None
    #: Who holds it now ("" for nobody) and its token, by the store.
    holder: str = ""
    token: int | None = None
    seconds_left: float | None = None
    #: The candidates other than the holder; None if the store does not track them.
    waiting: list[str] | None = None
    last: LeaseEvent | None = None
    #: Transitions (acquisitions, takeovers) within the flapping window.
    transitions: int = 0
    alerts: list[alerts.Alert] = field(default_factory=list)
    #: Why the store could not be read for this lease ("" when it could).
    error: str = ""

    @property
    def time_left(self) -> str:
        """Until the lease expires, by the store's clock ("" when nobody holds it)."""
        if self.seconds_left is None:
            return ""
        return periods.format_duration(self.seconds_left)


@dataclass
class StoreSays:
    """What the store answered for the page's leases, read at once: each lease and its
    candidates by name, or why it could not be read."""

    leases: dict[str, Lease | None] = field(default_factory=dict)
    candidates: dict[str, list[Candidate] | None] = field(default_factory=dict)
    error: str = ""

    @classmethod
    def read(cls, store: Store, names: list[str]) -> StoreSays:
        if not names:
            return cls()
        try:
            leases = store.backend.read_many(names)
            candidates = store.backend.candidates_many(names)
        except BackendUnavailable as exc:
            return cls(error=str(exc))
        return cls(dict(zip(names, leases, strict=True)), dict(zip(names, candidates, strict=True)))


def read_lease(
    store: Store,
    said: StoreSays,
    name: str,
    now: datetime,
    url: str,
    history_url: str | None,
    schedule: Mapping[str, Entry],
) -> LeaseRow:
    """What the store (``said``) and the history say about ``name`` now, with its alerts.
    ``schedule``: the ``TASKS_SCHEDULE`` entries by their slot records' key."""
    row = LeaseRow(name, url, history_url)
    events = LeaseEvent.objects.using(store.history_db).filter(name=name)
    row.last = events.order_by("-at", "-id").first()
    since = to_orm(now - FLAPPING_WINDOW, store.history_db)
    row.transitions = events.filter(kind__in=periods.STARTS, at__gt=since).count()
    if said.error:
        row.error = said.error
        return row
    lease, candidates = said.leases[name], said.candidates[name]
    if lease is not None:
        row.holder, row.token = lease.holder, lease.token
        read_at = periods.utc(getattr(lease, "read_at", None) or now)
        if lease.expires_at is not None:
            row.seconds_left = (periods.utc(lease.expires_at) - read_at).total_seconds()
    if candidates is not None:
        row.waiting = [c.identity for c in candidates if c.identity != row.holder]
    last = None
    if row.last is not None:
        last = periods.Change(
            row.last.kind,
            row.last.holder,
            int(row.last.token),
            from_orm(row.last.at, store.history_db),
        )
    conf = get_settings().timing
    found = [
        alerts.no_leader(
            holder=row.holder,
            waiting=len(row.waiting or []),
            last=last,
            now=now,
            grace=timedelta(seconds=conf.ttl + conf.retry_interval),
        ),
        alerts.flapping(row.transitions, window=FLAPPING_WINDOW, limit=FLAPPING_TRANSITIONS),
        _behind(store, lease, now, schedule) if lease is not None and schedule else None,
    ]
    row.alerts = [alert for alert in found if alert is not None]
    return row


def _behind(
    store: Store, lease: Any, now: datetime, entries: Mapping[str, Entry]
) -> alerts.Alert | None:
    """The "behind" alert of the ``entries`` whose slots ``lease`` records."""
    try:
        records = store.backend.slots().load(lease)
    except BackendUnavailable:
        return None
    mine = [(entries[key], slot.at) for key, slot in records.items() if key in entries]
    return alerts.behind(
        {entry.name: periods.utc(at) for entry, at in mine},
        {entry.name: entry.after for entry, _ in mine},
        now,
    )


def dashboard_view(model_admin: ModelAdmin[Any], request: HttpRequest) -> HttpResponse:
    """Every lease (up to :data:`DASHBOARD_LEASES`, those matching ``?q=``), alerts first."""
    store = Store.current()
    site = model_admin.admin_site.name
    query = request.GET.get("q", "").strip()
    error = ""
    try:
        names = store.names()
    except BackendUnavailable as exc:
        names, error = [], str(exc)
    total = len(names)
    if query:
        names = [name for name in names if query.lower() in name.lower()]
    matching = len(names)
    names = names[:DASHBOARD_LEASES]
    now = periods.utc(store.now())
    event_admin = model_admin.admin_site._registry.get(LeaseEvent)
    history = event_admin is not None and event_admin.has_view_permission(request)
    history_list = reverse("admin:django_leader_leaseevent_changelist", current_app=site)
    schedule = {entry.key: entry for entry in load_schedule()}
    said = StoreSays.read(store, names)
    rows = []
    for name in names:
        url = reverse("admin:django_leader_lease_change", args=[quote(name)], current_app=site)
        history_url = f"{history_list}?{urlencode({'name': name})}" if history else None
        rows.append(read_lease(store, said, name, now, url, history_url, schedule))
    rows.sort(key=lambda row: (not row.alerts and not row.error, row.name))
    conf = get_settings().timing
    context = {
        **model_admin.admin_site.each_context(request),
        **store.header(),
        "title": _("Leader election dashboard"),
        "opts": model_admin.opts,
        "rows": rows,
        "query": query,
        "total": total,
        "matching": matching,
        "shown": len(rows),
        "leading": sum(1 for row in rows if row.holder),
        "alerting": sum(1 for row in rows if row.alerts),
        "store_error": error,
        "grace": periods.format_duration(conf.ttl + conf.retry_interval),
        "flapping_transitions": FLAPPING_TRANSITIONS,
        "flapping_window": periods.format_duration(FLAPPING_WINDOW.total_seconds()),
        "list_url": reverse("admin:django_leader_lease_changelist", current_app=site),
    }
    request.current_app = site
    return TemplateResponse(request, "admin/django_leader/lease/dashboard.html", context)


class DashboardEntry(ReadOnly, ModelAdmin):
    """The dashboard in the admin's index and sidebar ("Dashboard" under Leader election),
    for whoever may view leases: its page is the dashboard."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm("django_leader.view_lease"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        url = reverse("admin:django_leader_lease_dashboard", current_app=self.admin_site.name)
        return redirect(url)
