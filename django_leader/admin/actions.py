"""What a user allowed to (``django_leader.release_lease``) does to leases in the admin:
force release and hand-over, as actions on the list and as buttons on a lease's page.

Both need a POST with a CSRF token, are recorded in the history with the acting user, and
come back to the lease's page as it was (its timeline range and the list's filters).
Hand-over (:mod:`django_leader.handover`): the holder steps down at its next renewal and only
the chosen candidate may take the lease.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..exceptions import BackendUnavailable, NotSupportedError
from ..handover import HandoverRefused, NobodyHolds, ask_for_handover
from ..models import Lease
from .constants import FREE, LEADING, STATE_LABELS
from .periods import format_duration
from .store import Store

#: The query parameters a lease's page keeps across force release: its timeline range and
#: the filters of the list it was opened from.
KEPT_PARAMETERS = ("timeline", "_changelist_filters")


def kept_query(request: HttpRequest) -> str:
    """``?timeline=…`` (and the list's filters) of this request, to come back with."""
    kept = {key: request.GET[key] for key in KEPT_PARAMETERS if request.GET.get(key)}
    return "?" + urlencode(kept) if kept else ""


def _state_of(row: Lease) -> str:
    state = getattr(row, "lease_state", None)
    if state:
        return str(state)
    return FREE if not row.holder else LEADING


class LeaseActions(admin.ModelAdmin):
    """Force release and hand-over of leases (mixed into ``LeaseAdmin``)."""

    def has_release_permission(self, request: HttpRequest) -> bool:
        """``django_leader.release_lease`` (and seeing leases at all)."""
        user: Any = request.user
        return self.has_view_permission(request) and user.has_perm(
            f"{self.opts.app_label}.release_lease"
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
        ) + kept_query(request)
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
        self._force_release(request, self._selected(request, queryset), "")

    @staticmethod
    def _selected(request: HttpRequest, queryset: QuerySet[Any]) -> list[str]:
        """The names an action was asked for (a store without rows: from the form)."""
        store = Store.current()
        if not store.live:
            return list(queryset.values_list("name", flat=True))
        if request.POST.get("select_across") == "1":
            return store.names()
        return request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)

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

    # -- hand-over -----------------------------------------------------------------------
    def handover_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST (with CSRF token): hand the lease over to ``to`` (default: the next in
        line), then back to the lease's page. Nothing else is allowed."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_release_permission(request):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))
        if row is None:
            raise Http404(f"No lease named {unquote(object_id)!r}")
        to = request.POST.get("to") or None
        self._hand_over(request, [row.name], to, request.POST.get("reason", ""))
        return HttpResponseRedirect(
            reverse(
                "admin:django_leader_lease_change",
                args=[quote(row.name)],
                current_app=self.admin_site.name,
            )
            + kept_query(request)
        )

    @admin.action(
        description=_("Hand the selected leases over to the next in line"),
        permissions=["release"],
    )
    def hand_over(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._hand_over(request, self._selected(request, queryset), None, "")

    def _hand_over(
        self, request: HttpRequest, names: list[str], to: str | None, reason: str
    ) -> None:
        store = Store.current()
        user: Any = request.user
        actor = user.get_username()
        reason = " ".join(reason.split())[:400] or "in the Django admin"
        for name in names:
            try:
                asked = ask_for_handover(store.backend, name, to, actor=actor, reason=reason)
            except NobodyHolds:
                messages.warning(request, f"“{name}” was not held: nothing to hand over.")
                continue
            except (HandoverRefused, NotSupportedError, BackendUnavailable) as exc:
                messages.error(request, f"Could not hand “{name}” over: {exc}")
                continue
            lease = asked.holder
            self.log_change(
                request,
                Lease(name=name),
                f"Handed over to {asked.to} (held by {lease.holder}, token {lease.token}): "
                f"{reason}",
            )
            messages.success(
                request,
                f"“{name}”: {lease.holder} (token {lease.token}) hands over to {asked.to} at "
                f"its next renewal; only {asked.to} may take the lease for the next "
                f"{format_duration(asked.window)}.",
            )
            if asked.outranked_by is not None:
                messages.warning(
                    request,
                    f"The election mode is priority: {asked.outranked_by.identity} outranks "
                    f"{asked.to} and takes “{name}” back at {asked.to}'s next renewal.",
                )
        if not store.backend.flush_history(5):
            messages.warning(request, "The history event is not written yet.")
