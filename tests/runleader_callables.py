"""Callables for ``runleader --call`` in the tests. Each writes what it does to the file
named by ``DJANGO_LEADER_TEST_OUT``."""

from __future__ import annotations

import os
import time

from django_leader import Lease


def _note(line: str) -> None:
    with open(os.environ["DJANGO_LEADER_TEST_OUT"], "a") as out:
        out.write(f"{os.getpid()} {line} {time.time():.3f}\n")


def obedient(lease: Lease) -> None:
    """Works until the lease is lost, then returns."""
    _note(f"start {lease.token}")
    lease.lost.wait()
    _note(f"stop {lease.token}")


def stubborn(lease: Lease) -> None:
    """Ignores ``lease.lost``."""
    _note(f"start {lease.token}")
    while True:
        time.sleep(0.1)  # busy for ever, deaf to lease.lost


def checking(lease: Lease) -> None:
    """Works in steps and calls ``lease.check()`` between them, which raises once lost."""
    _note(f"start {lease.token}")
    while True:
        lease.check()
        time.sleep(0.05)  # one step of work


def failing(lease: Lease) -> None:
    """Raises at once, every term."""
    _note(f"start {lease.token}")
    raise RuntimeError("payload failed")


not_callable = 42


def beats_then_hangs(lease: Lease) -> None:
    """Calls ``lease.heartbeat()`` for a second, then hangs, deaf to ``lease.lost`` (for
    ``--watchdog``). Notes "hang" just before its last heartbeat."""
    _note(f"start {lease.token}")
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        lease.heartbeat()
        time.sleep(0.05)  # one step of work
    _note(f"hang {lease.token}")
    lease.heartbeat()
    while True:
        time.sleep(0.1)  # deadlocked, for ever


def stalls_then_acts(lease: Lease) -> None:
    """Acts (notes ``act <token>``), then stalls for ``DJANGO_LEADER_TEST_STALL`` seconds
    without a heartbeat, deaf to ``lease.lost`` (for ``--watchdog``), acts again with the
    same token, and hangs for ever: the stuck work of a leader that may still act."""
    _note(f"act {lease.token}")
    time.sleep(float(os.environ["DJANGO_LEADER_TEST_STALL"]))  # stalled, no heartbeat
    _note(f"act {lease.token}")
    while True:
        time.sleep(0.1)  # deadlocked, for ever
