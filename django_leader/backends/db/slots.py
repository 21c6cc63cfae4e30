"""The database backend's beat slot records: ``BeatSlot`` rows in the lease database.

Written inside the lease's fenced transaction (:meth:`DatabaseBackend.fenced
<django_leader.backends.db.DatabaseBackend.fenced>`: one transaction that first locks the
lease row and checks holder, token and expiry by the database's clock).

The slot store works on the beat thread's own Django connection (``fenced()`` needs it).
That connection is never recycled by a request cycle, so a connection the server closed (a
restart, a failover, a proxy, ``wait_timeout``) would fail every call after it: before each
call, a connection that had an error and no longer works is closed (as Django's
``close_if_unusable_or_obsolete`` does, a healthy one is kept), and a call that failed on
such a connection is made once more on a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any, TypeVar

from django.db import DatabaseError, connections

from ...exceptions import BackendUnavailable
from ...lease import Lease
from ..slots import Slot, SlotStore
from .dialect import Dialect, aware
from .recycling import close_if_unusable, driver_error, interrupted

logger = logging.getLogger("django_leader.celery")

T = TypeVar("T")


class DatabaseSlots(SlotStore):
    """``BeatSlot`` rows in the lease database, written inside ``lease.fenced()``, on this
    thread's Django connection (replaced when the server closed it, see the module)."""

    def __init__(
        self,
        alias: str,
        dialect: Dialect,
        fenced: Callable[[Lease], AbstractContextManager[None]],
    ) -> None:
        self.alias = alias
        # The server's clock (e.g. statement_timestamp()), read as an instant.
        self.now_sql = dialect.read_now()
        #: The store's ``fenced()``: a transaction that commits only under the lease.
        self.fenced = fenced

    def _rows(self) -> Any:
        from ...models import BeatSlot

        return BeatSlot.objects.using(self.alias)

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``; once more on a new connection if it failed on one the server closed.
        Database errors become ``BackendUnavailable``."""
        retried = False
        while True:
            close_if_unusable(self.alias)
            connection = connections[self.alias]
            used = connection.connection
            try:
                return fn()
            except (DatabaseError, driver_error(self.alias)) as exc:
                hidden = interrupted(exc, self.alias)
                if hidden is not None:  # a stop request, say: not a failure to retry
                    close_if_unusable(self.alias)
                    raise hidden from None
                # An open connection that this failure showed dead — closed, or already
                # replaced, by the failed transaction's rollback, or found unusable now:
                # once more, on a new one.
                died = used is not None and (
                    connection.connection is not used or close_if_unusable(self.alias)
                )
                if not retried and died:
                    retried = True
                    logger.info(
                        "database %r closed the beat's connection: reconnecting",
                        self.alias,
                    )
                    continue
                raise BackendUnavailable(f"database {self.alias!r}: {exc}") from exc

    def load(self, lease: Lease) -> dict[str, Slot]:
        from ...models import from_orm

        def load() -> dict[str, Slot]:
            # Each time as an instant, whatever USE_TZ (written with to_orm: claim()).
            return {
                row.entry: Slot(
                    row.entry,
                    from_orm(row.at, self.alias),
                    row.token,
                    row.holder,
                    row.task_id,
                    row.sent,
                )
                for row in self._rows().filter(lease=lease.name)
            }

        return self._call(load)

    def claim(self, lease: Lease, slot: Slot) -> None:
        from ...models import to_orm

        def claim() -> None:
            with self.fenced(lease):
                self._rows().update_or_create(
                    lease=lease.name,
                    entry=slot.entry,
                    defaults={
                        "at": to_orm(slot.at, self.alias),
                        "token": slot.token,
                        "holder": slot.holder,
                        "task_id": slot.task_id,
                        "sent": False,
                    },
                )

        self._call(claim)

    def confirm(self, lease: Lease, slot: Slot) -> bool:
        def confirm() -> int:
            return int(
                self._rows()
                .filter(lease=lease.name, entry=slot.entry, token=slot.token, task_id=slot.task_id)
                .update(sent=True)
            )

        return self._call(confirm) == 1

    def now(self) -> datetime:
        def now() -> Any:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(f"SELECT {self.now_sql}", [])  # (params: "%%" is "%")
                return cursor.fetchone()[0]

        value = aware(self._call(now))
        if value is None:
            raise BackendUnavailable(f"database {self.alias!r}: no time from {self.now_sql}")
        return value.astimezone(timezone.utc)
