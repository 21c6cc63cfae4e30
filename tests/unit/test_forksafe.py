"""``django_leader.forksafe.ForkSafeLock``: a lock held by a thread of the parent at a fork
is free in the child (a ``threading.Lock`` stays held there forever, by a thread that does
not exist). Real forks."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from django_leader.forksafe import ForkSafeLock
from tests.support.forking import in_child_while_held

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_a_fork_safe_lock_held_at_the_fork_is_free_in_the_child() -> None:
    lock = ForkSafeLock()

    def take() -> bool:
        if not lock.acquire(timeout=5):
            return False
        lock.release()
        return not lock.locked()

    assert in_child_while_held([lock], take, timeout=20) == 0
    assert not lock.locked()  # the parent's, released by its holder


def test_a_plain_lock_held_at_the_fork_stays_held_in_the_child() -> None:
    """The control: what the fork-safe lock is for."""
    lock = threading.Lock()
    assert in_child_while_held([lock], lambda: not lock.acquire(timeout=0.5), timeout=20) == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the module-level locks of POSIX")
def test_the_locks_a_new_pool_process_takes_first_are_fork_safe() -> None:
    """What a celery pool process forked by a busy main process goes through on its first
    lock(): the backend registry and the metrics (the session has a fork hook of its
    own)."""
    from django_leader import backends, metrics

    assert isinstance(backends._lock, ForkSafeLock)
    assert isinstance(metrics._lock, ForkSafeLock)
