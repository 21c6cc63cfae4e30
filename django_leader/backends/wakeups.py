"""Wake-ups pushed by the store: one listening connection and one thread per process.

A :class:`WakeHub` keeps a :class:`Transport` (PostgreSQL ``LISTEN``, Redis ``SUBSCRIBE``)
subscribed to the channels its watches ask for, and calls their callbacks when a message
arrives. A wake-up is a hint to try early, never part of a lease decision, so the hub is
best effort: while its connection is down it reconnects with a back-off, the watches report
``live`` False (candidates poll every ``RETRY_INTERVAL`` meanwhile), and once it is back
every callback is called once — a wake-up sent while it was away may have been missed.

Channels: :func:`channel` of a name (everyone racing for it and every observer, woken by
each release) and of a name and an identity (one candidate: the next in a fifo or priority
queue, woken by the releaser).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Protocol

logger = logging.getLogger("django_leader")

#: Seconds the hub waits for messages before it looks at new subscriptions again (also how
#: long a new watch may take to be subscribed).
POLL = 0.1
#: Back-off after a failed connection, doubled up to MAX_BACKOFF.
MIN_BACKOFF = 0.2
MAX_BACKOFF = 5.0


def channel(prefix: str, name: str, identity: str | None = None) -> str:
    """The channel of lease ``name`` (for everyone) or of one ``identity`` waiting for it.

    A digest: valid as a PostgreSQL identifier (at most 63 bytes) and as a Redis channel
    whatever the name holds; ``prefix`` keeps stores sharing one server apart."""
    key = f"{prefix}\0{name}\0{identity or ''}"
    return "django_leader_" + hashlib.sha256(key.encode()).hexdigest()[:40]


class Transport(Protocol):
    """A connection that can subscribe to channels and wait for messages on them."""

    def connect(self) -> None:
        """Open the connection (raise on failure)."""

    def subscribe(self, names: Iterable[str]) -> None: ...

    def unsubscribe(self, names: Iterable[str]) -> None: ...

    def wait(self, timeout: float) -> list[str]:
        """The channels that got a message within ``timeout`` seconds (raise if the
        connection failed)."""

    def close(self) -> None: ...


class _Watch:
    def __init__(
        self, hub: WakeHub, names: list[str], callback: Callable[[], None], resync: bool
    ) -> None:
        self.hub = hub
        self.names = names
        self.callback = callback
        self.resync = resync
        self.closed = False

    @property
    def live(self) -> bool:
        return not self.closed and self.hub.live and self.hub.subscribed(self.names)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.hub.forget(self)


class WakeHub:
    """One listening connection (``transport``) and its thread, shared by every watch of a
    backend in this process. The thread starts with the first watch and ends when the last
    one closes."""

    def __init__(self, transport: Transport, thread_name: str) -> None:
        self.transport = transport
        self.thread_name = thread_name
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._watches: dict[str, set[_Watch]] = {}
        self._subscribed: set[str] = set()
        self._thread: threading.Thread | None = None
        self._changed = threading.Event()
        self.live = False

    def usable(self) -> bool:
        """False in a forked child: the connection and the thread were the parent's."""
        return self.pid == os.getpid()

    def watch(
        self, names: list[str], callback: Callable[[], None], *, resync: bool = True
    ) -> _Watch:
        """Call ``callback`` when a message comes on one of ``names``, and (``resync``)
        once after each reconnection, a message having perhaps been missed meanwhile."""
        watch = _Watch(self, names, callback, resync)
        with self._lock:
            for name in names:
                self._watches.setdefault(name, set()).add(watch)
            if self._thread is None:  # else it listens for this watch too
                self._thread = threading.Thread(
                    target=self._run, name=self.thread_name, daemon=True
                )
                self._thread.start()
        self._changed.set()
        return watch

    def watch_lease(
        self, prefix: str, name: str, identity: str | None, callback: Callable[[], None]
    ) -> _Watch:
        """What ``Backend.watch`` gives: the :func:`channel` of ``name`` (woken by every
        release, and after each reconnection), or of one ``identity`` (the next in a
        queue: no wake-up after a reconnection — it polls, and a wake-up would let it jump
        the queue)."""
        return self.watch([channel(prefix, name, identity)], callback, resync=identity is None)

    def forget(self, watch: _Watch) -> None:
        with self._lock:
            for name in watch.names:
                found = self._watches.get(name)
                if found is not None:
                    found.discard(watch)
                    if not found:
                        del self._watches[name]
        self._changed.set()

    def subscribed(self, names: list[str]) -> bool:
        with self._lock:
            return all(name in self._subscribed for name in names)

    # -- the listening thread -------------------------------------------------------------
    def _run(self) -> None:
        """Listen while there are watches. The thread leaves ``_thread`` only under the
        lock, once it has found none: a watch made meanwhile starts a new one, never two
        side by side."""
        try:
            while True:
                self._listen()
                with self._lock:
                    if not self._watches:
                        self._thread = None
                        return
        except BaseException:
            with self._lock:
                self._thread = None
            raise

    def _listen(self) -> None:
        backoff = MIN_BACKOFF
        connected = False
        try:
            while True:
                with self._lock:
                    wanted = set(self._watches)
                if not wanted:
                    return  # the last watch closed (_run decides, under the lock)
                try:
                    if not connected:
                        self.transport.connect()
                        connected = True
                        self._subscribed = set()
                        reconnected = True
                    else:
                        reconnected = False
                    self._sync(wanted)
                    if reconnected:
                        self.live = True
                        backoff = MIN_BACKOFF
                        # Whatever was sent while we were away is lost: everyone looks
                        # (but a queue's candidates, which poll anyway: no queue-jumping).
                        self._dispatch(wanted, reconnected=True)
                    self._changed.clear()
                    got = self.transport.wait(POLL)
                except Exception as exc:
                    if self.live or connected:
                        logger.warning(
                            "wake-ups lost their connection (waiting candidates poll "
                            "meanwhile): %s",
                            exc,
                        )
                    self.live = False
                    connected = False
                    with self._lock:
                        self._subscribed = set()
                    with suppress(Exception):
                        self.transport.close()
                    # Not _changed: a new watch must not cut the back-off short (a store
                    # that is down would be hammered).
                    time.sleep(backoff)
                    backoff = min(MAX_BACKOFF, backoff * 2)
                    continue
                if got:
                    self._dispatch(set(got))
        finally:
            self.live = False
            with suppress(Exception):
                self.transport.close()
            with self._lock:
                self._subscribed = set()

    def _sync(self, wanted: set[str]) -> None:
        with self._lock:
            subscribed = set(self._subscribed)
        new, gone = wanted - subscribed, subscribed - wanted
        if new:
            self.transport.subscribe(sorted(new))
        if gone:
            self.transport.unsubscribe(sorted(gone))
        if new or gone:
            # A new watch is not woken: until it is subscribed it is not live, and its
            # owner polls every RETRY_INTERVAL meanwhile (a wake-up now would let one
            # candidate of a queue jump it).
            with self._lock:
                self._subscribed = (subscribed | new) - gone

    def _dispatch(self, names: set[str], reconnected: bool = False) -> None:
        with self._lock:
            watches = {w for name in names for w in self._watches.get(name, ())}
        for watch in watches:
            if watch.closed or (reconnected and not watch.resync):
                continue
            try:
                watch.callback()
            except Exception:
                logger.exception("wake-up callback %r raised", watch.callback)
