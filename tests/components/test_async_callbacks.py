"""``AsyncElector``'s coroutine callbacks are bounded (issue 24, defect 3), on every store.

A coroutine callback runs for at most the lease TTL, and waits at most that long for the
callbacks reported before it; one still running then is cancelled (a warning is logged)
and nothing waits for it any more. The work waits for its own term's ``on_elected`` only.
So a callback that hangs — ``on_new_leader``, an earlier term's ``on_lost``, or
``on_elected`` itself — neither keeps the work from starting nor piles up tasks at every
leader change. Before, the work waited for the last coroutine callback of any kind and
term, and each callback for the one before it: one hung callback and no work ever
started again, while the chain of waiting tasks grew by three a term.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from django_leader import AsyncElector, Lease
from django_leader.aio import wait_event
from django_leader.backends.base import Backend
from tests.support.stores import stores_db

pytestmark = stores_db

T = TypeVar("T")

#: The Elector timing of the other async tests: the callbacks' bound is the TTL, 1.5 s.
FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "retry_interval": 0.1}
#: A generous bound for anything that should happen "soon": more than the two callback
#: bounds (3 s) a work may wait at most after its election, with margin for a loaded machine.
WAIT = 15.0


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, 120)

    return asyncio.run(bounded())


def others() -> set[asyncio.Task[Any]]:
    """The tasks of the loop other than the test's own."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


class Terms:
    """A coroutine work that records each term it runs for (its token), then waits to be
    cancelled."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.began: dict[int, float] = {}
        self.changed = asyncio.Event()

    async def work(self, lease: Lease) -> None:
        self.began[lease.token] = time.monotonic()
        self.tokens.append(lease.token)
        self.changed.set()
        await asyncio.Event().wait()

    async def next_term(self, after: int | None, what: str) -> int:
        """The token of the first term whose work started after token ``after``."""
        give_up = time.monotonic() + WAIT
        while not (self.tokens and (after is None or self.tokens[-1] > after)):
            self.changed.clear()
            left = give_up - time.monotonic()
            started = left > 0 and await wait_event(self.changed, left)
            assert started, f"{what}: no work started within {WAIT:g} s (terms: {self.tokens})"
        return self.tokens[-1]


async def hang(lease: Lease) -> None:
    await asyncio.Event().wait()  # never set: only a cancellation ends it


async def returns(lease: Lease) -> None:
    await asyncio.sleep(0)


@pytest.mark.parametrize("hung", ["on_new_leader", "on_lost"])
def test_a_hung_callback_does_not_keep_the_next_work_from_starting(
    backend: Backend, lease_name: str, hung: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A coroutine ``on_new_leader`` (called just before ``on_elected``) or ``on_lost`` (of
    the term before) that never returns: each term's work still starts, after a coroutine
    ``on_elected`` that waited for the hung callback up to the bound. Old code: the first
    term's work (on_new_leader) or the second's (on_lost) never started."""
    caplog.set_level(logging.WARNING, logger="django_leader")

    async def main() -> tuple[int, int]:
        terms = Terms()
        elector = AsyncElector(
            lease_name,
            identity="hung",
            backend=backend,
            on_elected=returns,
            on_new_leader=hang if hung == "on_new_leader" else None,
            on_lost=hang if hung == "on_lost" else None,
            **FAST,
        )
        await elector.start(terms.work)
        try:
            first = await terms.next_term(None, "the first term")
            elector.resign(0)  # the term ends (on_lost), the elector is elected again
            second = await terms.next_term(first, "the term after a resignation")
            return first, second
        finally:
            await elector.stop()

    first, second = run(main())
    assert second > first
    assert any(
        f"{hung} of" in record.getMessage() and "cancelled" in record.getMessage()
        for record in caplog.records
    ), [record.getMessage() for record in caplog.records]


def test_a_hung_on_elected_is_cancelled_after_the_ttl_and_the_work_starts(
    backend: Backend, lease_name: str
) -> None:
    """A coroutine ``on_elected`` that does not return (and even ignores its cancellation):
    it is cancelled once it has run for the lease TTL, and the work starts then, without
    waiting for it any longer. Old code: the work never started."""

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        let_go = asyncio.Event()

        async def on_elected(lease: Lease) -> None:
            seen["began"] = time.monotonic()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen["cancelled"] = time.monotonic()
            await let_go.wait()  # ignores the cancellation: it runs on
            seen["returned"] = time.monotonic()

        terms = Terms()
        elector = AsyncElector(
            lease_name, identity="slow", backend=backend, on_elected=on_elected, **FAST
        )
        await elector.start(terms.work)
        try:
            token = await terms.next_term(None, "a term whose on_elected hangs")
            return {**seen, "work": terms.began[token], "still_running": "returned" not in seen}
        finally:
            let_go.set()
            await elector.stop()

    seen = run(main())
    bound = FAST["ttl"]
    assert "cancelled" in seen, "on_elected was not cancelled"
    # The work waited for on_elected up to the bound (loop time is time.monotonic()) ...
    assert seen["cancelled"] - seen["began"] >= bound - 0.01, seen
    assert seen["work"] >= seen["cancelled"], seen
    # ... and no longer: on_elected ignored its cancellation and still ran.
    assert seen["still_running"], seen


def test_hung_callbacks_do_not_pile_up_across_leader_changes(
    backend: Backend, lease_name: str
) -> None:
    """A coroutine ``on_new_leader`` and ``on_lost`` that hang at every leader change: the
    tasks they leave on the loop are gone within two TTLs of the last change, however many
    changes there were. Old code: three more waiting tasks each term, none ever ending."""
    changes = 12

    async def main() -> tuple[int, int, int]:
        elector = AsyncElector(
            lease_name,
            identity="churn",
            backend=backend,
            on_new_leader=hang,
            on_lost=hang,
            **FAST,
        )
        baseline = len(others())
        await elector.start()
        try:
            token = -1
            for _ in range(changes):
                give_up = time.monotonic() + WAIT
                while (lease := elector.lease) is None or lease.token <= token:
                    assert time.monotonic() < give_up, f"not elected again after token {token}"
                    await asyncio.sleep(0.02)
                token = lease.token
                elector.resign(0)
            peak = len(others())
            give_up = time.monotonic() + WAIT
            while (left := len(others())) > baseline + 1 and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
            return baseline, peak, left
        finally:
            await elector.stop()

    baseline, peak, left = run(main())
    # The campaign's own waits may hold one task; every callback's is gone.
    assert left <= baseline + 1, (
        f"{left} tasks still pending {WAIT:g} s after {changes} leader changes "
        f"(peak {peak}, before the start {baseline})"
    )


def test_a_plain_electors_hung_coroutine_on_elected_is_bounded(backend: Backend) -> None:
    """A sync ``Elector`` run without an event loop runs a coroutine callback on a loop of
    its campaign thread's own: a hung ``on_elected`` there once stopped the campaign for
    good (leader, work never started). It is cancelled after the TTL, as AsyncElector's."""
    import threading

    from django_leader import Elector

    started = threading.Event()

    async def on_elected(lease: Lease) -> None:
        await asyncio.sleep(3600)

    def work(lease: Lease) -> None:
        started.set()
        lease.lost.wait()

    elector = Elector("hung-sync", backend=backend, on_elected=on_elected, **FAST)
    elector.start(work)
    try:
        assert started.wait(WAIT), "a hung coroutine on_elected kept the work from starting"
    finally:
        elector.stop(timeout=WAIT)
