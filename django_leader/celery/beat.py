"""``LeaderScheduler``: run ``celery beat`` everywhere, let exactly one of them send.

Every beat process campaigns for one lease with an :class:`~django_leader.Elector` of its
own (a background thread, which also renews the lease: a long tick or sleep cannot lose
it). Only the holder builds the scheduler it wraps (``DJANGO_LEADER["BEAT_SCHEDULER"]``)
and hands each tick to it; a follower builds nothing, so it neither sends nor writes any
schedule state, and waits (at most ``RETRY_INTERVAL`` per tick) to be elected.

A slot is sent like this, in the wrapped scheduler's own ``apply_async``:

1. the lease must still be held (``lease.held``, the local deadline rule);
2. the slot (the entry's new ``last_run_at``) is recorded in the shared slot store, fenced
   by the lease token (see :mod:`.state`): refused → not sent, the beat steps down;
3. the message is published, with the slot in its headers;
4. the record is marked sent.

A newly elected beat loads the records and moves each entry's ``last_run_at`` up to its
last recorded slot before its first tick, so it neither repeats a slot its predecessor
recorded nor skips the schedule: a slot that fell due while nobody led is sent once, right
away (Celery's usual catch-up for missed runs). Slot times are recorded in the store's
clock: a beat converts between its wall clock and the store's with the offset of the moment
(the store's time carried forward on the boot clock, see
:class:`~django_leader.backends.slots.StoreClock`, minus the wall clock), so neither a skewed
beat nor one whose wall clock steps during its term shifts the records its successor
continues from. (When the wrapped scheduler sends is its own business, on the wall clock: a
forward step sends each entry once at once, a backward step delays each by the step.)

A leader that cannot do its job :data:`RESIGN_AFTER` times in a row (a slot it cannot
record, the records it cannot read, a wrapped scheduler whose tick fails) while its lease
is still renewed — its own connection broken beyond repair, say — resigns, so that another
beat takes over; it campaigns again after one ``LEASE_TTL``. So does a leader whose tick
has not returned after :data:`STUCK_TTLS` lease lifetimes (a store or broker call that
neither answers nor fails: a watchdog thread sees it). Before each tick, connections of this
thread that an error left unusable are closed (the beat has no request cycle to do it). See
``docs/celery.md``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, ClassVar

from celery import uuid
from celery.beat import Scheduler
from django.apps import apps

from ..backends.db import close_unusable_connections
from ..backends.slots import Slot, SlotStore, StoreClock, entry_key
from ..conf import get_settings, validate_name
from ..exceptions import LeadershipLost
from ..lease import Lease, clock
from .beat_elector import BeatElector
from .wrapped import _leader_class, wrapped_scheduler_class

logger = logging.getLogger("django_leader.celery")

#: Headers added to every message LeaderScheduler sends.
HEADER_ENTRY = "django_leader_entry"
HEADER_SLOT = "django_leader_slot"
HEADER_TOKEN = "django_leader_token"
HEADER_HOLDER = "django_leader_holder"

#: Longest pause between two attempts to build a wrapped scheduler that failed.
MAX_BACKOFF = 30.0

#: A leader that fails this many times in a row to do its job (record a slot, read the
#: records, tick the wrapped scheduler) resigns, so that another beat takes over.
RESIGN_AFTER = 3

#: A leader whose tick (or sync) has not returned after this many ``LEASE_TTL`` — stuck in
#: a call that neither answers nor fails — resigns (its elector still renews the lease).
STUCK_TTLS = 3.0


def _aware(value: datetime, tz: Any) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=tz)


class LeaderScheduler(Scheduler):
    """A Celery beat scheduler that sends only while it holds a lease.

    ``celery beat -S django_leader.celery:LeaderScheduler`` (or ``CELERY_BEAT_SCHEDULER``)
    on every host. It wraps the scheduler named by ``DJANGO_LEADER["BEAT_SCHEDULER"]``
    (default Celery's ``PersistentScheduler``; also django-celery-beat's
    ``DatabaseScheduler``). The lease is named by the Celery setting
    ``beat_leader_lease`` (``CELERY_BEAT_LEADER_LEASE`` in Django settings), default
    ``"celery-beat:<app name>"``; its timing comes from ``DJANGO_LEADER``.
    """

    #: The lease name. Set on a subclass, it overrides the Celery setting
    #: ``beat_leader_lease``; on an instance it is the name in use.
    lease_name: str | None = None

    #: It wraps another scheduler: ``BEAT_SCHEDULER`` must not name it (see ``wrapped``).
    wraps_a_scheduler: ClassVar[bool] = True

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        name = self.lease_name or app.conf.get("beat_leader_lease")
        self.lease_name = validate_name(name or f"celery-beat:{app.main or 'default'}")
        self._wrapped = wrapped_scheduler_class()
        self._inner_cls = _leader_class(self._wrapped)
        self._inner_kwargs = dict(kwargs)
        self._inner: Any = None
        self._elector: BeatElector | None = None
        self._slots: SlotStore | None = None
        self._clock: StoreClock | None = None  # the store's time, carried on the boot clock
        self._last: dict[str, datetime] = {}
        self._closing = False
        self._closed = False
        self._busy = False
        self._failures = 0
        self._strikes = 0  # failures in a row of the current term (see RESIGN_AFTER)
        self._strikes_lease: Lease | None = None
        # The tick or sync running for a term (since when, and which lease), for _watch.
        self._call: tuple[float, Lease] | None = None
        self._watch_stop = threading.Event()
        # Never set up: for max_interval and the banner's `info`.
        self._idle = self._inner_cls(app, lazy=True, **kwargs)
        kwargs["max_interval"] = kwargs.get("max_interval") or self._idle.max_interval
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- Scheduler hooks ------------------------------------------------------------------
    def setup_schedule(self) -> None:
        """Start campaigning (only an instance that runs gets here, never a lazy one)."""

        if not apps.ready:  # celery's Django fixup normally did this already
            import django

            django.setup()
        from django_leader.backends.db import require_tables

        require_tables()  # else the beat campaigns and fails, logged for ever
        self._elector = BeatElector(self, self._name)
        self._slots = self._elector.backend.slots()
        self._clock = StoreClock(self._slots)
        self._elector.start()
        threading.Thread(
            target=self._watch, name=f"leader-beat-watchdog:{self._name}", daemon=True
        ).start()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Follower: wait up to ``RETRY_INTERVAL`` to be elected. Leader: the wrapped
        scheduler's tick (which sends what is due)."""
        with self._running():
            return self._tick(*args, **kwargs)

    def _tick(self, *args: Any, **kwargs: Any) -> float:
        elector = self._elector
        if elector is None or self._closing:
            return self.max_interval
        lease = elector.lease
        if lease is None:
            self._stand_down()
            # Waiting here (not in beat's sleep) lets an elected beat start at once.
            if not elector.wait_for_leadership(self._follower_wait):
                return 0.0
            lease = elector.lease
            if lease is None:
                return 0.0
        self._call = (clock(), lease)
        # No request cycle here: drop connections an error left unusable, or they would
        # fail every call from now on (the wrapped scheduler's and the slot records').
        close_unusable_connections()
        inner = self._inner
        if inner is None or inner._dl_lease is not lease:
            self._stand_down()
            inner = self._take_over(lease)
            if inner is None:
                self._strike(lease, "cannot start sending")
                return self._backoff()
        try:
            interval = inner.tick(*args, **kwargs)
        except Exception:
            # A broken schedule must not crash every beat in turn: log, rebuild later.
            logger.exception(
                "celery beat: %s.tick() failed; this beat stops sending and rebuilds it",
                self._wrapped.__name__,
            )
            self._stand_down()
            self._strike(lease, f"{self._wrapped.__name__}.tick() failed")
            return self._backoff()
        self._failures = 0
        return float(interval)

    def sync(self) -> None:
        inner = self._inner
        if inner is None:
            return
        with self._running():
            if inner._dl_lease is not None:
                self._call = (clock(), inner._dl_lease)
            inner._do_sync()

    @contextmanager
    def _running(self) -> Iterator[None]:
        """A tick or a sync: :meth:`close` waits for its end (``_busy``), and ``_watch``
        times it (``_call``). Beat's SIGTERM/SIGINT handler may call :meth:`close` during
        it and raise SystemExit, which something under it can swallow (a driver's bare
        ``except:``, as kazoo's around its wake-up write): raised again at its end, or the
        beat would go on holding the lease and sending nothing until it is killed."""
        self._busy = True
        try:
            yield
        finally:
            self._busy = False
            self._call = None
            if self._closing and not self._closed:
                raise SystemExit()

    def should_sync(self) -> bool:
        inner = self._inner
        return inner is not None and bool(inner.should_sync())

    def close(self) -> None:
        """Stop sending; sync and close the wrapped scheduler while still leading; release
        the lease so another beat takes over at once. Idempotent."""
        self._closing = True
        if self._busy:
            # Called by beat's SIGTERM/SIGINT handler in the middle of a tick or a sync: the
            # wrapped scheduler may be mid-write. Beat raises SystemExit next and calls
            # close() again once that has unwound; finish then.
            return
        if self._closed:
            return
        self._closed = True
        self._watch_stop.set()
        try:
            self._stand_down()
        finally:
            elector = self._elector
            if elector is not None:
                elector.stop(release=True, timeout=max(1.0, elector.timing.ttl))
            super().close()

    @property
    def schedule(self) -> Any:
        inner = self._inner
        return inner.schedule if inner is not None else {}

    @property
    def info(self) -> str:
        conf = get_settings()
        lines = [
            f"    . leader lease -> {self._name!r} ({conf.backend.rsplit('.', 1)[-1]}, "
            f"ttl {conf.timing.ttl:g}s)",
            f"    . wraps -> {self._wrapped.__module__}.{self._wrapped.__qualname__}",
        ]
        inner_info = self._idle.info
        if inner_info:
            lines.append(inner_info)
        return "\n".join(lines)

    # -- state ----------------------------------------------------------------------------
    @property
    def lease(self) -> str:
        """The name of the lease the beats campaign for: :attr:`lease_name`, kept under
        this name (the :class:`~django_leader.Lease` held now is ``elector.lease``)."""
        return self._name

    @property
    def _name(self) -> str:
        name = self.lease_name
        assert name is not None  # set by __init__
        return name

    @property
    def elector(self) -> BeatElector | None:
        """The elector (None in a lazy instance)."""
        return self._elector

    @property
    def is_leader(self) -> bool:
        return self._elector is not None and self._elector.is_leader

    @property
    def _follower_wait(self) -> float:
        elector = self._elector
        retry = elector.timing.retry_interval if elector is not None else 1.0
        return max(0.01, min(retry, float(self.max_interval)))

    def _strike(self, lease: Lease, reason: str) -> None:
        """Count one failure of ``lease``'s term to do its job; resign at RESIGN_AFTER."""
        if self._strikes_lease is not lease:
            self._strikes_lease, self._strikes = lease, 0
        self._strikes += 1
        elector = self._elector
        if self._strikes < RESIGN_AFTER or elector is None or elector.lease is not lease:
            return
        self._strikes = 0
        backoff = elector.timing.ttl
        logger.error(
            "celery beat %s resigns from %r (token %s): %s, %d times in a row; it campaigns "
            "again in %.1fs",
            lease.holder,
            lease.name,
            lease.token,
            reason,
            RESIGN_AFTER,
            backoff,
        )
        # Another beat (retrying every RETRY_INTERVAL < LEASE_TTL) takes over first.
        elector.resign(backoff)

    def _watch(self) -> None:
        """Resign for a tick or sync that has been stuck for STUCK_TTLS lease lifetimes.

        The call itself cannot be interrupted, but another beat can take over: the stuck
        one's lease is released (or expires), so whatever it does when the call returns is
        refused by the fenced slot record."""
        elector = self._elector
        assert elector is not None
        ttl = elector.timing.ttl
        limit = STUCK_TTLS * ttl
        resigned: Lease | None = None
        while not self._watch_stop.wait(min(1.0, ttl / 3)):
            call = self._call
            if call is None:
                continue
            started, _ = call
            stuck = clock() - started
            # The lease of the stuck call's term, or of a term won since (by the elector
            # thread, while this one is still stuck): neither can be served.
            lease = elector.lease
            if stuck < limit or lease is None or lease is resigned:
                continue
            resigned = lease
            logger.error(
                "celery beat %s resigns from %r (token %s): its tick has not returned for "
                "%.1fs (a store or broker call that neither answers nor fails); it campaigns "
                "again in %.1fs",
                lease.holder,
                lease.name,
                lease.token,
                stuck,
                ttl,
            )
            elector.resign(ttl)

    def _backoff(self) -> float:
        self._failures += 1
        return min(MAX_BACKOFF, float(self.max_interval), self._follower_wait * 2**self._failures)

    # -- leadership changes ---------------------------------------------------------------
    def _take_over(self, lease: Lease) -> Any:
        """Build the wrapped scheduler for this term, from the shared slot records."""
        assert self._slots is not None and self._clock is not None
        try:
            slots = self._slots.load(lease)
            self._clock.sync()
            # Slot times are recorded in the store's clock, and used in ours.
            offset = self._clock.offset()
        except Exception as exc:
            logger.warning("celery beat: cannot read the last slots, not sending yet: %s", exc)
            return None
        for slot in slots.values():
            if not slot.sent and slot.token != lease.token:
                logger.warning(
                    "celery beat: %s (token %s) stopped between taking slot %s of %r and "
                    "confirming it was sent: it may not have been sent (it is never sent "
                    "again, to never send a slot twice)",
                    slot.holder,
                    slot.token,
                    slot.at.isoformat(),
                    slot.entry,
                )
        self._last = {key: slot.at - offset for key, slot in slots.items()}
        if not lease.held:
            return None
        try:
            inner = self._inner_cls(
                self.app, lazy=False, _dl_owner=self, _dl_lease=lease, **self._inner_kwargs
            )
            entries = list(inner.schedule.values())
        except Exception:
            logger.exception("celery beat: cannot set up %s", self._wrapped.__name__)
            return None
        for entry in entries:
            self._adopt(entry)
        self._inner = inner
        if self._strikes_lease is lease:
            self._strikes = 0
        logger.info(
            "celery beat %s sends the schedule of %r with %s (token %s); continuing from %d "
            "recorded slot(s)",
            lease.holder,
            lease.name,
            self._wrapped.__name__,
            lease.token,
            len(slots),
        )
        return inner

    def _stand_down(self) -> None:
        inner, self._inner = self._inner, None
        if inner is None:
            return
        lease = inner._dl_lease
        if lease is not None and not lease.held:
            logger.info("celery beat: stopped sending (lease token %s is lost)", lease.token)
        try:
            inner.close()  # syncs only if the lease is still held (a clean shutdown)
        except Exception:
            logger.exception("celery beat: closing %s failed", self._wrapped.__name__)

    # -- sending --------------------------------------------------------------------------
    def _adopt(self, entry: Any) -> None:
        """Set ``entry.last_run_at`` to the last slot recorded for it, if there is one.

        The record is the truth: it was written, fenced, before the slot was sent. The
        wrapped scheduler's own value is older (its state is saved after sends, or on
        another host), or made up (a new entry "last ran" when it was loaded).
        """
        last = self._last.get(entry_key(entry.name))
        if last is None:
            return
        current = entry.last_run_at
        tz = self.app.timezone
        if current is not None and _aware(current, tz) == last:
            return
        if current is not None and current.tzinfo is None:
            entry.last_run_at = last.astimezone(tz).replace(tzinfo=None)
        elif current is not None:
            entry.last_run_at = last.astimezone(current.tzinfo)
        else:
            entry.last_run_at = last.astimezone(tz)

    def _take_slot(self, inner: Any, entry: Any, advance: bool) -> tuple[Any, Lease, Slot] | None:
        """Record the slot ``entry`` is about to be sent for; None: do not send it."""
        lease = inner._dl_lease
        if self._closing or lease is None or not lease.held:
            logger.info("celery beat: not sending %r: this beat no longer leads", entry.name)
            return None
        if advance:
            inner.reserve(entry)
        at = inner._dl_reserved.pop(entry.name, None) or self.app.now()
        at = _aware(at, self.app.timezone).astimezone(timezone.utc)  # this beat's clock
        assert self._slots is not None and self._clock is not None
        try:
            # The offset of now: a step of this beat's wall clock does not shift the record.
            store_at = at + self._clock.offset()
            slot = Slot(entry_key(entry.name), store_at, lease.token, lease.holder, uuid())
            self._slots.claim(lease, slot)
        except LeadershipLost as exc:
            logger.warning("celery beat: not sending slot %s of %r: %s", at, entry.name, exc)
            return None
        except Exception as exc:
            # Not sent, nor recorded: the entry falls back to its last recorded slot (see
            # _adopt), so the slot is sent at the next tick that can record it.
            logger.error(
                "celery beat: not sending slot %s of %r: cannot record it: %s",
                at,
                entry.name,
                exc,
            )
            self._strike(lease, "cannot record a slot")
            return None
        if self._strikes_lease is lease:
            self._strikes = 0
        self._last[slot.entry] = at
        options = dict(entry.options or {})
        headers = dict(options.get("headers") or {})
        headers.update(
            {
                HEADER_ENTRY: entry.name,
                HEADER_SLOT: slot.at.isoformat(),
                HEADER_TOKEN: lease.token,
                HEADER_HOLDER: lease.holder,
            }
        )
        options["headers"] = headers
        options["task_id"] = slot.task_id
        # A shallow copy without __reduce__ (ModelEntry cannot be rebuilt from it).
        message_entry = object.__new__(type(entry))
        message_entry.__dict__.update(vars(entry))
        message_entry.options = options
        return message_entry, lease, slot

    def _sent(self, lease: Lease, slot: Slot) -> None:
        assert self._slots is not None
        try:
            self._slots.confirm(lease, slot)
        except Exception as exc:
            logger.warning("celery beat: could not mark slot %s sent: %s", slot.at, exc)
