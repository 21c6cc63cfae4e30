"""Redis pub/sub for the Redis backend's wake-ups (``PUBLISH`` by :meth:`RedisBackend.wake`,
``SUBSCRIBE`` here). Used by the hub's thread only: a redis-py ``PubSub`` is not
thread-safe."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RedisListener:
    """A :class:`~django_leader.backends.wakeups.Transport` over ``SUBSCRIBE``, on the
    backend's own (bounded) client: a connection lost raises, and the hub reconnects."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._pubsub: Any = None

    def connect(self) -> None:
        self.close()
        self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)

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
            if message.get("type") == "message":
                name = message["channel"]
                got.append(name.decode() if isinstance(name, bytes) else str(name))
            message = pubsub.get_message(timeout=0)
        return got

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()
