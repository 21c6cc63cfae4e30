"""The contract every lease store fulfils.

The election loop (``elector.py``), the lock renewer (``locks.py``), the admin, the beat
scheduler, the system checks and the history know nothing about storage: they talk to a
:class:`Backend` through the methods below, exchanging :class:`~django_leader.lease.Lease`
records. Nothing outside ``django_leader.backends`` asks which store it is talking to.

A third-party store subclasses :class:`Backend`, implements the six abstract methods and
overrides whichever optional ones it can do better than their defaults. It is chosen with
``DJANGO_LEADER["BACKEND"]`` (a dotted path to the class), built with no argument, or with
``timeout=<seconds>`` (a bound shorter than the settings' call timeout, see
:func:`django_leader.backends.get_backend`), and shared by every thread of the process.

**The lease operations** (:meth:`Backend.acquire`, :meth:`~Backend.renew`,
:meth:`~Backend.release`, :meth:`~Backend.read`, :meth:`~Backend.force_release`) are each
**one atomic decision made by the store with the store's own clock**: a client clock never
enters into who holds a lease. Fencing tokens of a name only ever grow, even across a store
that loses state (see docs/safety.md).

**Bounded calls.** Every method may raise :class:`~django_leader.exceptions.BackendUnavailable`
when the store cannot be reached, and must return or raise within the call timeout
(``DJANGO_LEADER["LEASE_TTL"]``'s share, or the ``timeout`` given to the constructor): a
holder cut off from its store must learn it before its lease runs out.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import NotSupportedError
from ..lease import Lease

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ..conf import LeaderSettings
    from .slots import SlotStore

logger = logging.getLogger("django_leader")


class Backend(ABC):
    """A lease store.

    Every method may raise :class:`~django_leader.exceptions.BackendUnavailable` when the
    store cannot be reached; each call is bounded by a timeout shorter than a renew deadline.
    """

    # -- lease operations (abstract) ------------------------------------------------------
    @abstractmethod
    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        """Take ``name`` for ``holder`` if it is free, released or expired.

        Returns ``(acquired, current)``: ``acquired`` is the new lease (fencing token one
        greater than any before it) or None; ``current`` is whoever holds it now (the new
        lease itself when acquired), or None if nobody does (or nobody may take it yet, e.g.
        during a lock-delay after the store lost state).

        An acquisition is written to the history (``acquired``, or ``taken_over`` when the
        previous holder's term had expired) by the store itself, see :meth:`record`.
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
        ``actor``). Returns the lease that was released, or None if nobody held it.

        The term is not cut short: its holder hears of it at its next renewal, and nobody may
        take the lease before the term ends (the holder might still act on it)."""

    # -- batched renewal, wake-ups ----------------------------------------------------------
    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases``; the results in the same order.

        The default renews them one by one. A store that can renew many leases in one round
        trip overrides it; each lease is still renewed or refused on its own, exactly as by
        :meth:`renew`. Raises ``BackendUnavailable`` if the store cannot be reached (then
        some of the leases may have been renewed: the caller treats none as renewed)."""
        return [self.renew(lease, ttl) for lease in leases]

    def watch(self, name: str, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Ask the store to call ``callback()`` (from any thread) when ``name`` may have
        changed hands: released, expired, force-released.

        Returns a function that stops the watch, or None when the store cannot push
        (the default): waiting candidates then poll every ``RETRY_INTERVAL``. A wake-up is
        only a hint to try :meth:`acquire` early, never a part of the lease decision; a
        store may call ``callback`` spuriously, and may miss changes.
        """
        return None

    # -- the store's clock ----------------------------------------------------------------
    def now(self) -> datetime:
        """The store's clock: an aware UTC datetime.

        The clock every lease time of this store is in (``expires_at``, ``read_at``), used
        wherever a client must compare with them (the admin's time left, beat's slot times).
        The default is **this process's clock**, right only for a store that lives in this
        process (``MemoryBackend``); a shared store returns its server's time."""
        return datetime.now(timezone.utc)

    # -- candidates -------------------------------------------------------------------------
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

    # -- history ----------------------------------------------------------------------------
    #: The database alias the history (``django_leader.models.LeaseEvent``) is written to,
    #: or None without history.
    history_database: str | None = None

    def flush_history(self, timeout: float | None = None) -> bool:
        """Block until history events noticed so far are written; False on timeout.

        A store that writes its history in the lease operation's own transaction has nothing
        to wait for (the default)."""
        return True

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:  # noqa: B027
        """Write a history event noticed by the client (``kind``: an
        :class:`~django_leader.lease.EventKind`, e.g. ``LOST``); best effort, never raises.

        The store records its own decisions itself (acquired, taken_over, released,
        forced_release), in :meth:`acquire`, :meth:`release` and :meth:`force_release`. The
        default writes nothing."""

    # -- fencing ----------------------------------------------------------------------------
    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        """A transaction whose writes commit only while ``lease`` is still held.

        Only a store that is the same database as the writes can make this sound; the
        default raises :class:`~django_leader.exceptions.NotSupportedError`.
        """
        raise NotSupportedError(
            f"{type(self).__name__} cannot fence database writes; use the database backend"
        )
        yield  # pragma: no cover

    # -- beat slot records ------------------------------------------------------------------
    #: True if :meth:`slots` keeps the records in the store itself, shared by every beat and
    #: written only under the lease (fenced). False (the default): each beat process keeps
    #: its own, and a failover may send an entry's last slot again (system check W012).
    shared_slots: ClassVar[bool] = False

    def slots(self) -> SlotStore:
        """The store of ``LeaderScheduler``'s slot records that goes with this backend
        (see :class:`django_leader.backends.slots.SlotStore`). Each call returns a new one.

        The default keeps them in this process only (:class:`~.slots.LocalSlots`) and logs
        a warning saying so; a store that can fence them sets :attr:`shared_slots` and
        overrides this."""
        from .slots import LocalSlots

        logger.warning(
            "%r cannot fence the beat's shared slot records: they are kept in this process "
            "only, and a failover may send an entry's last slot again",
            self,
        )
        return LocalSlots()

    # -- what the admin and the checks need -------------------------------------------------
    #: The Django database alias whose ``django_leader.models.Lease`` rows ARE this store's
    #: state (the admin then lists them with a queryset), or None when the store is elsewhere
    #: and each lease is read live with :meth:`read`.
    rows_database: str | None = None

    def now_expression(self) -> Any:
        """A Django query expression for :meth:`now` usable in querysets over the ``Lease``
        rows of :attr:`rows_database` (e.g. ``.annotate(store_now=...)``,
        ``Q(expires_at__gt=...)``). Only for a store with rows; the default raises
        :class:`~django_leader.exceptions.NotSupportedError`."""
        raise NotSupportedError(f"{type(self).__name__} keeps no Lease rows in a database")

    def describe(self) -> str:
        """One line naming the store for operators (shown atop the admin's lease list)."""
        history = (
            f"history from database {self.history_database!r}"
            if self.history_database
            else "no history"
        )
        return f"{type(self).__name__}: live state read from the store; {history}."

    @classmethod
    def check_configuration(cls, conf: LeaderSettings) -> list[CheckMessage]:
        """System check messages (``manage.py check``) about the settings ``conf`` for this
        backend class, which ``DJANGO_LEADER["BACKEND"]`` names. Called without an instance:
        it must not need the store to be reachable. The default finds nothing."""
        return []

    def close(self) -> None:  # noqa: B027
        """Close the calling thread's connection to the store, if any."""
