"""The Django admin for leases and their history.

* **Leases**: who holds each lease, with which fencing token, its state (leading / expired
  / free) and time left — computed with the *store's* clock: the database server's
  ``now()`` in the same query for the database backend, the live state read from Redis for
  the cache backend. Nobody edits or adds a lease by hand. Each lease's page shows a
  timeline of who led when and its recent history.
* **Force release** (an action on the list, a button on the lease's page): needs the
  permission ``django_leader.release_lease``, POST with a CSRF token only, and is recorded
  in the history with the acting user. The holder notices at its next renewal and steps
  down.
* **History** (``LeaseEvent``): read-only for everyone, superusers included; filters by
  lease name, kind and date; newest first; paginated without counting every row of a huge
  table, and with the date drill-down found by index seeks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import InvalidPage, Paginator
from django.db import connections
from django.db.models import Case, CharField, Max, Min, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from . import timeline
from .backends import get_backend
from .backends.base import Backend
from .backends.db import DatabaseBackend
from .conf import get_settings
from .exceptions import BackendUnavailable
from .lease import Lease as LeaseRecord
from .models import Lease, LeaseEvent

logger = logging.getLogger("django_leader")

LEADING, EXPIRED, RELEASING, FREE, UNKNOWN = "leading", "expired", "releasing", "free", "unknown"
STATE_LABELS = {
    LEADING: _("leading"),
    EXPIRED: _("expired"),
    RELEASING: _("force-released"),
    FREE: _("free"),
    UNKNOWN: _("store unavailable"),
}
#: How many history rows the lease page lists, and at most how many events the timeline reads.
RECENT_EVENTS = 20
TIMELINE_EVENTS = 5000
#: At most this many lease names in the history's "by name" filter.
NAME_FILTER_LIMIT = 200


class StoreNow(Now):
    """The database server's clock, as the database backend reads it.

    MySQL's ``CURRENT_TIMESTAMP`` follows the session time zone, while lease columns hold
    naive UTC: use ``UTC_TIMESTAMP(6)`` there.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


def _leading_q() -> Q:
    return ~Q(holder="") & Q(expires_at__gt=StoreNow())


def _expired_q() -> Q:
    return ~Q(holder="") & Q(expires_at__lte=StoreNow())


def _releasing_q() -> Q:
    """Force-released, but the term runs on: nobody may take it before it ends (the
    holder hears of the release only at its next renewal)."""
    return Q(holder="") & Q(expires_at__gt=StoreNow())


def _free_q() -> Q:
    return Q(holder="") & Q(expires_at__lte=StoreNow())


@dataclass(frozen=True)
class Store:
    """Where the admin reads leases and history for one request."""

    backend: Backend
    #: False: leases are rows of the ``Lease`` table (database backend); True: the store is
    #: elsewhere (Redis) and each lease is read live from it.
    live: bool
    lease_db: str
    history_db: str

    @classmethod
    def current(cls) -> Store:
        backend = get_backend()
        conf = get_settings()
        history_db = backend.history_database or conf.database
        if isinstance(backend, DatabaseBackend):
            return cls(backend, False, backend.alias, history_db)
        return cls(backend, True, conf.database, history_db)

    def describe(self) -> str:
        if self.live:
            return (
                f"{type(self.backend).__name__} {getattr(self.backend, 'alias', '')!r}: "
                "live state read from the store; history from database "
                f"{self.history_db!r}."
            )
        return (
            f"{type(self.backend).__name__} {self.lease_db!r}: state and time left by the "
            "database server's clock."
        )

    def names(self, limit: int | None = None) -> list[str]:
        """Every lease name the store knows; from the history if it cannot list them."""
        if not self.live:
            names = Lease.objects.using(self.lease_db).order_by("name")
            return list(names.values_list("name", flat=True)[:limit])
        lister = getattr(self.backend, "names", None)
        if callable(lister):
            try:
                return sorted(lister())[:limit]
            except NotImplementedError:
                pass
        distinct = (
            LeaseEvent.objects.using(self.history_db)
            .order_by("name")
            .values_list("name", flat=True)
            .distinct()
        )
        return list(distinct[:limit])

    def now(self) -> datetime:
        """The store's clock (Redis ``TIME``); the web server's only for a store without one."""
        client = getattr(self.backend, "client", None)
        if client is not None and hasattr(client, "time"):
            try:
                seconds, micros = client.time()
                return datetime.fromtimestamp(int(seconds), tz=dt_timezone.utc) + timedelta(
                    microseconds=int(micros)
                )
            except Exception as exc:  # any client failure: fall back to the web clock
                logger.warning("could not read the store's clock: %s", exc)
        return timezone.now()


def _state_of(row: Lease) -> str:
    state = getattr(row, "lease_state", None)
    if state:
        return str(state)
    return FREE if not row.holder else LEADING


def _seconds_left(row: Lease) -> float | None:
    now = getattr(row, "store_now", None)
    if now is None or row.expires_at is None:
        return None
    return (timeline.utc(row.expires_at) - timeline.utc(now)).total_seconds()


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        states = (LEADING, EXPIRED, RELEASING, FREE)
        return [(state, STATE_LABELS[state]) for state in states]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == LEADING:
            return queryset.filter(_leading_q())
        if value == EXPIRED:
            return queryset.filter(_expired_q())
        if value == RELEASING:
            return queryset.filter(_releasing_q())
        if value == FREE:
            return queryset.filter(_free_q())
        return queryset


class LiveLeaseChangeList(ChangeList):
    """The lease list of a store that is not the database: one live read per shown lease."""

    def get_results(self, request: HttpRequest) -> None:
        model_admin: LeaseAdmin = self.model_admin
        store = Store.current()
        try:
            names = store.names()
        except BackendUnavailable as exc:
            messages.error(request, f"Cannot list the leases of the store: {exc}")
            names = []
        total = len(names)
        if self.query:
            needle = self.query.lower()
            names = [name for name in names if needle in name.lower()]
        paginator = Paginator(names, self.list_per_page)
        self.result_count = paginator.count
        self.full_result_count = total
        self.show_full_result_count = True
        self.show_admin_actions = bool(total)
        self.can_show_all = self.result_count <= self.list_max_show_all
        self.multi_page = self.result_count > self.list_per_page
        if (self.show_all and self.can_show_all) or not self.multi_page:
            shown = names
        else:
            try:
                shown = list(paginator.page(self.page_num).object_list)
            except InvalidPage:
                raise admin.options.IncorrectLookupParameters from None
        self.result_list = model_admin.live_rows(request, store, shown)
        self.paginator = paginator


class ReadOnly:
    """No add, change or delete in the admin, for anyone: superusers included."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Lease)
class LeaseAdmin(ReadOnly, admin.ModelAdmin):
    list_display = (
        "name",
        "holder_display",
        "token_display",
        "state",
        "time_left",
        "transitions_display",
        "renewed_at",
    )
    list_display_links = ("name",)
    list_filter = (StateFilter,)
    search_fields = ("name", "holder")
    actions = ["force_release"]
    list_per_page = 100
    fields = (
        "name",
        "holder_display",
        "state",
        "time_left",
        "token_display",
        "transitions_display",
        "previous_holder",
        "acquired_at",
        "renewed_at",
        "expires_at",
        "candidates_waiting",
        "store_clock",
    )
    readonly_fields = fields
    change_form_template = "admin/django_leader/lease/change_form.html"
    change_list_template = "admin/django_leader/lease/change_list.html"

    # -- permissions: nobody edits a lease by hand (ReadOnly) -----------------------------

    def has_release_permission(self, request: HttpRequest) -> bool:
        """``django_leader.release_lease`` (and seeing leases at all)."""
        user: Any = request.user
        return self.has_view_permission(request) and user.has_perm(
            f"{self.opts.app_label}.release_lease"
        )

    # -- reading -----------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        store = Store.current()
        if store.live:
            return Lease.objects.none()
        return (
            super()
            .get_queryset(request)
            .using(store.lease_db)
            .annotate(
                store_now=StoreNow(),
                lease_state=Case(
                    When(_leading_q(), then=Value(LEADING)),
                    When(_expired_q(), then=Value(EXPIRED)),
                    When(_releasing_q(), then=Value(RELEASING)),
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
        rows = self.live_rows(request, store, [object_id], known_only=True)
        return rows[0] if rows else None

    def live_rows(
        self, request: HttpRequest, store: Store, names: list[str], known_only: bool = False
    ) -> list[Lease]:
        """Unsaved ``Lease`` rows showing what the live store says about ``names``.

        With ``known_only``, a name the store and the history do not know gives no row.
        """
        rows: list[Lease] = []
        now: datetime | None = None
        failed = False
        for name in names:
            try:
                lease: LeaseRecord | None = store.backend.read(name)
            except BackendUnavailable as exc:
                if not failed:
                    messages.error(request, f"Cannot read the lease store: {exc}")
                failed = True
                rows.append(self._row(name, None, None, UNKNOWN))
                continue
            if lease is not None:
                read_at = getattr(lease, "read_at", None)
                if read_at is None:
                    now = now or store.now()
                rows.append(self._row(name, lease, read_at or now, LEADING))
                continue
            last = (
                LeaseEvent.objects.using(store.history_db)
                .filter(name=name)
                .order_by("-at", "-id")
                .first()
            )
            if last is None and known_only and name not in store.names():
                continue
            now = now or store.now()
            row = self._row(name, None, now, FREE)
            if last is not None:
                row.token = last.token
                row.previous_holder = last.holder
            rows.append(row)
        return rows

    @staticmethod
    def _row(name: str, lease: LeaseRecord | None, now: datetime | None, state: str) -> Lease:
        row = Lease(name=name, holder="", previous_holder="")
        row.token = None  # unknown until read
        row.transitions = None
        if lease is not None:
            row.holder = lease.holder
            row.previous_holder = lease.previous_holder
            row.token = lease.token
            row.transitions = lease.transitions
            row.acquired_at = lease.acquired_at
            row.renewed_at = lease.renewed_at
            row.expires_at = lease.expires_at
        row.store_now = now
        row.lease_state = state
        return row

    # -- columns -------------------------------------------------------------------------
    @admin.display(description=_("holder"), ordering="holder")
    def holder_display(self, row: Lease) -> str:
        if not row.holder and _state_of(row) == RELEASING and row.previous_holder:
            return f"(was {row.previous_holder})"
        return row.holder or self.get_empty_value_display()

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
            return f"expired {timeline.format_duration(-seconds)} ago"
        if state == RELEASING:
            return f"free in {timeline.format_duration(seconds)}"
        return timeline.format_duration(seconds)

    @admin.display(description=_("candidates waiting"))
    def candidates_waiting(self, row: Lease) -> str:
        """The Electors campaigning for this lease other than its holder (read live)."""
        try:
            candidates = Store.current().backend.candidates(row.name)
        except BackendUnavailable as exc:
            return f"unknown ({exc})"
        if candidates is None:
            return self.get_empty_value_display()
        waiting = [identity for identity in candidates if identity != row.holder]
        return ", ".join(waiting) or str(_("none"))

    @admin.display(description=_("checked at (store clock)"))
    def store_clock(self, row: Lease) -> str:
        now = getattr(row, "store_now", None)
        if now is None:
            return self.get_empty_value_display()
        return formats.localize(timezone.localtime(timeline.utc(now)))

    # -- pages ---------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        release = path(
            "<path:object_id>/release/",
            self.admin_site.admin_view(self.release_view),
            name="{}_{}_release".format(*info),
        )
        return [release, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = {"leader_store": Store.current().describe(), **(extra_context or {})}
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
        chosen = request.GET.get("timeline", "day")
        if chosen not in timeline.RANGES:
            chosen = "day"
        label, length = timeline.RANGES[chosen]
        now = timeline.utc(getattr(row, "store_now", None) or store.now())
        state = _state_of(row)
        svg = self._timeline_svg(store, row, state, now, now - length, label)
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
                + _query({"name": row.name})
            )
        return {
            "leader_store": store.describe(),
            "lease_state": state,
            "can_release": self.has_release_permission(request) and bool(row.holder),
            "release_url": reverse(
                "admin:django_leader_lease_release",
                args=[quote(row.name)],
                current_app=self.admin_site.name,
            ),
            "timeline_svg": mark_safe(svg),  # every value in it is escaped
            "timeline_ranges": [
                {
                    "key": key,
                    "label": text,
                    "active": key == chosen,
                    "query": _query({"timeline": key}),
                }
                for key, (text, _length) in timeline.RANGES.items()
            ],
            "recent_events": recent,
            "history_url": history_url,
        }

    def _timeline_svg(
        self, store: Store, row: Lease, state: str, now: datetime, start: datetime, label: str
    ) -> str:
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
                events.filter(at__lt=start, kind__in=timeline.STARTS)
                .order_by("-at", "-id")
                .values_list(*fields)
                .first()
            )
            if first is not None:
                before.append(first)
                ended = (
                    events.filter(
                        at__gte=first[3], at__lt=start, token=first[2], kind__in=timeline.ENDS
                    )
                    .order_by("at", "id")
                    .values_list(*fields)
                    .first()
                )
                if ended is not None:
                    before.append(ended)
        changes = [
            timeline.Change(kind, holder, int(token), timeline.utc(at))
            for kind, holder, token, at in [*before, *reversed(window)]
        ]
        if state == UNKNOWN:
            current = None
        elif store.live:
            current = timeline.Current(
                row.holder,
                row.token if row.holder else None,
                timeline.utc(row.expires_at) if row.holder and row.expires_at else None,
            )
        else:
            current = timeline.Current(
                row.holder, row.token, timeline.utc(row.expires_at) if row.expires_at else None
            )
        periods = timeline.holding_periods(
            changes,
            now=now,
            current=current,
            min_term=timedelta(seconds=get_settings().timing.ttl),
        )
        return timeline.render_svg(
            periods,
            start=start,
            now=now,
            current_holder=row.holder if state == LEADING else "",
            known_from=timeline.utc(known_from) if known_from else None,
            title=f"Who held {row.name}, {label}",
        )

    # -- force release -------------------------------------------------------------------
    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page (changes nothing). POST (with CSRF token): release."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not self.has_release_permission(request):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))
        if row is None:
            raise Http404(f"No lease named {unquote(object_id)!r}")
        change_url = reverse(
            "admin:django_leader_lease_change",
            args=[quote(row.name)],
            current_app=self.admin_site.name,
        )
        if request.method == "POST":
            self._force_release(request, [row.name], request.POST.get("reason", ""))
            return HttpResponseRedirect(change_url)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Force release"),
            "subtitle": row.name,
            "opts": self.opts,
            "object": row,
            "lease_state": _state_of(row),
            "lease_state_label": STATE_LABELS[_state_of(row)],
            "change_url": change_url,
            "renew_interval": get_settings().timing.renew_interval,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_leader/lease/release_confirmation.html", context
        )

    @admin.action(description=_("Force release the selected leases"), permissions=["release"])
    def force_release(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        store = Store.current()
        if not store.live:
            names = list(queryset.values_list("name", flat=True))
        elif request.POST.get("select_across") == "1":
            names = store.names()
        else:
            names = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        self._force_release(request, names, "")

    def _force_release(self, request: HttpRequest, names: list[str], reason: str) -> None:
        store = Store.current()
        user: Any = request.user
        actor = user.get_username()
        reason = " ".join(reason.split())[:500]
        detail = reason or "force-released in the Django admin"
        for name in names:
            try:
                lease = store.backend.force_release(name, actor=actor, detail=detail)
            except BackendUnavailable as exc:
                messages.error(request, f"Could not release “{name}”: {exc}")
                continue
            if lease is None:
                messages.warning(request, f"“{name}” was not held: nothing to release.")
                continue
            self.log_change(
                request,
                Lease(name=name),
                f"Force-released (held by {lease.holder}, token {lease.token}): {detail}",
            )
            messages.success(
                request,
                f"Force-released “{name}” (held by {lease.holder}, token {lease.token}). "
                "The holder steps down at its next renewal; the lease can be taken once "
                "its current term ends.",
            )
        if not store.backend.flush_history(5):
            messages.warning(request, "The history event is not written yet.")


def _query(params: dict[str, str]) -> str:
    return urlencode(params)


# -- history ------------------------------------------------------------------------------


class NameFilter(admin.SimpleListFilter):
    """By lease name: the names the store knows (any ``?name=`` works, also others)."""

    title = _("lease")
    parameter_name = "name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        try:
            names = Store.current().names(limit=NAME_FILTER_LIMIT)
        except BackendUnavailable:
            names = []  # the history is in the database: still usable
        value = self.value()
        if value and value not in names:
            names.insert(0, value)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(name=value) if value else queryset


def estimated_rows(rows: QuerySet[Any]) -> int | None:
    """The planner's estimate of how many rows ``rows`` has, or None if it gives none.

    PostgreSQL: the row estimate of the query's plan (any filters). MySQL/MariaDB: the
    table's row estimate, for an unfiltered query only. Others: None.
    """
    connection = connections[rows.db]
    if connection.vendor == "postgresql":
        sql, params = rows.order_by().query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            raw = cursor.fetchone()[0]
        plan = json.loads(raw) if isinstance(raw, str) else raw
        estimate = plan[0]["Plan"]["Plan Rows"]
    elif connection.vendor == "mysql" and not rows.query.where:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [rows.model._meta.db_table],
            )
            row = cursor.fetchone()
        estimate = row[0] if row else None
    else:
        return None
    return int(estimate) if estimate else None


class HistoryPaginator(Paginator):
    """Counts the rows of the list, unless the planner estimates more than
    :attr:`estimate_above` of them: then the estimate stands in for a ``COUNT(*)`` that
    would read every one of them (the unfiltered list of a big history, a filter on
    ``kind`` alone)."""

    estimate_above = 100_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        estimate = estimated_rows(rows)
        if estimate is not None and estimate > self.estimate_above:
            return estimate
        return rows.count()


class HistoryChangeList(ChangeList):
    @cached_property
    def hierarchy(self) -> dict[str, Any]:
        """What Django's ``{% date_hierarchy %}`` shows, with the dates found by index seeks.

        Django lists the years, months or days that have rows with ``SELECT DISTINCT``
        over every matching row; here each date costs one ``MIN(at)`` seek on an index.
        """
        field = self.date_hierarchy
        keys = f"{field}__year", f"{field}__month", f"{field}__day"
        year, month, day = (self.params.get(key) for key in keys)

        def link(filters: dict[str, Any]) -> str:
            return str(self.get_query_string(filters, [f"{field}__"]))

        rows = self.queryset.order_by()
        if not (year or month or day):
            bounds = rows.aggregate(first=Min(field), last=Max(field))
            first, last = bounds["first"], bounds["last"]
            if first is not None and last is not None:
                first, last = timezone.localtime(first), timezone.localtime(last)
                if first.year == last.year:
                    year = first.year
                    if first.month == last.month:
                        month = first.month
        if year and month and day:
            date = datetime(int(year), int(month), int(day))
            return {
                "show": True,
                "back": {
                    "link": link({keys[0]: year, keys[1]: month}),
                    "title": capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT")),
                },
                "choices": [{"title": capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))}],
            }
        if year and month:
            return {
                "show": True,
                "back": {"link": link({keys[0]: year}), "title": str(year)},
                "choices": [
                    {
                        "link": link({keys[0]: year, keys[1]: month, keys[2]: d.day}),
                        "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT")),
                    }
                    for d in _buckets(rows, field, "day")
                ],
            }
        if year:
            return {
                "show": True,
                "back": {"link": link({}), "title": _("All dates")},
                "choices": [
                    {
                        "link": link({keys[0]: year, keys[1]: m.month}),
                        "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT")),
                    }
                    for m in _buckets(rows, field, "month")
                ],
            }
        return {
            "show": True,
            "back": None,
            "choices": [
                {"link": link({keys[0]: str(y.year)}), "title": str(y.year)}
                for y in _buckets(rows, field, "year")
            ],
        }


def _buckets(rows: QuerySet[Any], field: str, kind: str, limit: int = 400) -> list[datetime]:
    """The starts (local time) of the years, months or days that have rows, ascending."""
    found: list[datetime] = []
    lower: datetime | None = None
    while len(found) < limit:
        candidates = rows if lower is None else rows.filter(**{f"{field}__gte": lower})
        first = candidates.aggregate(first=Min(field))["first"]
        if first is None:
            break
        local = timezone.localtime(first)
        if kind == "year":
            begin = local.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
            following = begin.replace(year=begin.year + 1)
        elif kind == "month":
            begin = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            following = (
                begin.replace(year=begin.year + 1, month=1)
                if begin.month == 12
                else begin.replace(month=begin.month + 1)
            )
        else:
            begin = local.replace(hour=0, minute=0, second=0, microsecond=0)
            following = begin + timedelta(days=1)
        found.append(begin)
        # Local midnight of the next bucket, as an aware time (DST-safe).
        lower = timezone.make_aware(following.replace(tzinfo=None))
    return found


@admin.register(LeaseEvent)
class LeaseEventAdmin(ReadOnly, admin.ModelAdmin):
    list_display = (
        "at",
        "lease",
        "kind",
        "holder",
        "token",
        "previous_holder",
        "actor",
        "short_detail",
    )
    list_filter = (NameFilter, "kind")
    date_hierarchy = "at"
    search_fields = ("holder",)
    search_help_text = _("Search by holder.")
    ordering = ("-at", "-id")
    list_per_page = 100
    show_full_result_count = False
    actions = None
    fields = (
        "at",
        "lease",
        "kind",
        "holder",
        "token",
        "previous_holder",
        "actor",
        "detail",
    )
    readonly_fields = fields
    change_list_template = "admin/django_leader/leaseevent/change_list.html"
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: a facet is a COUNT per choice
        show_facets = admin.ShowFacets.NEVER

    # -- the history is read-only for everyone, superusers included (ReadOnly) ------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(Store.current().history_db)

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        return HistoryPaginator(queryset, per_page, orphans, allow_empty_first_page)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return HistoryChangeList

    @admin.display(description=_("lease"), ordering="name")
    def lease(self, event: LeaseEvent) -> str:
        url = reverse(
            "admin:django_leader_lease_change",
            args=[quote(event.name)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, event.name)

    @admin.display(description=_("detail"))
    def short_detail(self, event: LeaseEvent) -> str:
        text = event.detail
        return text if len(text) <= 80 else text[:79] + "…"
