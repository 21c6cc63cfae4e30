"""A lock that a forked child gets unheld: :class:`ForkSafeLock`.

A process that forks while one of its threads holds a ``threading.Lock`` leaves the child a
lock held by a thread that does not exist there: the child's first ``with lock:`` waits
forever. Celery's prefork pool forks a new pool process whenever one ends (a revoked task,
a hard time limit, ``max_tasks_per_child``), while the main process's threads may be inside
a backend (releasing the lock of a killed pool process, connecting to ZooKeeper); the new
process then hung on its first call of the store. Locks of the stores that a child uses
again after a fork are these: each is replaced by a new one in the child, right after the
fork, before any of the child's code runs.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

__all__ = ["ForkSafeLock"]


class ForkSafeLock:
    """A ``threading.Lock`` (``with``, ``acquire``, ``release``, ``locked``) that is new, and
    free, in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._renew()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
