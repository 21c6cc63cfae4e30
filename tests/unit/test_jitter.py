"""Jitter (``django_leader/jitter.py``): waits spread out, within their bounds, and the same
on each run under one seed.

Without it, locks waiting for one lease polled in lockstep, every ``RETRY_INTERVAL`` on
the dot (issue 24, defect 8): the lock tests below fail on such code.
"""

from __future__ import annotations

import pytest

from django_leader import Elector, jitter, lock
from django_leader.backends.db import DatabaseBackend

RETRY = 0.5


@pytest.fixture
def seeded() -> object:
    jitter.seed(1234)
    yield None
    jitter.seed(None)


def test_shorter_stays_within_its_spread(seeded: object) -> None:
    waits = [jitter.shorter(2.0) for _ in range(2000)]
    assert all((1 - jitter.SPREAD) * 2.0 <= wait <= 2.0 for wait in waits)
    assert min(waits) < 1.65 and max(waits) > 1.95  # the whole spread is used
    assert jitter.shorter(0.0) == 0.0


def test_after_expiry_is_small_and_capped(seeded: object) -> None:
    extras = [jitter.after_expiry(RETRY) for _ in range(2000)]
    assert all(0 <= extra <= jitter.EXPIRY_SPREAD * RETRY for extra in extras)
    assert max(jitter.after_expiry(60.0) for _ in range(200)) <= jitter.EXPIRY_CAP


def test_a_seed_gives_the_same_waits() -> None:
    jitter.seed(99)
    first = [jitter.shorter(1.0) for _ in range(5)]
    jitter.seed(99)
    assert [jitter.shorter(1.0) for _ in range(5)] == first
    jitter.seed(None)


def test_a_waiting_lock_polls_out_of_step(seeded: object) -> None:
    """How long a blocking lock waits between two attempts on a held lease (no wake-up):
    never past RETRY_INTERVAL, and not the same each time."""
    waiter = lock("jitter", ttl=6, backend=DatabaseBackend("default"))
    retry = waiter.timing.retry_interval
    pauses = [waiter._outcome(None, None, None)[1] for _ in range(50)]
    assert all((1 - jitter.SPREAD) * retry <= pause <= retry for pause in pauses)
    assert len(set(pauses)) > 40


def test_a_waiting_elector_polls_out_of_step(seeded: object) -> None:
    """A candidate without wake-ups polls after at most RETRY_INTERVAL, not the same each
    time."""
    elector = Elector("jitter", backend=DatabaseBackend("default"))
    retry = elector.timing.retry_interval
    polls = [elector._poll_interval() for _ in range(50)]
    assert all((1 - jitter.SPREAD) * retry <= poll <= retry for poll in polls)
    assert len(set(polls)) > 40
