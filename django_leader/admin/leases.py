"""The leases in the admin: who holds each one, its state and time left.

State and time left come from the store's clock (:mod:`~django_leader.admin.store`); with a
store that is not the database each lease is read live (:mod:`~django_leader.admin.live`).
A lease's page adds the candidates waiting (their place in the queue, priority, host, pid and
last heartbeat), the timeline (:mod:`~django_leader.admin.timeline`) and the recent history;
the dashboard (:mod:`~django_leader.admin.dashboard`) shows every lease on one page. Force
release and hand-over are actions on the list and buttons on the page
(:mod:`~django_leader.admin.actions`).
Every time is shown to the second with its zone (:mod:`~django_leader.admin.times`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Case, CharField, QuerySet, Value, When
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from ..exceptions import BackendUnavailable
from ..handover import Waiting, election_mode, waiting
from ..models import Lease, LeaseEvent, from_orm
from . import times
from .actions import LeaseActions, _state_of, kept_query
from .constants import (
    DEFAULT_RANGE,
    EXPIRED,
    FREE,
    LEADING,
    RANGES,
    RECENT_EVENTS,
    RELEASING,
    STATE_LABELS,
    UNKNOWN,
)
from .dashboard import dashboard_view
from .live import LiveLeaseChangeList, live_rows
from .periods import format_duration, utc
from .readonly import ReadOnly
from .store import Store, _expired_q, _free_q, _leading_q, _releasing_q
from .timeline import first_event, range_start, timeline_svg


def identity_html(value: str, empty: str = "-") -> str:
    """A holder id (or a lease name) cut to the column's width by CSS; the whole in its
    tooltip, so a long one never pushes the next columns off the screen."""
    if not value:
        return empty
    return format_html('<span class="leader-id" title="{}">{}</span>', value, value)


def _instant(row: Lease, value: datetime | None) -> datetime | None:
    """A time of ``row`` (read through the ORM, or from a live store), aware, in UTC,
    whatever ``USE_TZ``."""
    return None if value is None else from_orm(value, row._state.db or DEFAULT_DB_ALIAS)


def _seconds_left(row: Lease) -> float | None:
    now = _instant(row, getattr(row, "store_now", None))
    expires = _instant(row, row.expires_at)
    if now is None or expires is None:
        return None
    return (expires - now).total_seconds()


class StateFilter(admin.SimpleListFilter):
    """By state, computed in SQL with the database server's clock (database backend only)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        states = (LEADING, EXPIRED, RELEASING, FREE)
        return [(state, STATE_LABELS[state]) for state in states]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value not in (LEADING, EXPIRED, RELEASING, FREE):
            return queryset
        now = Store.current().now_expression()
        if value == LEADING:
            return queryset.filter(_leading_q(now))
        if value == EXPIRED:
            return queryset.filter(_expired_q(now))
        if value == RELEASING:
            return queryset.filter(_releasing_q(now))
        if value == FREE:
            return queryset.filter(_free_q(now))
        return queryset


class LeaseAdmin(ReadOnly, LeaseActions):
    """The leases: read-only, with force release for users allowed to."""

    list_display = (
        "name",
        "holder_display",
        "token_display",
        "state",
        "time_left",
        "renewed_display",
    )
    list_display_links = ("name",)
    list_filter = (StateFilter,)
    search_fields = ("name", "holder")
    actions = ["force_release", "hand_over"]
    list_per_page = 100
    fields = (
        "name",
        "holder_display",
        "state",
        "time_left",
        "token_display",
        "transitions_display",
        "previous_holder",
        "acquired_display",
        "renewed_display",
        "expires_display",
        "candidates_waiting",
        "store_clock",
    )
    readonly_fields = fields
    change_form_template = "admin/django_leader/lease/change_form.html"
    change_list_template = "admin/django_leader/lease/change_list.html"

    # -- permissions: nobody edits a lease by hand (ReadOnly); release: LeaseActions ------
    # -- reading -----------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        store = Store.current()
        if store.live:
            return Lease.objects.none()
        now = store.now_expression()
        return (
            super()
            .get_queryset(request)
            .using(store.lease_db)
            .annotate(
                store_now=now,
                lease_state=Case(
                    When(_leading_q(now), then=Value(LEADING)),
                    When(_expired_q(now), then=Value(EXPIRED)),
                    When(_releasing_q(now), then=Value(RELEASING)),
                    default=Value(FREE),
                    output_field=CharField(),
                ),
            )
        )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LiveLeaseChangeList if Store.current().live else ChangeList

    def get_list_filter(self, request: HttpRequest) -> Any:
        return () if Store.current().live else self.list_filter

    def get_search_fields(self, request: HttpRequest) -> Any:
        return ("name",) if Store.current().live else self.search_fields

    def get_sortable_by(self, request: HttpRequest) -> Any:
        return () if Store.current().live else super().get_sortable_by(request)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        store = Store.current()
        if not store.live:
            return super().get_object(request, object_id, from_field)
        rows = live_rows(request, store, [object_id], known_only=True)
        return rows[0] if rows else None

    # -- columns -------------------------------------------------------------------------
    @admin.display(description=_("holder"), ordering="holder")
    def holder_display(self, row: Lease) -> str:
        if not row.holder and _state_of(row) == RELEASING and row.previous_holder:
            was = row.previous_holder
            return format_html('<span class="leader-id" title="{}">(was {})</span>', was, was)
        return identity_html(row.holder, self.get_empty_value_display())

    @admin.display(description=_("fencing token"), ordering="token")
    def token_display(self, row: Lease) -> Any:
        return row.token if row.token is not None else self.get_empty_value_display()

    @admin.display(description=_("transitions"), ordering="transitions")
    def transitions_display(self, row: Lease) -> Any:
        return row.transitions if row.transitions is not None else self.get_empty_value_display()

    @admin.display(description=_("state"), ordering="lease_state")
    def state(self, row: Lease) -> str:
        state = _state_of(row)
        return format_html(
            '<span class="leader-state leader-state-{}">{}</span>', state, STATE_LABELS[state]
        )

    @admin.display(description=_("time left"), ordering="expires_at")
    def time_left(self, row: Lease) -> str:
        state = _state_of(row)
        seconds = _seconds_left(row)
        if seconds is None or state in (FREE, UNKNOWN):
            return self.get_empty_value_display()
        if state == EXPIRED:
            return f"expired {format_duration(-seconds)} ago"
        if state == RELEASING:
            return f"free in {format_duration(seconds)}"
        return format_duration(seconds)

    @admin.display(description=_("candidates waiting"))
    def candidates_waiting(self, row: Lease) -> str:
        """The Electors campaigning for this lease other than its holder, next in line
        first (read live; the page's "Candidates waiting" section details them)."""
        try:
            candidates = Store.current().backend.candidates(row.name)
        except BackendUnavailable as exc:
            return f"unknown ({exc})"
        if candidates is None:
            return self.get_empty_value_display()
        queue = waiting(candidates, election_mode(), holder=row.holder, now=None)
        return ", ".join(entry.candidate.identity for entry in queue) or str(_("none"))

    @admin.display(description=_("acquired at"), ordering="acquired_at")
    def acquired_display(self, row: Lease) -> str:
        return times.html(_instant(row, row.acquired_at), self.get_empty_value_display())

    @admin.display(description=_("renewed at"), ordering="renewed_at")
    def renewed_display(self, row: Lease) -> str:
        return times.html(_instant(row, row.renewed_at), self.get_empty_value_display())

    @admin.display(description=_("expires at"), ordering="expires_at")
    def expires_display(self, row: Lease) -> str:
        return times.html(_instant(row, row.expires_at), self.get_empty_value_display())

    @admin.display(description=_("checked at (store clock)"))
    def store_clock(self, row: Lease) -> str:
        now = _instant(row, getattr(row, "store_now", None))
        return times.html(now, self.get_empty_value_display())

    # -- pages ---------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        release = path(
            "<path:object_id>/release/",
            self.admin_site.admin_view(self.release_view),
            name="{}_{}_release".format(*info),
        )
        handover = path(
            "<path:object_id>/handover/",
            self.admin_site.admin_view(self.handover_view),
            name="{}_{}_handover".format(*info),
        )
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name="{}_{}_dashboard".format(*info),
        )
        return [dashboard, release, handover, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Every lease on one page: leader, candidates, last transition, alerts."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return dashboard_view(self, request)

    def dashboard_url(self) -> str:
        return reverse("admin:django_leader_lease_dashboard", current_app=self.admin_site.name)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = {
            **Store.current().header(),
            "dashboard_url": self.dashboard_url(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            context.update(self._detail_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _detail_context(self, request: HttpRequest, row: Lease) -> dict[str, Any]:
        store = Store.current()
        chosen = request.GET.get("timeline", DEFAULT_RANGE)
        if chosen not in RANGES:
            chosen = DEFAULT_RANGE
        label, length = RANGES[chosen]
        now = _instant(row, getattr(row, "store_now", None)) or utc(store.now())
        state = _state_of(row)
        first = first_event(store, row.name)
        start = range_start(first, now, length)
        svg = timeline_svg(store, row, state, now, start, label, first)
        events = LeaseEvent.objects.using(store.history_db).filter(name=row.name)
        recent = list(events.order_by("-at", "-id")[:RECENT_EVENTS])
        history_url = None
        event_admin = self.admin_site._registry.get(LeaseEvent)  # get_model_admin(): 5.0+
        if event_admin is not None and event_admin.has_view_permission(request):
            history_url = (
                reverse(
                    "admin:django_leader_leaseevent_changelist", current_app=self.admin_site.name
                )
                + "?"
                + urlencode({"name": row.name})
            )
        site = self.admin_site.name
        candidates, candidates_error = self._waiting(store, row, now)

        def with_range(key: str) -> str:
            params = request.GET.copy()
            params["timeline"] = key
            return params.urlencode()

        return {
            **store.header(now=now),
            "lease_state": state,
            "can_release": self.has_release_permission(request) and bool(row.holder),
            "candidates": candidates,
            "candidates_error": candidates_error,
            "election_mode": str(election_mode()),
            "can_hand_over": self.has_release_permission(request)
            and state == LEADING
            and bool(candidates),
            "handover_url": reverse(
                "admin:django_leader_lease_handover", args=[quote(row.name)], current_app=site
            )
            + kept_query(request),
            "release_url": reverse(
                "admin:django_leader_lease_release", args=[quote(row.name)], current_app=site
            )
            + kept_query(request),
            "timeline_svg": mark_safe(svg),  # every value in it is escaped
            "timeline_ranges": [
                {"key": key, "label": text, "active": key == chosen, "query": with_range(key)}
                for key, (text, _length) in RANGES.items()
            ],
            "recent_events": recent,
            "history_url": history_url,
            "admin_log_url": reverse(
                "admin:django_leader_lease_history", args=[quote(row.name)], current_app=site
            ),
            "dashboard_url": self.dashboard_url(),
        }

    def _waiting(
        self, store: Store, row: Lease, now: Any
    ) -> tuple[list[dict[str, Any]] | None, str]:
        """The candidates waiting as the page lists them, next in line first (None if the
        store keeps no registry), and why they could not be read ("" if they could)."""
        try:
            found = store.backend.candidates(row.name)
        except BackendUnavailable as exc:
            return None, str(exc)
        if found is None:
            return None, ""
        empty = self.get_empty_value_display()
        return [
            self._candidate_row(entry, empty)
            for entry in waiting(found, election_mode(), holder=row.holder, now=now)
        ], ""

    @staticmethod
    def _candidate_row(entry: Waiting, empty: str) -> dict[str, Any]:
        c = entry.candidate
        return {
            "place": entry.place,
            "identity": c.identity,
            "priority": c.priority,
            "host": c.host or empty,
            "pid": c.pid or empty,
            "seen": empty
            if entry.seen_ago is None
            else _("%(duration)s ago") % {"duration": format_duration(entry.seen_ago)},
            "joined": times.html(c.joined_at, empty),
        }
