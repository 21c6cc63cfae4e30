"""A fork while another thread of the process holds some locks: what a celery pool process
forked by a busy worker starts with."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tests.support.waiting import wait_until


def in_child_while_held(locks: Sequence[Any], check: Callable[[], bool], timeout: float) -> int:
    """Fork while another thread of this process holds every lock of ``locks``; run
    ``check()`` first thing in the child. The child's exit code: 0 if ``check()`` answered
    True, 1 if it answered False or raised (see :func:`wait_child` for a child that does
    not end within ``timeout`` seconds)."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        holding.set()
        done.wait(timeout + 30)
        for lock in reversed(locks):
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30), "the locks were not taken"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if check() else 1
            finally:
                os._exit(code)
        return wait_child(pid, timeout)
    finally:
        done.set()
        holder.join()


def wait_child(pid: int, timeout: float) -> int:
    """The exit code of forked child ``pid``, reaped; a child that has not ended within
    ``timeout`` seconds is killed and the test fails (AssertionError)."""

    def reaped() -> tuple[int, int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return (done, status) if done else None

    try:
        _, status = wait_until(reaped, timeout=timeout, message="forked child did not finish")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)
