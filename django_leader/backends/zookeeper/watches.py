"""ZooKeeper watches and door bells: the thread that arms them again after each event
(ZooKeeper watches fire once) and wakes the candidates they concern."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ...exceptions import BackendUnavailable
from .candidates import Candidacies
from .layout import place_in

logger = logging.getLogger("django_leader")


class ZkWatch:
    def __init__(self, hub: Hub, name: str, identity: str | None, callback: Callable) -> None:
        self.hub = hub
        self.name = name
        self.identity = identity
        self.callback = callback
        self.closed = False
        #: The connection generation this watch was last armed in.
        self.armed_in = -1
        #: The znodes it watches: (kind, path) keys of :attr:`Hub.paths`.
        self.keys: set[tuple[str, str]] = set()

    @property
    def live(self) -> bool:
        return not self.closed and self.hub.connected() and self.armed_in == self.hub.generation

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.hub.forget(self)


#: What a watched znode is to the watches that watch it.
_LEASE, _BELL, _PREDECESSOR = "lease", "bell", "predecessor"


class Hub:
    """The watches of one backend, and the thread that arms them again after each event
    (ZooKeeper watches fire once) and calls their callbacks.

    One ZooKeeper watch per znode, shared by every watch of this backend that needs it (a
    name's race candidates and observers share its lease's; ZooKeeper notifies a session
    once per event anyway): an event costs one read to watch again, whatever the number of
    watches it wakes. kazoo calls watch functions on its own thread, which must not block:
    they only queue work for this one."""

    def __init__(self, backend: Candidacies) -> None:
        self.backend = backend
        self.watches: set[ZkWatch] = set()
        #: (kind, path) -> the watches that watch it, and what it is to each.
        self.paths: dict[tuple[str, str], dict[ZkWatch, str]] = {}
        self.functions: dict[tuple[str, str], tuple[int, Callable[[Any], None]]] = {}
        #: Whether the lease znode was there when each name's children were last read, and
        #: their version then (``cversion``: it counts creations and deletions, so an event
        #: for a change already seen, or a duplicate, changes nothing).
        self.present: dict[tuple[str, str], tuple[bool, int]] = {}
        self.lock = threading.Lock()
        self.generation = 0
        self.work: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stopped = False
        self.thread = threading.Thread(
            target=self._run, name=f"leader-zk-watch:{backend.root}", daemon=True
        )
        self.thread.start()

    def connected(self) -> bool:
        session = self.backend._current
        return session is not None and bool(session.client.connected)

    def watch(self, name: str, identity: str | None, callback: Callable) -> ZkWatch:
        watch = ZkWatch(self, name, identity, callback)
        with self.lock:
            self.watches.add(watch)
        self.work.put(("arm", watch))
        return watch

    def rearm(self, name: str, identity: str) -> None:
        """``identity`` joined ``name``'s queue: its watches watch its predecessor now."""
        with self.lock:
            mine = [w for w in self.watches if (w.name, w.identity) == (name, identity)]
        for watch in mine:
            self.work.put(("arm", watch))

    def forget(self, watch: ZkWatch) -> None:
        with self.lock:
            self.watches.discard(watch)
            self._unwatch(watch)

    def _unwatch(self, watch: ZkWatch) -> None:
        for key in watch.keys:
            self.paths.get(key, {}).pop(watch, None)
        watch.keys.clear()

    def stop(self) -> None:
        self.stopped = True
        self.work.put(("stop", None))

    def state_changed(self, state: str) -> None:
        if state == "CONNECTED":
            self.work.put(("resync", None))

    def _run(self) -> None:
        while not self.stopped:
            try:
                kind, item = self.work.get(timeout=1.0)
            except queue.Empty:
                kind, item = "retry", None
            if kind == "stop":
                return
            try:
                if kind == "arm":
                    self._arm(item, coming_live=item.armed_in == -1)
                elif kind == "fired":
                    self._fired(*item)
                elif kind in ("resync", "retry"):
                    self._resync(kind == "resync")
            except BackendUnavailable:
                time.sleep(0.1)  # armed again at the next "retry" or "resync"
            except Exception:  # pragma: no cover - never let the watch thread die
                logger.exception("django_leader: ZooKeeper watch thread")

    def _resync(self, reconnected: bool) -> None:
        if reconnected:
            self.generation += 1
        with self.lock:
            watches = [w for w in self.watches if w.armed_in != self.generation]
        for watch in watches:
            self._arm(watch, wake_if_free=True)
            if reconnected and watch.identity is None:
                self._call(watch)  # a wake-up may have been missed meanwhile

    def _call(self, watch: ZkWatch) -> None:
        if watch.closed:
            return
        try:
            watch.callback()
        except Exception:  # pragma: no cover - a callback's own error
            logger.exception("django_leader: a wake-up callback failed")

    def _fired(self, key: tuple[str, str], event: Any, generation: int) -> None:
        if generation != self.generation:
            return
        with self.lock:
            watching = dict(self.paths.get(key, {}))
        kind = getattr(event, "type", "NONE")
        if kind == "NONE":  # the connection dropped: armed again once it is back
            for watch in watching:
                watch.armed_in = -1
            return
        if not watching:
            return
        roles = set(watching.values())
        if _PREDECESSOR in roles and kind == "DELETED":
            # The one before them left (it leads now, withdrew, its session ended): each
            # may be the head now, and is woken only if so and the lease is free.
            for watch in watching:
                self._arm(watch, wake_if_free=True)
            return
        before = self.present.get(key, (True, -1))
        present = self._watch(key)  # (wakes the race watchers if the lease went)
        changed = self.present.get(key, (present, -1))[1] != before[1]
        for watch, role in watching.items():
            if (
                role == _LEASE
                and watch.identity
                and changed
                and not present
                and not self._released(watch.name)
                and self._first(watch)
            ):
                # The head, and the lease is free without a release (its holder's session
                # ended): nobody else will wake it. (A releaser wakes the next in line.)
                self._call(watch)
            elif role == _BELL and kind in ("CHANGED", "CREATED"):
                self._call(watch)
            elif role == _PREDECESSOR and not present:  # went before we watched it again
                self._arm(watch, wake_if_free=True)

    def _event(self, key: tuple[str, str]) -> Callable[[Any], None]:
        """The watch function of ``key`` in this connection generation: one function, so
        that kazoo (which keeps a set of them per znode) calls it once per event."""
        generation = self.generation
        known = self.functions.get(key)
        if known is not None and known[0] == generation:
            return known[1]

        def fired(event: Any) -> None:
            self.work.put(("fired", (key, event, generation)))

        self.functions[key] = (generation, fired)
        return fired

    def _watch(self, key: tuple[str, str]) -> bool:
        """Set ZooKeeper's watch on ``key`` (kind, path): ``children`` of a name's znode (its
        lease created, deleted: not each renewal's change of its data), or ``exists`` of a
        znode. Whether the lease is there / the znode exists."""
        from kazoo.exceptions import NoNodeError

        backend = self.backend
        kind, path = key
        if kind == "exists":
            stat = backend._wait(backend.client.exists_async(path, watch=self._event(key)))
            return stat is not None
        for _ in range(2):
            try:
                children, stat = backend._wait(
                    backend.client.get_children_async(
                        path, watch=self._event(key), include_data=True
                    )
                )
            except NoNodeError:  # a name never taken: its record, empty, to watch
                backend._ensure(backend.client, path, anew=True)
                continue
            before = self.present.get(key)
            self.present[key] = ("lease" in children, int(stat.cversion))
            if before is not None and before[0] and before[1] != stat.cversion:
                # The lease znode that was there when we last looked went (whether or not
                # another has taken the name since): every race watcher hears of it, once,
                # whichever read (an event's, a new watch's) notices.
                with self.lock:
                    racing = [w for w, role in self.paths.get(key, {}).items() if role == _LEASE]
                for watch in racing:
                    if watch.identity is None:
                        self._call(watch)
            return "lease" in children
        return False

    def _released(self, name: str) -> bool:
        """Whether the name's last holder released it (then the releaser wakes the next in
        line itself), rather than its lease znode going with its session."""
        found = self.backend._get(self.backend.client, self.backend._name_path(name))
        return found is not None and bool(found[0].get("released", True))

    def _first(self, watch: ZkWatch) -> bool:
        """Whether the head of the queue (by join order) ``watch`` is also first by
        priority: a queued candidate woken by the store tries at once, so the store wakes
        it only when it is first in every mode's order (fifo: join order; priority: the
        highest, then join order). Otherwise it is woken by the releaser (``wake``) or
        finds its turn when it polls."""
        members = self.backend.candidates(watch.name) or []
        mine = [c.priority for c in members if c.identity == watch.identity]
        return bool(mine) and all(c.priority <= mine[0] for c in members)

    def _arm_one(self, watch: ZkWatch, key: tuple[str, str], role: str) -> bool:
        with self.lock:
            self.paths.setdefault(key, {})[watch] = role
            watch.keys.add(key)
        return self._watch(key)

    def _arm(
        self, watch: ZkWatch, *, wake_if_free: bool = False, coming_live: bool = False
    ) -> None:
        """Set every watch ``watch`` needs: its bell, and the lease (a race watcher, the
        head of a queue) or the candidate before its own. With ``wake_if_free``, a head
        that finds the lease free is woken (its predecessor went, or a reconnection may
        have hidden that)."""
        if watch.closed:
            return
        backend = self.backend
        client = backend.client
        generation = self.generation
        with self.lock:
            self._unwatch(watch)
        bell = backend._bell_path(watch.name, watch.identity)
        backend._ensure(client, bell)
        self._arm_one(watch, ("exists", bell), _BELL)
        lease = ("children", backend._name_path(watch.name))
        if watch.identity is None:
            self._arm_one(watch, lease, _LEASE)
        else:
            nodes = backend._queue(client, watch.name)
            mine = place_in(nodes, watch.identity)
            if mine is not None and mine > 0:
                before = ("exists", f"{backend._queue_path(watch.name)}/{nodes[mine - 1]}")
                if not self._arm_one(watch, before, _PREDECESSOR):
                    self._arm(watch, wake_if_free=True)  # gone before we could watch it
                    return
            elif (
                mine == 0
                and not self._arm_one(watch, lease, _LEASE)
                and wake_if_free
                and self._first(watch)
            ):
                self._call(watch)  # the head, and the lease is free
            # (not queued yet: only its bell, until it joins: ZooKeeperBackend.announce)
        if coming_live and watch.identity is None:
            # A release between its owner's last look and now was missed: as with every
            # store's wake-ups, a race watcher is woken once as it comes live.
            self._call(watch)
        watch.armed_in = generation
