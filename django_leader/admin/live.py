"""The lease list of a store that is not the database: each shown lease read live from it.

The names come from the store (from the history, for a store that cannot list them) and
are searched and paginated here; only the leases of the page are read, one read each. A
lease the store does not hold is shown free, with its last token and holder from the
history.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import InvalidPage, Paginator
from django.http import HttpRequest

from ..exceptions import BackendUnavailable
from ..lease import Lease as LeaseRecord
from ..models import Lease, LeaseEvent
from .constants import FREE, LEADING, UNKNOWN
from .store import Store


class LiveLeaseChangeList(ChangeList):
    """The lease list of a store that is not the database: one live read per shown lease."""

    def get_results(self, request: HttpRequest) -> None:
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
        self.result_list = live_rows(request, store, shown)
        self.paginator = paginator


def live_rows(
    request: HttpRequest, store: Store, names: list[str], known_only: bool = False
) -> list[Lease]:
    """Unsaved ``Lease`` rows showing what the live store says about ``names``.

    With ``known_only``, a name the store and the history do not know gives no row.
    """
    rows: list[Lease] = []
    now: datetime | None = None
    try:
        leases: list[LeaseRecord | None] = store.backend.read_many(names)  # a page at once
    except BackendUnavailable as exc:
        messages.error(request, f"Cannot read the lease store: {exc}")
        return [_row(name, None, None, UNKNOWN) for name in names]
    for name, lease in zip(names, leases, strict=True):
        if lease is not None:
            read_at = getattr(lease, "read_at", None)
            if read_at is None:
                now = now or store.now()
            rows.append(_row(name, lease, read_at or now, LEADING))
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
        row = _row(name, None, now, FREE)
        if last is not None:
            row.token = last.token
            row.previous_holder = last.holder
        rows.append(row)
    return rows


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
