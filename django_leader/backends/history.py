"""Best-effort history for stores that are not the database (the Redis backend).

Events are queued and written to ``DJANGO_LEADER["DATABASE"]`` by a background thread, so
a slow or unreachable database never blocks or breaks a lease operation. An event that
cannot be written is dropped with a warning in the log: the lease itself stays correct,
only its history has a gap. (The database backend writes history in the same transaction
as the lease change instead.)
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from contextlib import suppress
from datetime import datetime

from ..forksafe import ForkSafeLock
from ..lease import EventKind, HistoryEvent, Lease

logger = logging.getLogger("django_leader")

#: Seconds spent at interpreter exit writing events still queued.
EXIT_FLUSH_TIMEOUT = 2.0
#: Seconds between two warnings of history events dropped (the queue was full).
DROP_LOG_INTERVAL = 10.0
#: Most events written in one transaction: a burst (thousands of leases taken at once) is
#: written in a few commits, not one per event.
WRITE_BATCH = 200
#: Seconds the writer waits after an event for more to write with it: a process taking
#: locks in a loop has them written a transaction per this interval, not one or two per
#: lock (each its own wake-up of the writer, competing with the lock's thread).
LINGER = 0.05
#: Seconds without an event after which the writer closes its connection to the history
#: database (it reconnects for the next event): a process that takes a lease now and then
#: keeps no idle connection.
IDLE_CLOSE = 10.0


class HistoryWriter:
    """A queue of history events and the daemon thread that writes them."""

    def __init__(self, database: str, maxsize: int = 10_000) -> None:
        self.database = database
        self._queue: queue.Queue[HistoryEvent] = queue.Queue(maxsize)
        self._lock = ForkSafeLock()  # a child forked while a thread held it gets it free
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._drops, self._drop_logged = 0, -DROP_LOG_INTERVAL  # events dropped, last logged
        _writers.add(self)

    def record(
        self, kind: str, lease: Lease, at: datetime | None, detail: str = "", actor: str = ""
    ) -> None:
        """Queue an event; never blocks, never raises."""
        self._ensure_thread()
        try:
            self._queue.put_nowait(HistoryEvent(kind, lease, at, detail, actor))
        except queue.Full:
            self._dropped(kind, lease.name)

    def _dropped(self, kind: str, name: str) -> None:
        """Log a dropped event: the first at once, then at most one line every
        :data:`DROP_LOG_INTERVAL` seconds, counting the drops in between (a burst of
        thousands of leases a second would otherwise write a warning each)."""
        with self._lock:
            self._drops += 1
            now = time.monotonic()
            if now - self._drop_logged < DROP_LOG_INTERVAL:
                return
            drops, self._drops, self._drop_logged = self._drops, 0, now
        logger.warning(
            "history queue full, dropping %s event of %r%s (history is best effort)",
            kind,
            name,
            f" and {drops - 1} more since the last such warning" if drops > 1 else "",
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued event was written (or dropped); False on timeout."""
        give_up = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if give_up is not None and time.monotonic() >= give_up:
                return False
            time.sleep(0.01)
        return True

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's thread is not here
                self._pid, self._thread = os.getpid(), None
                self._queue = queue.Queue(self._queue.maxsize)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="leader-history", daemon=True
                )
                self._thread.start()

    def _next_batch(self, idle: float | None) -> list[HistoryEvent]:
        """The next events in the order recorded, up to :data:`WRITE_BATCH`: waits for the
        first, then :data:`LINGER` for those that follow it; [] when none came for ``idle``
        seconds."""
        try:
            events = [self._queue.get(timeout=idle)]
        except queue.Empty:
            return []
        if self._queue.qsize() < WRITE_BATCH:
            time.sleep(LINGER)
        with suppress(queue.Empty):
            while len(events) < WRITE_BATCH:
                events.append(self._queue.get_nowait())
        return events

    def _run(self) -> None:
        from .db import DatabaseBackend

        store: DatabaseBackend | None = None
        while True:
            events = self._next_batch(None if store is None else IDLE_CLOSE)
            if not events:  # idle: let the connection go, reconnect for the next event
                if store is not None:
                    with suppress(Exception):
                        store.close()
                store = None
                continue
            try:
                if store is None:
                    store = DatabaseBackend(self.database)
                store.write_events(events)
            except Exception as exc:  # BackendUnavailable, or a bug: never the lease's problem
                logger.warning(
                    "could not write %s event of %r%s to database %r, dropped "
                    "(history is best effort): %s",
                    events[0].kind,
                    events[0].lease.name,
                    f" and {len(events) - 1} more" if len(events) > 1 else "",
                    self.database,
                    exc,
                )
            finally:
                for _ in events:
                    self._queue.task_done()


_writers: weakref.WeakSet[HistoryWriter] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for writer in list(_writers):
        writer.flush(EXIT_FLUSH_TIMEOUT)


class WrittenAfterwards:
    """For a store that is not the history database (Redis, ZooKeeper): history events go
    through a :class:`HistoryWriter` (``self._history``, None without history), written
    after the lease operation, best effort."""

    _history: HistoryWriter | None

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        self._record(kind, lease, None, detail=detail)

    def _record(
        self, kind: str, lease: Lease, at: datetime | None, detail: str = "", actor: str = ""
    ) -> None:
        if self._history is not None:
            self._history.record(kind, lease, at, detail=detail, actor=actor)

    def _record_grant(self, lease: Lease, taken_over: bool) -> None:
        """Record a grant: ``taken_over`` from a holder whose lease had expired (named in
        ``lease.previous_holder``), else acquired (and ``previous_holder`` is cleared)."""
        if not taken_over:
            lease.previous_holder = ""
        self._record(
            EventKind.TAKEN_OVER if taken_over else EventKind.ACQUIRED,
            lease,
            lease.acquired_at,
            detail=f"lease of {lease.previous_holder} had expired" if taken_over else "",
        )

    def flush_history(self, timeout: float | None = None) -> bool:
        return self._history.flush(timeout) if self._history is not None else True
