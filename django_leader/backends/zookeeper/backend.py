""":class:`ZooKeeperBackend`: leases in a ZooKeeper ensemble (the package's docstring
describes its znodes). The operations live in the modules it is made of: the session,
paths and clock in :mod:`.ensemble`, leases in :mod:`.leases` and :mod:`.renewal`,
candidates in :mod:`.candidates`; here, the wake-ups, the hand-over request, the beat's
slot records and what the admin and the checks need."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, ClassVar

from ...conf import get_settings
from ...exceptions import BackendUnavailable
from ...lease import EventKind, Lease
from ..base import Watch
from .candidates import Candidacies
from .layout import to_ms, to_time
from .renewal import BatchRenewal
from .retention import Retention
from .slots import ZooKeeperSlots
from .watches import Hub

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ...conf import LeaderSettings


class ZooKeeperBackend(Candidacies, BatchRenewal, Retention):
    """Leases in the ZooKeeper ensemble of ``DJANGO_LEADER["ZOOKEEPER"]``."""

    # -- wake-ups and hand-over -------------------------------------------------------------
    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """ZooKeeper watches: a race watcher watches the lease node (woken when it goes)
        and the name's door bell; a queued candidate watches its own bell and the node
        before its own in the queue (the head: the lease node)."""
        with self._lock:
            if self._hub is None:
                self._hub = Hub(self)
            hub = self._hub
        return hub.watch(name, identity, callback)

    def wake(self, name: str, identity: str | None = None) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        client = self.client
        path = self._bell_path(name, identity)
        try:
            self._wait(client.set_async(path, b""))
        except NoNodeError:
            # Never watched, or lost with the store: creating it rings it too.
            with suppress(NodeExistsError):
                self._wait(client.create_async(path, b"", makepath=True))

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        from kazoo.exceptions import BadVersionError

        client = self.client
        path = self._name_path(name)
        self._ensure(client, path)
        for _ in range(10):
            found = self._get(client, path)
            if found is None:  # deleted meanwhile (the store was wiped): make it again
                self._ensure(client, path, anew=True)
                continue
            record, stat = found
            now = self._now_ms()
            updated = {**record, "handover_to": to, "handover_until": now + to_ms(window)}
            try:
                self._wait(
                    client.set_async(path, json.dumps(updated).encode(), version=stat.version)
                )
            except BadVersionError:
                continue
            lease = self.read(name)
            self._record(
                EventKind.HANDOVER,
                lease or Lease(name, "", 0, None, None, None, 0),
                to_time(now),
                detail=detail or f"to {to}",
                actor=actor,
            )
            return lease
        raise BackendUnavailable(f"zookeeper: hand-over request for {name!r} kept conflicting")

    # -- beat slot records ------------------------------------------------------------------
    #: Beat slot records are znodes beside the lease's, written in a ``multi`` that checks
    #: the lease znode's version first.
    shared_slots: ClassVar[bool] = True

    def slots(self) -> ZooKeeperSlots:
        return ZooKeeperSlots(self)

    # -- what the admin and the checks need -------------------------------------------------
    def describe(self) -> str:
        history = self.history_database or get_settings().database
        return (
            f"{type(self).__name__} {self.conf.hosts!r} {self.root!r}: live state read from "
            f"the ensemble; history from database {history!r}."
        )

    @classmethod
    def check_configuration(cls, conf: LeaderSettings) -> list[CheckMessage]:
        """E005: kazoo must be installed."""
        from django.core.checks import Error

        try:
            import kazoo  # noqa: F401
        except ImportError:
            return [
                Error(
                    "DJANGO_LEADER['BACKEND'] is the ZooKeeper backend, but kazoo is not installed",
                    hint="pip install 'django-leader[zookeeper]'",
                    id="django_leader.E005",
                )
            ]
        return []
