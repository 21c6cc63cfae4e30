"""A fork while another thread of the process holds some locks: what a celery pool process
forked by a busy worker starts with."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


def in_child_while_held(locks: Sequence[Any], check: Callable[[], bool], timeout: float) -> int:
    """Fork while another thread of this process holds every lock of ``locks``; run
    ``check()`` first thing in the child. The child's exit code: 0 if ``check()`` answered
    True, 1 if it answered False or raised, -9 if it had not ended within ``timeout``
    seconds (then it is killed)."""
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
        give_up = time.monotonic() + timeout
        while True:
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= give_up:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -9
            time.sleep(0.05)
    finally:
        done.set()
        holder.join()
