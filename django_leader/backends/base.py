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
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..exceptions import NotSupportedError
from ..lease import Lease

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ..conf import LeaderSettings
    from ..election import Candidate, Mode
    from .slots import SlotStore

logger = logging.getLogger("django_leader")


class Watch(Protocol):
    """What :meth:`Backend.watch` returns."""

    @property
    def live(self) -> bool:
        """True while the store can push wake-ups (its connection is up): a waiting
        candidate may then poll less often."""

    def close(self) -> None:
        """End the watch (idempotent)."""


#: The advice a store without its marker logs with its lock-delay.
NEW_STORE_HINT = (
    "If the store is new (never used for leases), `manage.py leader init` once before the "
    "first lock skips this wait; never run it after a loss."
)


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

    def read_many(self, names: Sequence[str]) -> list[Lease | None]:
        """:meth:`read` each of ``names``; the answers in the same order. What ``leader
        status`` reads for every name the store knows, so its cost should not be a round
        trip per name: the default reads them one by one; a store that can read many in
        one round trip does (Redis, the databases)."""
        return [self.read(name) for name in names]

    @abstractmethod
    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        """Free ``name`` whoever holds it (an operator's action, recorded in the history with
        ``actor``). Returns the lease that was released, or None if nobody held it.

        The term is not cut short: its holder hears of it at its next renewal, and nobody may
        take the lease before the term ends (the holder might still act on it)."""

    # -- batched renewal, wake-ups ----------------------------------------------------------
    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases``; the results in the same order.

        What the process's :class:`~django_leader.session.Session` calls, once per renewal
        interval, for every lease it holds on this store (up to many thousands).

        The default renews them one by one. A store that can renew many leases in one round
        trip overrides it (every shipped store does); each lease is still renewed or refused
        on its own, exactly as by :meth:`renew`. A lease listed more than once may be
        renewed once, every occurrence getting that answer. A lease whose renewal must wait
        (a row lock) should delay neither the others' renewal in the store nor their
        answers: the store may raise ``RenewedInPart`` (``backends/partial.py``) with the
        answers of all leases and the positions of those it could not decide (the session
        applies the others and tries those again). Raises ``BackendUnavailable`` if the
        store cannot be reached (then some of the leases may have been renewed: the caller
        treats none as renewed and tries again)."""
        return [self.renew(lease, ttl) for lease in leases]

    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """Ask the store to call ``callback()`` (from a thread of its own) when ``name`` may
        be taken: without ``identity``, on every :meth:`release` of ``name`` and every
        ``wake(name)`` (what the candidates of a race and the observers watch); with
        ``identity``, only on ``wake(name, identity)`` (the next in a fifo or priority
        queue, woken by the releaser alone: no herd).

        Returns a :class:`Watch` (``close()`` ends it), or None when the store cannot push
        (the default): waiting candidates then poll every ``RETRY_INTERVAL``. A wake-up is
        only a hint to try :meth:`acquire` early, never a part of the lease decision: a
        store may call ``callback`` spuriously (it does after reconnecting, since it may
        have missed one), and may miss wake-ups while ``Watch.live`` is False. A store that
        can push wakes the name's watchers from :meth:`release` itself, at no extra round
        trip where it can.
        """
        return None

    def wake(self, name: str, identity: str | None = None) -> None:  # noqa: B027
        """Wake the watchers of ``name`` (``identity`` None) or the one candidate watching
        for ``identity``. Best effort; the default does nothing."""

    # -- hand-over on demand -----------------------------------------------------------------
    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        """Ask the holder of ``name`` to hand it over to ``to``: the holder learns of it from
        its next :meth:`renew` (``Lease.handover_to``) and releases; for ``window`` seconds
        from now (store clock) nobody but ``to`` may :meth:`acquire` the name (not even a
        free one). Recorded in the history (``handover``, with ``actor``). Returns the
        lease held when asked (None if nobody held it: then only the gate applies).

        The default raises :class:`~django_leader.exceptions.NotSupportedError`."""
        raise NotSupportedError(f"{type(self).__name__} cannot hand a lease over")

    # -- the store's clock ----------------------------------------------------------------
    def now(self) -> datetime:
        """The store's clock: an aware UTC datetime.

        The clock every lease time of this store is in (``expires_at``, ``read_at``), used
        wherever a client must compare with them (the admin's time left, beat's slot times).
        The default is **this process's clock**, right only for a store that lives in this
        process (``MemoryBackend``); a shared store returns its server's time."""
        return datetime.now(timezone.utc)

    # -- candidates -------------------------------------------------------------------------
    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:  # noqa: B027
        """Register ``candidate`` as campaigning for ``name``, or renew its heartbeat, until
        *store now* + ``ttl``.

        The first announcement (or the first after its last one expired or was withdrawn)
        puts it at the tail of the queue: the store gives it a ``seq`` greater than every
        other of the name's and ``joined_at``; later ones update ``seen_at``,
        ``expires_at`` and its ``priority``, keeping its place. What :meth:`candidates`
        reports, what the ``fifo`` and ``priority`` modes read; never part of the lease
        decision. A store that keeps no registry ignores it (the default).
        """

    def withdraw(self, name: str, identity: str) -> None:  # noqa: B027
        """Forget that ``identity`` campaigns for ``name`` (it stopped, or leads now)."""

    def candidates(self, name: str) -> list[Candidate] | None:
        """The candidates of ``name`` whose heartbeat has not expired (by the store's clock)
        in join order (``seq``); None if this store keeps no registry."""
        return None

    def candidates_many(self, names: Sequence[str]) -> list[list[Candidate] | None]:
        """:meth:`candidates` of each of ``names``, in the same order (one by one by
        default; in one round trip per batch where the store can)."""
        return [self.candidates(name) for name in names]

    def next_in_line(
        self, name: str, mode: Mode | str, *, holder: str | None = None
    ) -> Candidate | None:
        """Whose turn comes after ``holder``'s in ``mode`` (``race`` and ``fifo``: the live
        candidate that joined first; ``priority``: the highest priority, ties in join
        order), ``holder`` left out; None if nobody waits or the store keeps no registry.

        What a hand-over reads, so its cost should not grow with the queue: the default
        reads the whole registry (:meth:`candidates`); a store whose registry is large
        and not one round trip answers in a few requests whatever its length (Redis and
        ZooKeeper, in join order)."""
        from ..election import next_in_line

        members = self.candidates(name)
        return None if members is None else next_in_line(members, mode, holder=holder)

    def queued_ahead(self, name: str, identity: str) -> int | None:
        """How many entries of ``name``'s registry are ahead of ``identity`` in join
        order, live or not (so at least its place in a ``fifo`` queue): those that joined
        before its entry, or all of them if it has none (it would join behind them).
        Only where the store lists its registry for less than :meth:`candidates` reads
        it: one request whatever its length, no entry's heartbeat read (ZooKeeper, where
        :meth:`candidates` reads each entry); a waiting ``fifo`` candidate then reads it,
        the lease and :meth:`next_in_line` instead of :meth:`candidates`. None by default:
        the candidate reads :meth:`candidates`."""
        return None

    # -- history ----------------------------------------------------------------------------
    #: The database alias the history (``django_leader.models.LeaseEvent``) is written to,
    #: or None without history.
    history_database: str | None = None

    #: Seconds within which the driver itself ends any one call of this backend, made from
    #: any thread (its socket timeouts: a free connection, connecting, the answer); None if
    #: it does not. A holder's call whose bound is at least this runs in the holder's own
    #: thread; others run on a thread of the process's session, which stops waiting at the
    #: bound (see docs/safety.md, "Bounded store calls").
    driver_bound: float | None = None

    def prune(self, unused_for: timedelta, *, batch: int = 500) -> int:
        """Forget the names nobody has held for ``unused_for`` (by the store's clock: the
        last term ended before then) and nobody campaigns for: their lease state in the
        store, their candidates' records, their history (``manage.py leader prune``). No
        name's fencing tokens go backwards (SPEC rule 3): a name taken again after it was
        forgotten gets a token greater than any it had. Runs in batches of ``batch`` names
        (a few statements or one pipeline each); returns how many names were forgotten.
        Optional: the default keeps everything (0)."""
        return 0

    def initialize(self) -> bool | None:
        """Mark a store **never used before** as new, so that its first acquisition does
        not wait out the lock-delay that a store which lost its state costs (SPEC rule 7;
        a store without its marker cannot tell "new" from "forgot"). True if this call
        marked it, False if it was marked already, None if the store keeps no such marker
        (the default: the database backend notices a lost row per name). ``manage.py
        leader init`` calls it, and so does ``migrate`` when it creates django-leader's
        tables. Never after a flush, a restart or a restore: let the store notice the
        loss."""
        return None

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
    def fenced(self, lease: Lease, using: str | None = None) -> Iterator[None]:
        """A transaction on Django database ``using`` (default: ``DJANGO_LEADER["DATABASE"]``)
        whose writes commit only if no greater token of ``lease.name`` wrote through it
        before them, and only before the lease's local deadline; else
        :class:`~django_leader.exceptions.LeadershipLost` (rolled back).

        The default checks the token against the name's fence row in that database
        (``LeaseFence``, see ``django_leader/backends/fence_row.py``), locked until the
        transaction ends, so writes commit in token order: the database refuses what a
        holder paused past its lease writes once its successor has written. It does not
        ask the store whether the lease is still held (a store that is the database the
        writes go to can, and does: the database backend). Bounded by the lease as the
        database backend's is (see :meth:`DatabaseBackend.fenced
        <django_leader.backends.db.DatabaseBackend.fenced>`).
        """
        from ..conf import get_settings
        from .fence_row import fence_row_transaction

        with fence_row_transaction(using or get_settings().database, lease):
            yield

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

    # -- reachability -----------------------------------------------------------------------
    @classmethod
    def check_replication(cls, conf: LeaderSettings, timeout: float) -> list[CheckMessage]:
        """System check messages on what a failover of the store's replicas can do with
        leases (SPEC rule 9), asking the store within ``timeout`` seconds; nothing when it
        does not answer. Run by ``manage.py check --database <alias>`` (a database check:
        never on every command). The default: none."""
        return []

    def ping(self, timeout: float) -> float:
        """Seconds one round trip to the store took, within ``timeout``; else
        :class:`~django_leader.exceptions.BackendUnavailable`. Optional: the default raises
        :class:`~django_leader.exceptions.NotSupportedError`."""
        raise NotSupportedError(f"{type(self).__name__} cannot be pinged")

    @classmethod
    def answers_ping(cls) -> bool:
        """True if the store implements :meth:`ping`: the database-tagged system check
        (W017) then asks it whether it answers within the connect timeout."""
        return cls.ping is not Backend.ping

    def own_transaction(self) -> str:
        """Why the calling thread itself may keep the store busy: its own transaction on
        it, still open (then a :class:`~django_leader.exceptions.StoreBusy` answer is not
        waited out, the wait would be for the caller itself); ``''`` if none. Optional:
        the default says none."""
        return ""

    def shutdown(self) -> None:
        """Release everything this instance holds open (a store with a session of its own
        ends it); the default closes the calling thread's connection."""
        self.close()

    def close(self) -> None:  # noqa: B027
        """Close the calling thread's connection to the store, if any."""
