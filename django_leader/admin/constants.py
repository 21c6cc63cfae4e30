"""What the admin shows and how much it reads: lease states, their labels, limits, ranges,
and the dashboard's alert thresholds."""

from __future__ import annotations

from datetime import timedelta

from django.utils.translation import gettext_lazy as _

#: A lease's state in the lease list, by the store's clock.
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
#: Above this many rows (by the planner's estimate) the history shows the estimate instead
#: of counting them.
COUNT_ESTIMATE_ABOVE = 100_000

#: The timeline ranges the lease page offers: name -> (label, length). A length of None is
#: the lease's whole history: from its first recorded event to now.
RANGES: dict[str, tuple[str, timedelta | None]] = {
    "history": ("whole history", None),
    "10min": ("last 10 min", timedelta(minutes=10)),
    "hour": ("last hour", timedelta(hours=1)),
    "day": ("last day", timedelta(days=1)),
    "week": ("last week", timedelta(weeks=1)),
}
#: The range shown when none (or an unknown one) is asked for.
DEFAULT_RANGE = "history"

#: The dashboard reads at most this many leases (a few store reads and two indexed history
#: queries each); beyond that it says so, and a search narrows the list.
DASHBOARD_LEASES = 200
#: "flapping": more than FLAPPING_TRANSITIONS transitions (acquisitions and takeovers, what
#: a lease's ``transitions`` counter counts) within the last FLAPPING_WINDOW.
FLAPPING_TRANSITIONS = 5
FLAPPING_WINDOW = timedelta(minutes=10)
