"""The contract every lease store fulfils.

The election loop (``elector.py``) and the lock renewer (``locks.py``) know nothing about
storage; they talk to a :class:`Backend` through the five operations below, exchanging
:class:`~django_leader.lease.Lease` records. Each operation is **one atomic decision made by
the store with the store's own clock**: a client clock never enters into who holds a lease.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

from ..exceptions import NotSupportedError
from ..lease import Lease

logger = logging.getLogger("django_leader")


class Backend(ABC):
    """A lease store.

    Every method may raise :class:`~django_leader.exceptions.BackendUnavailable` when the
    store cannot be reached; each call is bounded by a timeout shorter than a renew deadline.
    """

    @abstractmethod
    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        """Take ``name`` for ``holder`` if it is free, released or expired.

        Returns ``(acquired, current)``: ``acquired`` is the new lease (fencing token one
        greater than any before it) or None; ``current`` is whoever holds it now (the new
        lease itself when acquired), or None if nobody does.
        """

    @abstractmethod
    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend ``lease`` to *store now* + ``ttl`` if ``lease.holder`` still holds it with
        ``lease.token`` and it has not expired. Returns the renewed record or None."""

    @abstractmethod
    def release(self, lease: Lease) -> bool:
        """Free ``name`` if ``lease.holder`` still holds it with ``lease.token``; a no-op
        (returning False) otherwise, so a late release never frees someone else's lease."""

    @abstractmethod
    def read(self, name: str) -> Lease | None:
        """The unexpired lease on ``name`` (a snapshot with ``read_at``, the store's clock),
        or None if nobody holds it."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every lease name the store knows (held or not), sorted."""

    @abstractmethod
    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        """Free ``name`` whoever holds it (an operator's action, recorded in the history with
        ``actor``). Returns the lease that was released, or None if nobody held it."""

    def announce(self, name: str, identity: str, ttl: float) -> None:  # noqa: B027
        """Note that ``identity`` campaigns for ``name``, until *store now* + ``ttl``.

        What :meth:`candidates` reports. Best effort, and never a part of the lease
        decision: a store that does not track candidates ignores it.
        """

    def withdraw(self, name: str, identity: str) -> None:  # noqa: B027
        """Forget that ``identity`` campaigns for ``name`` (it stopped)."""

    def candidates(self, name: str) -> list[str] | None:
        """The identities whose candidacy for ``name`` has not expired (by the store's
        clock), sorted; None if this store does not track candidates."""
        return None

    #: The database alias the history (``LeaseEvent``) is written to, or None without history.
    history_database: str | None = None

    def flush_history(self, timeout: float | None = None) -> bool:
        """Block until history events noticed so far are written; False on timeout."""
        return True

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:  # noqa: B027
        """Write a history event noticed by the client (e.g. ``lost``); best effort."""

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        """A transaction whose writes commit only while ``lease`` is still held.

        Only a store that is the same database as the writes can make this sound.
        """
        raise NotSupportedError(
            f"{type(self).__name__} cannot fence database writes; use the database backend"
        )
        yield  # pragma: no cover

    def close(self) -> None:  # noqa: B027
        """Close the calling thread's connection to the store, if any."""
