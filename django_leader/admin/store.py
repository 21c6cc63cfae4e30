"""Where the admin reads leases and history for one request, and the store's clock.

:class:`Store` tells the admin whether the leases are rows of the ``Lease`` table (the
database backend: state computed in SQL with the store's clock, ``now_expression()``)
or live in another store read lease by lease; the ``_*_q`` helpers are the lease states as
SQL conditions on that clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.db.models import Q

from ..backends import get_backend
from ..backends.base import Backend
from ..conf import get_settings
from ..models import Lease, LeaseEvent
from .times import zone_name

logger = logging.getLogger("django_leader")


def _leading_q(now: Any) -> Q:
    return ~Q(holder="") & Q(expires_at__gt=now)


def _expired_q(now: Any) -> Q:
    return ~Q(holder="") & Q(expires_at__lte=now)


def _releasing_q(now: Any) -> Q:
    """Force-released, but the term runs on: nobody may take it before it ends (the
    holder hears of the release only at its next renewal)."""
    return Q(holder="") & Q(expires_at__gt=now)


def _free_q(now: Any) -> Q:
    return Q(holder="") & Q(expires_at__lte=now)


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
        rows = backend.rows_database
        return cls(backend, rows is None, rows or conf.database, history_db)

    def describe(self) -> str:
        return self.backend.describe()

    def now_expression(self) -> Any:
        """The store's clock in a query over the ``Lease`` rows (a store with rows only)."""
        return self.backend.now_expression()

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

    def header(self, clock: bool = True, now: datetime | None = None) -> dict[str, Any]:
        """What the top of each admin page says about the store: which one it is, its clock
        now (``now`` if the page read it already; none if ``clock`` is false: a page that
        needs no reading of the store) and the time zone every time on the page is shown in.
        """
        if clock and now is None:
            now = self.now()
        return {"leader_store": self.describe(), "leader_clock": now, "leader_zone": zone_name(now)}

    def now(self) -> datetime:
        """The store's clock; the web server's only if the store cannot be read."""
        try:
            return self.backend.now()
        except Exception as exc:  # any store failure: fall back to the web clock
            logger.warning("could not read the store's clock: %s", exc)
            return datetime.now(dt_timezone.utc)
