"""A long ``fenced()`` of one lease costs no other lease of the process its renewals
(issue 24, defect 2).

The row of a lease whose holder is inside ``fenced()`` stays locked until that transaction
ends, which may be just before the lease's deadline. The session renews every lease of the
process in one batch: the batch must deliver the answers of the rows it did renew at once,
whatever the locked row waits for. Checked on what the holder sees (``lease.lost``, its
local deadline), not only in the store. Databases with row locks only: SQLite's one
write lock holds every renewal of the file (docs/safety.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from django.db import connections

from django_leader import LeadershipLost, lock
from django_leader.backends.db import DatabaseBackend
from django_leader.backends.partial import RenewedInPart
from django_leader.conf import resolve_timing
from django_leader.lease import clock
from tests.support.stores import open_store, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db
TTL = 6.0  # renewed every 2 s; deadline 5.4 s after a renewal is sent
WAIT = 30.0


@pytest.fixture(params=["postgresql", "mysql"])
def row_locking(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A database backend on each database with row locks."""
    yield from open_store(request.param)


@pytest.fixture
def configured(row_locking: Any) -> Iterator[Any]:
    """The same database as ``LEASE_TTL = TTL`` configures it: its statements bounded
    by the call timeout of that ttl (1.8 s), shorter than the fenced() block."""
    store = DatabaseBackend(row_locking.alias, timeout=resolve_timing(TTL).call_timeout)
    yield store
    store.close()


def test_a_fenced_block_until_its_deadline_costs_no_other_lease(
    configured: Any, lease_name: str
) -> None:
    """One process holds lock("B") and lock("A"); a thread stays inside A's ``fenced()``
    until just before A's deadline: B is renewed all along (old code: B lost ~5 s in,
    "deadline passed while a renewal was still in flight")."""
    backend = configured
    inside, done = threading.Event(), threading.Event()
    outcome: list[str] = []
    with ExitStack() as stack:
        b = stack.enter_context(lock(f"{lease_name}-b", ttl=TTL, backend=backend))
        # A a little later: renewed in B's batches (due within half an interval of B),
        # and its deadline, until which its fenced() block runs, comes after B's.
        done.wait(0.8)
        a = stack.enter_context(lock(f"{lease_name}-a", ttl=TTL, backend=backend))
        assert a.deadline is not None and b.deadline is not None
        a_deadline, b_first = a.deadline, b.deadline
        assert b_first < a_deadline - 0.5

        def fenced() -> None:
            try:
                with a.fenced():
                    inside.set()
                    done.wait(max(0.0, a_deadline - 0.3 - clock()))
                outcome.append("committed")
            except LeadershipLost as exc:  # a loaded machine: the commit came too late
                outcome.append(f"lost: {exc}")
            finally:
                connections[backend.alias].close()

        holder = threading.Thread(target=fenced, name="fenced-a")
        holder.start()
        try:
            assert inside.wait(WAIT)
            # B's lease outlives its first deadline, A's row locked all the while.
            while holder.is_alive():
                assert not b.lost.is_set(), (b.lost_reason, clock() - b_first)
                done.wait(0.1)
        finally:
            done.set()
            holder.join(WAIT)
        assert outcome, "the fenced() thread did not end"
        assert not b.lost.is_set(), b.lost_reason
        assert b.held
        assert b.deadline is not None and b.deadline > a_deadline
        # B's lease went on being renewed after A's row was free again.
        deadline = b.deadline
        wait_until(
            lambda: b.deadline is not None and b.deadline > deadline,
            timeout=WAIT,
            message="B was not renewed after the fenced() block",
        )
        assert not b.lost.is_set() and b.held


def test_the_locked_lease_is_renewed_once_its_fenced_block_ends(
    configured: Any, lease_name: str
) -> None:
    """A lease whose own ``fenced()`` block outlasts the call timeout (its row locked
    through two renewal rounds) is renewed once the block ends, before its deadline: its
    renewal is tried again on its own, more often as the deadline nears."""
    backend = configured
    with lock(lease_name, ttl=TTL, backend=backend) as a:
        assert a.deadline is not None
        first = a.deadline
        with a.fenced():
            # Through two renewal rounds, ending 1.5 s before the deadline.
            threading.Event().wait(max(0.0, first - 1.5 - clock()))
        wait_until(
            lambda: a.deadline is not None and a.deadline > first,
            timeout=WAIT,
            message=lambda: f"not renewed after its fenced() block: {a.lost_reason}",
        )
        assert not a.lost.is_set() and a.held


def test_renew_many_answers_the_free_rows_at_once(row_locking: Any, lease_name: str) -> None:
    """``renew_many`` never waits for a locked row: the free lease is renewed and its
    answer delivered (``RenewedInPart``) while the busy one's row is still locked; the
    busy one is renewed once its transaction ends."""
    backend = row_locking
    busy, _ = backend.acquire(f"{lease_name}-busy", "alice", 30)
    free, _ = backend.acquire(f"{lease_name}-free", "alice", 30)
    assert busy is not None and free is not None
    busy.deadline = clock() + 30
    inside, leave = threading.Event(), threading.Event()

    def fenced() -> None:
        try:
            with backend.fenced(busy):
                inside.set()
                assert leave.wait(WAIT)
        finally:
            connections[backend.alias].close()

    holder = threading.Thread(target=fenced)
    holder.start()
    try:
        assert inside.wait(WAIT)
        with pytest.raises(RenewedInPart) as raised:
            backend.renew_many([busy, free], 40)
        part = raised.value
        assert part.pending == {0}
        assert part.results[0] is None
        renewed = part.results[1]
        assert renewed is not None and renewed.name == free.name
        assert renewed.expires_at > free.expires_at
        assert backend.read(free.name).expires_at == renewed.expires_at
        assert backend.read(busy.name).expires_at == busy.expires_at  # still locked
    finally:
        leave.set()
        holder.join(WAIT)
    again = backend.renew_many([busy, free], 40)
    assert [lease.name for lease in again] == [busy.name, free.name]
    assert again[0].expires_at > busy.expires_at
