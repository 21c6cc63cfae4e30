"""The history (``LeaseEvent``) in the admin: read-only for everyone, newest first.

Filters by lease name and kind, a date drill-down by index seeks
(:mod:`~django_leader.admin.date_hierarchy`), and pages that count without reading every
row of a huge table (:mod:`~django_leader.admin.paginator`). Times to the second with their
zone; a long holder id is cut to its column (the whole id in its tooltip), so the token,
actor and detail columns stay on the screen.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..exceptions import BackendUnavailable
from ..models import LeaseEvent, from_orm
from . import times
from .constants import NAME_FILTER_LIMIT
from .date_hierarchy import HistoryChangeList
from .leases import identity_html
from .paginator import HistoryPaginator
from .readonly import ReadOnly
from .store import Store


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


class LeaseEventAdmin(ReadOnly, admin.ModelAdmin):
    """The history of every lease: read-only for everyone, superusers included."""

    list_display = (
        "when",
        "lease",
        "kind",
        "holder_id",
        "token",
        "actor_name",
        "short_detail",
    )
    list_display_links = ("when",)
    list_filter = (NameFilter, "kind")
    date_hierarchy = "at"
    search_fields = ("holder",)
    search_help_text = _("Search by holder.")
    ordering = ("-at", "-id")
    list_per_page = 100
    show_full_result_count = False
    actions = None
    fields = (
        "when",
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

    def get_list_display(self, request: HttpRequest) -> Any:
        """Without the lease column when the list shows one lease's history: its columns
        need the room. (The previous holder of a takeover is in its detail.)"""
        if request.GET.get(NameFilter.parameter_name):
            return tuple(column for column in self.list_display if column != "lease")
        return self.list_display

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        # The times are the events' own: no need to read the store's clock (nor the store).
        extra = {**Store.current().header(clock=False), **(extra_context or {})}
        return super().changelist_view(request, extra)

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

    @admin.display(description=_("at"), ordering="at")
    def when(self, event: LeaseEvent) -> str:
        return times.html(from_orm(event.at, event._state.db or Store.current().history_db))

    @admin.display(description=_("lease"), ordering="name")
    def lease(self, event: LeaseEvent) -> str:
        url = reverse(
            "admin:django_leader_lease_change",
            args=[quote(event.name)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, identity_html(event.name))

    @admin.display(description=_("holder"), ordering="holder")
    def holder_id(self, event: LeaseEvent) -> str:
        return identity_html(event.holder, "")

    @admin.display(description=_("actor"))
    def actor_name(self, event: LeaseEvent) -> str:
        return identity_html(event.actor, "")

    @admin.display(description=_("detail"))
    def short_detail(self, event: LeaseEvent) -> str:
        text = event.detail
        if len(text) <= 80:
            return text
        return format_html('<span title="{}">{}</span>', text, text[:79] + "…")
