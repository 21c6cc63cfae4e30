"""lock(): acquisition, refusal, timeouts, reentrancy, background renewal, loss."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_leader import LeadershipLost, LeaseHeld, alock, lock
from django_leader.exceptions import StoreBusy
from tests.support.faults import FaultyBackend
from tests.support.forking import in_child_while_held, wait_child
from tests.support.stores import CACHE_STORES, OTHER_STORES, history, stores_db

pytestmark = stores_db
WAIT = 10.0


def test_lock_holds_and_releases(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend) as lease:
        assert lease.held and lease.holder and lease.token >= 1
        assert backend.read(lease_name).token == lease.token
    assert not lease.held
    assert backend.read(lease_name) is None
    assert [event[0] for event in history(backend, lease_name)] == ["acquired", "released"]


def test_non_blocking_lock_of_held_lease_raises(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "someone-else", 30)
    with (
        pytest.raises(LeaseHeld, match="someone-else"),
        lock(lease_name, backend=backend, blocking=False),
    ):
        pytest.fail("entered a lock held elsewhere")


def test_blocking_lock_times_out(backend: Any, lease_name: str) -> None:
    backend.acquire(lease_name, "someone-else", 30)
    started = time.monotonic()
    with pytest.raises(LeaseHeld), lock(lease_name, backend=backend, timeout=0.5):
        pytest.fail("entered a lock held elsewhere")
    assert 0.5 <= time.monotonic() - started < WAIT


def test_blocking_lock_waits_for_release(backend: Any, lease_name: str) -> None:
    other, _ = backend.acquire(lease_name, "someone-else", 30)
    threading.Timer(0.3, _release_in_thread, args=(backend, other)).start()
    with lock(lease_name, backend=backend, timeout=WAIT) as lease:
        assert lease.token == other.token + 1


def _release_in_thread(backend: Any, lease: Any) -> None:
    try:
        backend.release(lease)
    finally:
        backend.close()


def try_from_another_thread(lease_name: str, backend: Any) -> list[str]:
    """One non-blocking ``lock()`` attempt in a thread of its own: ``["entered"]`` or
    ``["refused"]`` (empty if the thread did not finish within WAIT)."""
    outcome: list[str] = []

    def contender() -> None:
        try:
            with lock(lease_name, backend=backend, blocking=False):
                outcome.append("entered")
        except LeaseHeld:
            outcome.append("refused")
        finally:
            backend.close()

    thread = threading.Thread(target=contender)
    thread.start()
    thread.join(WAIT)
    return outcome


def test_lock_excludes_other_threads(backend: Any, lease_name: str) -> None:
    inside = threading.Event()
    leave = threading.Event()

    def holder() -> None:
        with lock(lease_name, ttl=30, backend=backend):
            inside.set()
            leave.wait(WAIT)
        backend.close()

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(WAIT)
    outcome = try_from_another_thread(lease_name, backend)
    leave.set()
    t.join()
    assert outcome == ["refused"]


def test_reentrant_within_a_thread(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend) as outer:
        with lock(lease_name, backend=backend, blocking=False) as inner:
            assert inner is outer
        # The inner exit did not release.
        assert backend.read(lease_name).token == outer.token
        assert outer.held
    assert backend.read(lease_name) is None


def test_renews_in_background(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=2.0, backend=backend) as lease:
        first_expiry = lease.expires_at
        time.sleep(4.0)  # twice the TTL: only renewals keep it
        assert lease.held
        assert lease.expires_at > first_expiry
        assert backend.read(lease_name).token == lease.token


def test_lost_lock_is_visible_in_block(backend: Any, lease_name: str) -> None:
    faulty = FaultyBackend(backend)
    with lock(lease_name, ttl=1.0, backend=faulty) as lease:
        faulty.hang_renew.set()
        assert lease.lost.wait(WAIT)
        with pytest.raises(LeadershipLost):
            lease.check()
        faulty.unblock.set()
    assert not lease.held


def test_lock_released_when_block_raises(backend: Any, lease_name: str) -> None:
    with pytest.raises(ZeroDivisionError), lock(lease_name, ttl=30, backend=backend):
        1 / 0  # noqa: B018
    assert backend.read(lease_name) is None


def test_one_lock_object_used_by_several_threads(backend: Any, lease_name: str) -> None:
    """Each thread's hold is its own: one thread's exit never stops another's renewals
    nor closes its connection."""
    shared = lock(lease_name, ttl=1.0, timeout=30, backend=backend)
    tokens: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with shared as lease:
                tokens.append(lease.token)
                time.sleep(1.5)  # past the TTL: only this thread's renewer keeps it
                lease.check()
                assert backend.read(lease_name).token == lease.token
        except BaseException as exc:
            errors.append(exc)
        finally:
            backend.close()  # this thread's own store connection, as with Django's

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(tokens) == 2 and tokens == sorted(set(tokens))  # one after the other
    assert backend.read(lease_name) is None


# -- reentrancy is per thread and per asyncio task, never across a fork (defect 9) ----------
def test_forked_child_does_not_reenter_its_parents_lock(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend) as lease:
        pid = os.fork()
        if pid == 0:  # the child: it must acquire for itself, and be refused
            code = 3
            try:
                with lock(lease_name, blocking=False, backend=backend):
                    code = 1
            except LeaseHeld:
                code = 0
            except BaseException:
                code = 2
            finally:
                os._exit(code)
        assert wait_child(pid, WAIT) == 0, "the forked child entered its parent's lock"
        assert lease.held
        assert backend.read(lease_name).token == lease.token


def test_forked_child_leaving_the_block_does_not_release_the_parents_lease(
    backend: Any, lease_name: str
) -> None:
    held = lock(lease_name, ttl=30, backend=backend)
    lease = held.__enter__()
    try:
        pid = os.fork()
        if pid == 0:  # the child runs on through the end of the parent's block
            code = 1
            try:
                held.__exit__(None, None, None)
                code = 0
            finally:
                os._exit(code)
        assert wait_child(pid, WAIT) == 0
        current = backend.read(lease_name)
        assert current is not None and current.token == lease.token, "child released it"
        assert lease.held
    finally:
        held.__exit__(None, None, None)
    assert backend.read(lease_name) is None


def _locks_of(*owners: Any) -> list[Any]:
    """The locks kept as attributes of ``owners`` (a backend, its history writer)."""
    return [
        value
        for owner in owners
        if owner is not None
        for value in vars(owner).values()
        if all(hasattr(value, method) for method in ("acquire", "release", "locked"))
    ]


@pytest.mark.parametrize("backend", [*CACHE_STORES, *OTHER_STORES], indirect=True)
def test_a_child_forked_while_a_parent_thread_held_a_store_lock_uses_the_store(
    backend: Any, lease_name: str
) -> None:
    """CI failure: a celery pool process, forked while the worker's main process was
    connecting to ZooKeeper (releasing the lock of a killed pool process), hung on its
    first lock() until the task's hard time limit killed it: the backend's lock had been
    held by a thread of the parent at the fork, and nothing in the child would release it.
    The same for the history writer of Redis and ZooKeeper. Here a thread of the parent
    holds every lock of the backend and of its history writer across the fork: the child
    takes a lock of its own (and records it in the history)."""
    assert backend.acquire(f"{lease_name}-warm", "parent", 30)[0] is not None  # connected
    locks = _locks_of(backend, getattr(backend, "_history", None))
    assert locks, "no lock found to hold"

    def first_call() -> bool:
        with lock(lease_name, ttl=30, blocking=False, backend=backend):
            return True

    assert in_child_while_held(locks, first_call, timeout=20) == 0, (
        "the forked child could not use the store"
    )


def test_two_asyncio_tasks_are_two_holders(backend: Any, lease_name: str) -> None:
    outcome: list[str] = []

    async def main() -> None:
        entered = asyncio.Event()
        tried = asyncio.Event()

        async def first() -> None:
            with lock(lease_name, ttl=30, backend=backend):
                entered.set()
                await tried.wait()

        async def second() -> None:
            await entered.wait()
            try:
                with lock(lease_name, blocking=False, backend=backend):
                    outcome.append("entered")
            except LeaseHeld:
                outcome.append("refused")
            finally:
                tried.set()

        await asyncio.wait_for(asyncio.gather(first(), second()), WAIT)

    asyncio.run(main())
    assert outcome == ["refused"]
    assert backend.read(lease_name) is None


def test_nested_lock_in_one_task_reenters(backend: Any, lease_name: str) -> None:
    async def main() -> bool:
        with lock(lease_name, ttl=30, backend=backend) as outer:
            await asyncio.sleep(0)
            with lock(lease_name, blocking=False, backend=backend) as inner:
                await asyncio.sleep(0)
            # The inner exit did not release (no store call here: Django's ORM refuses
            # to be called from a coroutine).
            return inner is outer and outer.held

    assert asyncio.run(main())
    assert backend.read(lease_name) is None


def test_thread_started_inside_a_lock_is_another_holder(backend: Any, lease_name: str) -> None:
    with lock(lease_name, ttl=30, backend=backend):
        outcome = try_from_another_thread(lease_name, backend)
    assert outcome == ["refused"]


def test_asyncio_to_thread_callers_never_both_inside(backend: Any, lease_name: str) -> None:
    inside: list[int] = []
    overlaps: list[int] = []
    guard = threading.Lock()

    def critical() -> None:
        with lock(lease_name, ttl=30, timeout=WAIT, backend=backend):
            with guard:
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
            time.sleep(0.05)  # stay inside a while, so that an overlap would show
            with guard:
                inside.pop()
        backend.close()

    async def main() -> None:
        await asyncio.gather(*(asyncio.to_thread(critical) for _ in range(3)))

    asyncio.run(main())
    assert overlaps == []


def test_refusal_without_holder_names_force_release_and_lock_delay(
    backend: Any, lease_name: str
) -> None:
    """Refused with nobody holding it (acquire answered (None, None)): the message names
    both reasons, a force-released term not over yet and the lock-delay."""
    backend.acquire(lease_name, "someone-else", 30)
    assert backend.force_release(lease_name, actor="test") is not None
    with (
        pytest.raises(LeaseHeld, match=r"(?s)force-released.*lock-delay"),
        lock(lease_name, backend=backend, blocking=False),
    ):
        pytest.fail("entered the lease of a force-released term")


# -- SQLite's one write lock, held by another client -------------------------------------
class Writer:
    """Another client's write transaction on the test SQLite database (another process's,
    as far as the backend can tell), holding the database's one write lock until
    :meth:`commit`, in a thread of its own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.locked, self.committing, self.go = (threading.Event() for _ in range(3))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.locked.wait(WAIT)

    def _run(self) -> None:
        import sqlite3

        writer = sqlite3.connect(self.path, isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")  # the database's one write lock
            self.locked.set()
            self.go.wait(WAIT)
            self.committing.set()  # before the lock is let go: nobody gets in sooner
            writer.execute("COMMIT")
        finally:
            writer.close()

    def commit(self, after: float = 0.0) -> None:
        """Let the write lock go, now or ``after`` seconds from now."""
        threading.Timer(after, self.go.set).start()


@pytest.fixture
def sqlite_writer() -> Iterator[Callable[[], Writer]]:
    from django.db import connections

    if connections["default"].vendor != "sqlite":
        pytest.skip("the default database is not SQLite")
    writers: list[Writer] = []

    def start() -> Writer:
        writers.append(Writer(connections["default"].settings_dict["NAME"]))
        return writers[-1]

    yield start
    for writer in writers:
        writer.go.set()
        writer.thread.join(WAIT)


@pytest.fixture
def busy_sqlite() -> Iterator[Any]:
    """A backend of the SQLite test database whose statements give up after 0.2 s busy."""
    from django_leader.backends.db import DatabaseBackend

    store = DatabaseBackend("default", timeout=0.2)
    yield store
    store.close()


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("kind", ["lock", "alock"])
def test_blocking_lock_waits_out_another_clients_sqlite_write(
    kind: str, sqlite_writer: Any, busy_sqlite: Any, lease_name: str
) -> None:
    """Another client's write transaction on SQLite outlasts the busy timeout of the
    acquisition: that is contention, not an outage. A blocking lock() tries again, as for
    a held lease, and enters once the writer is done (it raised BackendUnavailable at the
    first busy answer: seen under load in test_async_multiprocess with nine contenders)."""
    writer = sqlite_writer()
    writer.commit(after=1.0)
    if kind == "lock":
        with lock(lease_name, ttl=3, timeout=WAIT, backend=busy_sqlite) as lease:
            assert writer.committing.is_set() and lease.held
    else:

        async def enter() -> None:
            async with alock(lease_name, ttl=3, timeout=WAIT, backend=busy_sqlite) as lease:
                assert writer.committing.is_set() and lease.held

        asyncio.run(enter())
    assert [event[0] for event in history(busy_sqlite, lease_name)] == ["acquired", "released"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_busy_sqlite_is_reported_when_not_waiting_or_out_of_time(
    sqlite_writer: Any, busy_sqlite: Any, lease_name: str
) -> None:
    """Not blocking, or blocking past its timeout, the lock says the store was busy
    (StoreBusy, a BackendUnavailable), not that someone holds the lease."""
    writer = sqlite_writer()
    with (
        pytest.raises(StoreBusy, match="database is locked"),
        lock(lease_name, ttl=3, blocking=False, backend=busy_sqlite),
    ):
        pytest.fail("entered while the database was locked")
    started = time.monotonic()
    with (
        pytest.raises(StoreBusy, match="database is locked"),
        lock(lease_name, ttl=3, timeout=0.6, backend=busy_sqlite),
    ):
        pytest.fail("entered while the database was locked")
    assert time.monotonic() - started >= 0.6
    assert not writer.committing.is_set()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_lock_inside_the_threads_own_sqlite_write_is_not_waited_out(
    busy_sqlite: Any, lease_name: str
) -> None:
    """This thread's own transaction.atomic() holds SQLite's write lock: a blocking lock()
    would wait for itself. It raises StoreBusy at once, saying why."""
    from django.db import connections, transaction

    if connections["default"].vendor != "sqlite":
        pytest.skip("the default database is not SQLite")
    started = time.monotonic()
    with transaction.atomic(using="default"):
        connections["default"].cursor().execute(
            "UPDATE django_leader_lease SET holder = holder WHERE name = %s", [lease_name]
        )  # a write: the transaction takes the database's write lock
        with (
            pytest.raises(StoreBusy, match=r"this thread's own transaction\.atomic\(\)"),
            lock(lease_name, ttl=3, timeout=WAIT, backend=busy_sqlite),
        ):
            pytest.fail("entered while this thread held the write lock")
    assert time.monotonic() - started < WAIT


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_blocking_lock_waits_out_the_holders_fenced_transaction(
    db_alias: str, lease_name: str
) -> None:
    """The holder is inside ``lease.fenced()`` (its lease row locked; on SQLite, the
    database's write lock) for longer than the waiter's call bound; when it releases, the
    blocking lock() enters. It raised BackendUnavailable on MariaDB ("Lock wait timeout
    exceeded", 1205) and SQLite ("database is locked") instead: contention taken for an
    outage. PostgreSQL waited already."""
    from django_leader.backends.db import DatabaseBackend

    holder_store, waiter_store = DatabaseBackend(db_alias), DatabaseBackend(db_alias, timeout=0.3)
    inside, fenced_over = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with lock(lease_name, ttl=10, backend=holder_store) as lease:
                with lease.fenced():
                    inside.set()
                    time.sleep(2.0)
                fenced_over.set()  # before the release: nobody gets in sooner
        finally:
            holder_store.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(WAIT)
        with lock(lease_name, ttl=3, timeout=WAIT, backend=waiter_store) as lease:
            assert fenced_over.is_set() and lease.held
    finally:
        holder.join(WAIT)
        waiter_store.close()
