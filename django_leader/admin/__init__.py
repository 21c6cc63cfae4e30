"""The Django admin for leases and their history.

* **Leases**: who holds each lease, with which fencing token, its state (leading / expired
  / free) and time left — computed with the *store's* clock: the database server's
  ``now()`` in the same query for the database backend, the live state read from Redis for
  the cache backend. Nobody edits or adds a lease by hand. Each lease's page shows a
  timeline of who led when (by default over the lease's whole history) and its recent
  history.
* **Dashboard**: every lease on one page, with its leader, the candidates waiting, its last
  transition and its alerts (no leader, flapping).
* **Force release** (an action on the list, a button on the lease's page): needs the
  permission ``django_leader.release_lease``, POST with a CSRF token only, and is recorded
  in the history with the acting user. The holder notices at its next renewal and steps
  down.
* **History** (``LeaseEvent``): read-only for everyone, superusers included; filters by
  lease name, kind and date; newest first; paginated without counting every row of a huge
  table, and with the date drill-down found by index seeks.

Every time is shown to the second, with its zone. The modules, each named after what it
holds:

=================== ======================================================================
``store``           where the admin reads leases and history, and the store's clock
``leases``          ``LeaseAdmin``: the list, its state filter, a lease's page
``actions``         force release and hand-over (``LeaseActions``, mixed into ``LeaseAdmin``)
``live``            the lease list of a store that is not the database, read live
``dashboard``       every lease on one page, read through the backend contract
``alerts``          the dashboard's alerts: no leader, flapping (pure logic)
``history``         ``LeaseEventAdmin``: the read-only history and its filters
``date_hierarchy``  the history's date drill-down by index seeks
``paginator``       the history's pages, counted by the planner's estimate when huge
``timeline``        the queries behind a lease's timeline
``periods``         history events -> who held the lease when, the gaps, the time before
                    the history, the range fitted to it (pure logic)
``drawing``         the timeline as SVG, with its legend
``times``           times as the admin shows them: to the second, with the zone
``readonly``        no add, change or delete, for anyone
``constants``       lease states, limits, timeline ranges, alert thresholds
=================== ======================================================================

Importing this package (Django's admin autodiscovery does) registers both admins with the
default admin site.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import Lease, LeaseDashboard, LeaseEvent
from .dashboard import DashboardEntry
from .date_hierarchy import HistoryChangeList
from .history import LeaseEventAdmin, NameFilter
from .leases import LeaseAdmin, StateFilter
from .live import LiveLeaseChangeList
from .paginator import HistoryPaginator, estimated_rows
from .readonly import ReadOnly
from .store import Store

admin.site.register(Lease, LeaseAdmin)
admin.site.register(LeaseEvent, LeaseEventAdmin)
admin.site.register(LeaseDashboard, DashboardEntry)

__all__ = [
    "DashboardEntry",
    "HistoryChangeList",
    "HistoryPaginator",
    "LeaseAdmin",
    "LeaseEventAdmin",
    "LiveLeaseChangeList",
    "NameFilter",
    "ReadOnly",
    "StateFilter",
    "Store",
    "estimated_rows",
]
