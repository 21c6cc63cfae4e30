"""The memory backend's reported times (a unit test of its arithmetic: no store)."""

from __future__ import annotations

import datetime
import itertools
import random

import pytest

from django_leader.backends import memory


def test_a_lease_expires_exactly_its_ttl_after_it_was_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``expires_at - renewed_at`` is the ttl to the microsecond, whatever the clock read.
    Both were computed from the clock apart, each rounded to the microsecond: 1 µs off
    for some readings (``make compat`` failed the contract's large renewal batch on it)."""
    # Readings of lease.clock() half a microsecond past a microsecond (the store started
    # at 1000.0), where rounding each time apart can land 1 µs off.
    rng = random.Random(1)
    readings = itertools.accumulate(
        (rng.uniform(0.001, 0.01) for _ in itertools.count()),
        lambda at, step: round(at + step, 6),
        initial=1000.0,  # the store's start, read first: a whole microsecond
    )

    def clock() -> float:
        at = next(readings)
        return at if at == 1000.0 else at + 5e-7

    monkeypatch.setattr(memory, "clock", clock)
    store = memory.MemoryBackend()
    off = []
    for i in range(1000):
        lease, _ = store.acquire(f"n-{i}", "alice", 30)
        assert lease is not None
        renewed = store.renew(lease, 30)
        assert renewed is not None
        for seen in (lease, renewed):
            assert seen.expires_at is not None and seen.renewed_at is not None
            if seen.expires_at - seen.renewed_at != datetime.timedelta(seconds=30):
                off.append((i, seen.expires_at - seen.renewed_at))
    assert off == []
