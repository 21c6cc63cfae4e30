"""``lease.fenced(using=...)`` with a store that is not the database the writes go to: the
token is checked against the name's fence row in that database (``LeaseFence``), in the
caller's transaction (docs/safety.md, "Fenced writes").

Every case runs on each database (SQLite, PostgreSQL, MariaDB) with each such store
(:data:`FENCE_STORES`), on real servers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import connections

from django_leader import LeadershipLost
from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from django_leader.conf import resolve_timing
from django_leader.lease import Lease, clock
from django_leader.models import LeaseFence
from django_leader.term import acquire_once
from django_leader.testing.contract import wait_until_expired
from testproject.demoapp.models import FencedWrite
from tests.support.stores import DATABASE_STORES, open_store, require, stores_db

pytestmark = stores_db

#: The stores that fence with a fence row: every store but the database backend.
FENCE_STORES = ["redis", "django-redis", "zookeeper"]

#: Long enough that no lease here expires by itself during a case.
TTL = 30.0
#: The lease time of a holder that is to be succeeded (its lease expires in the store).
SHORT_TTL = 1.0
#: A generous bound on how long a thread takes to reach a point (not a measured time).
PATIENCE = 10.0


@pytest.fixture(params=FENCE_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from open_store(request.param)


@pytest.fixture(params=list(DATABASE_STORES))
def alias(request: pytest.FixtureRequest) -> str:
    """The database the fenced writes go to."""
    alias = DATABASE_STORES[request.param]
    require(alias)
    return alias


def take(store: Backend, name: str, holder: str, ttl: float = TTL) -> Lease:
    """A held lease on ``name`` for ``holder`` (it must be free)."""
    lease, _ = acquire_once(store, name, holder, resolve_timing(ttl))
    assert lease is not None, f"{holder} could not take {name}"
    return lease


def successor(store: Backend, old: Lease) -> Lease:
    """The next holder of ``old``'s name (taken once ``old``, of ``SHORT_TTL``, expired in
    the store), while ``old``'s holder has not noticed: its local deadline is moved ahead,
    as a holder paused past its lease has not yet seen it pass."""
    wait_until_expired(store, old.name)
    old.deadline = clock() + TTL
    new = take(store, old.name, "bob")
    assert new.token > old.token
    return new


def write(lease: Lease, alias: str, note: str = "") -> None:
    with lease.fenced(using=alias):
        FencedWrite.objects.using(alias).create(writer=lease.name, token=lease.token, note=note)


def written(alias: str, name: str) -> list[tuple[int, str]]:
    rows = FencedWrite.objects.using(alias).filter(writer=name).order_by("id")
    return list(rows.values_list("token", "note"))


def test_a_holders_fenced_write_commits(store: Backend, alias: str, lease_name: str) -> None:
    lease = take(store, lease_name, "alice")
    write(lease, alias, "first")
    write(lease, alias, "again")  # the same token writes again
    assert written(alias, lease_name) == [(lease.token, "first"), (lease.token, "again")]
    fence = LeaseFence.objects.using(alias).get(name=lease_name)
    assert (fence.token, fence.holder) == (lease.token, "alice")


def test_a_token_below_one_that_wrote_is_refused(
    store: Backend, alias: str, lease_name: str
) -> None:
    old = take(store, lease_name, "alice", SHORT_TTL)
    write(old, alias, "old")
    new = successor(store, old)
    write(new, alias, "new")
    assert old.held  # it does not know: only the database can refuse it
    with pytest.raises(LeadershipLost, match="fenced off"):
        write(old, alias, "stale")
    assert written(alias, lease_name) == [(old.token, "old"), (new.token, "new")]
    assert LeaseFence.objects.using(alias).get(name=lease_name).token == new.token


def test_the_fence_orders_tokens_only(store: Backend, alias: str, lease_name: str) -> None:
    """A lower token that wrote first does not stop a greater one: the fence row checks
    the order of the tokens that wrote, not who holds the lease now."""
    old = take(store, lease_name, "alice", SHORT_TTL)
    new = successor(store, old)
    write(old, alias, "old")
    write(new, alias, "new")
    assert written(alias, lease_name) == [(old.token, "old"), (new.token, "new")]


def test_fenced_after_the_local_deadline_raises(
    store: Backend, alias: str, lease_name: str
) -> None:
    lease = take(store, lease_name, "alice")
    lease.deadline = clock()  # the local deadline passes
    with pytest.raises(LeadershipLost):
        write(lease, alias)
    assert written(alias, lease_name) == []


def test_no_commit_once_the_deadline_passed_inside(
    store: Backend, alias: str, lease_name: str
) -> None:
    lease = take(store, lease_name, "alice")
    with pytest.raises(LeadershipLost, match="refusing to commit"), lease.fenced(using=alias):
        FencedWrite.objects.using(alias).create(writer=lease_name, token=lease.token)
        lease.deadline = clock()  # the deadline passes inside the transaction
    assert written(alias, lease_name) == []
    assert not LeaseFence.objects.using(alias).filter(name=lease_name).exists()


def test_the_row_lock_makes_the_successor_wait(store: Backend, alias: str, lease_name: str) -> None:
    """The older holder's open transaction holds the fence row: the successor's fenced()
    waits for it, so their commits come in token order."""
    old = take(store, lease_name, "alice", SHORT_TTL)
    write(old, alias, "first")  # the row exists: the successor waits on its lock
    new = successor(store, old)
    inside = threading.Event()
    finish = threading.Event()
    errors: list[BaseException] = []

    def older() -> None:
        try:
            with old.fenced(using=alias):
                FencedWrite.objects.using(alias).create(
                    writer=lease_name, token=old.token, note="old"
                )
                inside.set()
                assert finish.wait(PATIENCE)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections[alias].close()

    def newer() -> None:
        try:
            write(new, alias, "new")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections[alias].close()

    first = threading.Thread(target=older)
    first.start()
    assert inside.wait(PATIENCE), errors
    second = threading.Thread(target=newer)
    second.start()
    second.join(0.5)
    # Still waiting on the row lock (SQLite: on the database's write lock).
    assert second.is_alive(), errors
    finish.set()
    first.join(PATIENCE)
    second.join(PATIENCE)
    assert not first.is_alive() and not second.is_alive()
    assert errors == []
    assert written(alias, lease_name) == [
        (old.token, "first"),
        (old.token, "old"),
        (new.token, "new"),
    ]


def test_racing_holders_commit_in_token_order(store: Backend, alias: str, lease_name: str) -> None:
    """An old and a new token writing at once, many times: whatever each was told, the
    committed rows never show the lower token after the greater one."""
    old = take(store, lease_name, "alice", SHORT_TTL)
    write(old, alias, "seed")  # the fence row exists before the race
    new = successor(store, old)
    start = threading.Barrier(2)
    refused: dict[int, int] = {old.token: 0, new.token: 0}
    errors: list[BaseException] = []

    def writer(lease: Lease) -> None:
        try:
            start.wait(PATIENCE)
            for i in range(20):
                try:
                    write(lease, alias, str(i))
                except LeadershipLost:
                    refused[lease.token] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=writer, args=(lease,)) for lease in (old, new)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE * 3)
    assert errors == []
    tokens = [token for token, _ in written(alias, lease_name)]
    assert tokens.count(new.token) == 20 and refused[new.token] == 0
    first_new = tokens.index(new.token)
    assert all(token == new.token for token in tokens[first_new:]), tokens
    assert tokens.count(old.token) + refused[old.token] == 21  # the seed and 20 tries


def test_database_backend_fences_another_database_with_its_fence_row(
    alias: str, lease_name: str
) -> None:
    """The database backend locks its own lease row; asked to fence writes in another
    database, it uses that database's fence row as every other store does."""
    require("postgresql")
    store_alias = "postgresql" if alias != "postgresql" else "default"
    store = DatabaseBackend(store_alias)
    try:
        old = take(store, lease_name, "alice", SHORT_TTL)
        write(old, alias, "old")
        new = successor(store, old)
        write(new, alias, "new")
        with pytest.raises(LeadershipLost, match="fenced off"):
            write(old, alias, "stale")
        assert written(alias, lease_name) == [(old.token, "old"), (new.token, "new")]
        assert not LeaseFence.objects.using(store_alias).filter(name=lease_name).exists()
    finally:
        store.close()


def test_the_database_backends_own_database_still_uses_the_lease_row(
    alias: str, lease_name: str
) -> None:
    store = DatabaseBackend(alias)
    try:
        lease = take(store, lease_name, "alice")
        write(lease, alias, "own")
        assert written(alias, lease_name) == [(lease.token, "own")]
        assert not LeaseFence.objects.using(alias).filter(name=lease_name).exists()
    finally:
        store.close()


def test_names_that_differ_in_case_have_fence_rows_of_their_own(
    store: Backend, alias: str, lease_name: str
) -> None:
    """MySQL's default collation would make "A" and "a" one row (migration 0008 gives the
    name a binary collation, as 0004 does for the lease rows)."""
    upper = take(store, lease_name.upper(), "alice")
    lower = take(store, lease_name, "bob")
    assert lower.token > upper.token  # Redis tokens are seeded from its clock
    write(lower, alias)
    write(upper, alias)  # its own row: never fenced off by the other name's token
    fences = LeaseFence.objects.using(alias).filter(name__in=[upper.name, lower.name])
    assert sorted(fences.values_list("name", "token")) == sorted(
        [(upper.name, upper.token), (lower.name, lower.token)]
    )
