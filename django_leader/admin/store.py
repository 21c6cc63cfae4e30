"""Where the admin reads leases and history for one request, and the store's clock.

:class:`Store` tells the admin whether the leases are rows of the ``Lease`` table (the
database backend: state computed in SQL with the database server's clock, :class:`StoreNow`)
or live in another store read lease by lease; the ``_*_q`` helpers are the lease states as
SQL conditions on that clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from ..backends import get_backend
from ..backends.base import Backend
from ..backends.db import DatabaseBackend
from ..conf import get_settings
from ..models import Lease, LeaseEvent

logger = logging.getLogger("django_leader")


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
