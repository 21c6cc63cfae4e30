"""The Redis backend's wake-ups, over Redis pub/sub: ``PUBLISH`` by :meth:`WakeUps.wake`
(and by the release script), ``SUBSCRIBE`` by :class:`RedisListener`, one subscribed
connection per process shared by every watch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from django_leader.backends.base import Watch
from django_leader.backends.redis.store import RedisStore, errors
from django_leader.backends.wakeups import WakeHub, channel

#: Seconds of silence after which the connection is checked with a PING, and then the
#: longest a PONG may take before the connection counts as dead (a half-open TCP connection
#: would otherwise look live while wake-ups are lost).
KEEPALIVE = 5.0


class RedisListener:
    """A :class:`~django_leader.backends.wakeups.Transport` over ``SUBSCRIBE``, on the
    backend's own (bounded) client: a connection lost raises, and the hub reconnects.
    Used by the hub's thread only: a redis-py ``PubSub`` is not thread-safe."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._pubsub: Any = None
        self._heard = 0.0  # time.monotonic() of the last message or PONG
        self._pinged: float | None = None  # when the unanswered PING was sent

    def connect(self) -> None:
        self.close()
        self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self._heard, self._pinged = time.monotonic(), None

    def subscribe(self, names: Iterable[str]) -> None:
        self._pubsub.subscribe(*names)

    def unsubscribe(self, names: Iterable[str]) -> None:
        self._pubsub.unsubscribe(*names)

    def wait(self, timeout: float) -> list[str]:
        pubsub = self._pubsub
        if pubsub is None or pubsub.connection is None:
            raise ConnectionError("not subscribed")
        got = []
        message = pubsub.get_message(timeout=timeout)
        while message is not None:
            self._heard, self._pinged = time.monotonic(), None
            if message.get("type") == "message":
                name = message["channel"]
                got.append(name.decode() if isinstance(name, bytes) else str(name))
            message = pubsub.get_message(timeout=0)
        now = time.monotonic()
        if self._pinged is not None and now - self._pinged > KEEPALIVE:
            raise ConnectionError(f"no PONG within {KEEPALIVE:g}s: the connection is dead")
        if self._pinged is None and now - self._heard > KEEPALIVE:
            pubsub.ping()
            self._pinged = now
        return got

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()


class WakeUps(RedisStore):
    """:meth:`watch` and :meth:`wake` of :class:`~django_leader.backends.redis.RedisBackend`."""

    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """Pub/sub: one subscribed connection per process, shared by every watch. A release
        publishes on the name's channel in its own script (no extra round trip)."""
        with self._hub_lock:
            hub = self._hub
            if hub is None or not hub.usable():
                hub = self._hub = WakeHub(RedisListener(self.client), f"leader-listen:{self.alias}")
        return hub.watch_lease(self._channel_prefix, name, identity, callback)

    def wake(self, name: str, identity: str | None = None) -> None:
        try:
            self.client.publish(channel(self._channel_prefix, name, identity), "")
        except errors() as exc:
            raise self.unavailable(exc) from exc
