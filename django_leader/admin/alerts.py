"""The dashboard's alerts: a lease without a leader that should have one, and a flapping
lease. Pure logic over plain values, like :mod:`~django_leader.admin.periods`.

* **no leader** (:func:`no_leader`): nobody holds the lease now (by the store's clock),
  its last history event is older than ``grace`` (the dashboard uses ``LEASE_TTL +
  RETRY_INTERVAL``, the longest a takeover takes), and either candidates are waiting for
  it, or its last term did not end with a release: it expired unreleased, was lost or was
  force-released. A lease its holder released, with nobody waiting, is idle: no alert.
* **flapping** (:func:`flapping`): more than ``limit`` transitions (acquisitions and
  takeovers, what the lease's ``transitions`` counter counts) within the last ``window``.
* **behind** (:func:`behind`): a leader holds the lease, and an entry of
  ``TASKS_SCHEDULE`` whose slots it records has its last recorded slot two periods or more
  in the past: the slot after it, and the one after that, fell due and were not recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..lease import EventKind
from .periods import STARTS, Change, format_duration

NO_LEADER, FLAPPING, BEHIND = "no-leader", "flapping", "behind"


@dataclass(frozen=True)
class Alert:
    """One alert on one lease: ``key`` (:data:`NO_LEADER`, :data:`FLAPPING`), a short
    ``label`` and a ``detail`` saying why."""

    key: str
    label: str
    detail: str


def _waiting(count: int) -> str:
    return f"{count} candidate{'s' if count != 1 else ''} waiting"


def no_leader(
    *,
    holder: str,
    waiting: int,
    last: Change | None,
    now: datetime,
    grace: timedelta,
) -> Alert | None:
    """The "no leader" alert, or None.

    ``holder``: who holds the lease now ("" for nobody); ``waiting``: how many candidates
    other than the holder campaign for it; ``last``: its newest history event (None: no
    history); ``grace``: how long a lease may be without a leader after its last event
    before that is alarming (a handover under way).
    """
    if holder:
        return None
    if last is None:
        if not waiting:
            return None  # no history, nobody waiting: nothing says it should be held
        return Alert(NO_LEADER, "no leader", f"{_waiting(waiting)}; no history says since when")
    quiet = now - last.at
    if quiet <= grace:
        return None  # a release or an expiry is being taken over
    ago = format_duration(quiet.total_seconds())
    kind = last.kind
    if kind == EventKind.RELEASED.value:
        if not waiting:
            return None  # released by its holder, nobody wants it: idle
        why = f"released {ago} ago"
    elif kind in STARTS:
        why = f"the term of {last.holder} (token {last.token}) expired unreleased"
    elif kind == EventKind.LOST.value:
        why = f"lost by {last.holder} {ago} ago"
    else:
        why = f"force-released {ago} ago"
    if waiting:
        why += f"; {_waiting(waiting)}"
    return Alert(NO_LEADER, "no leader", why)


def flapping(transitions: int, *, window: timedelta, limit: int) -> Alert | None:
    """The "flapping" alert when ``transitions`` in the last ``window`` exceed ``limit``."""
    if transitions <= limit:
        return None
    span = format_duration(window.total_seconds())
    return Alert(
        FLAPPING,
        "flapping",
        f"{transitions} transitions in the last {span} (more than {limit})",
    )


def behind(
    last_slots: Mapping[str, datetime],
    after: Mapping[str, Callable[[datetime], datetime]],
    now: datetime,
) -> Alert | None:
    """The "behind" alert when an entry's schedule has fallen two periods behind.

    ``last_slots``: entry name -> its last recorded slot (for the lease a leader holds
    now); ``after``: entry name -> the entry's next slot after a given one; ``now``: the
    store's time."""
    late = []
    for name, last in sorted(last_slots.items()):
        next_slot = after[name](last)
        if after[name](next_slot) <= now:
            ago = format_duration((now - last).total_seconds())
            late.append(
                f"{name}: last slot recorded {ago} ago, the next one due since "
                f"{next_slot:%Y-%m-%d %H:%M:%S} UTC"
            )
    if not late:
        return None
    return Alert(BEHIND, "behind", "; ".join(late))
