"""Sessions: one renewal loop per process and store for every lease held (issue 14).

Against every real store: many locks renewed together by ``renew_many`` batches, each lease
still lost on its own terms (a refusal, its own deadline while a batch hangs), reports off
the loop, and an idle session that ends its threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from django_leader import Elector, lock, session, signals
from django_leader.backends.db import DatabaseBackend
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import Lease, LossReason, clock
from tests.support.counting import CountingBackend
from tests.support.faults import FaultyBackend
from tests.support.stores import open_store, require, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db
WAIT = 15.0
TTL = 2.4  # renewed every 0.8 s


def held(stack: ExitStack, names: list[str], backend: Any) -> list[Lease]:
    return [stack.enter_context(lock(name, ttl=TTL, backend=backend)) for name in names]


def test_many_locks_are_renewed_together(backend: Any, lease_name: str) -> None:
    counted = CountingBackend(backend)
    names = [f"{lease_name}-{i}" for i in range(120)]
    with ExitStack() as stack:
        leases = held(stack, names, counted)
        assert session.session(counted).leases == len(names)
        started = clock()
        first = {lease.name: lease.renewed_at for lease in leases}
        intervals = 3
        time.sleep(intervals * TTL / 3)
        calls = counted.log.between(started)
        assert all(lease.held for lease in leases)
        # Every lease was renewed since, in batches: never one renew() call per lease.
        assert all(lease.renewed_at != first[lease.name] for lease in leases)
        tally = counted.log.tally(calls)
        assert tally["renew"] == 0, tally
        # At most about two batches per interval, however many leases (acquisitions spread
        # over time are pulled into one batch by renewing a little early).
        assert 1 <= tally["renew_many"] <= 3 * (intervals + 1), tally
    assert session.session(counted).leases == 0
    assert all(not lease.held for lease in leases)
    assert all(backend.read(name) is None for name in names)


def test_a_refused_lease_costs_no_other_its_term(backend: Any, lease_name: str) -> None:
    names = [f"{lease_name}-{i}" for i in range(12)]
    with ExitStack() as stack:
        leases = held(stack, names, backend)
        victim, others = leases[5], leases[:5] + leases[6:]
        assert backend.force_release(victim.name) is not None
        assert victim.lost.wait(WAIT)
        assert victim.lost_cause is LossReason.REFUSED
        renewed = {lease.name: lease.renewed_at for lease in others}
        wait_until(
            lambda: all(lease.renewed_at != renewed[lease.name] for lease in others),
            timeout=WAIT,
            message="the other leases were not renewed after the refusal",
        )
        assert all(lease.held for lease in others)


def test_a_hung_batch_loses_each_lease_at_its_own_deadline(
    db_backend: Any, lease_name: str
) -> None:
    """A batch that hangs keeps its leases in flight; each is lost when its own deadline
    passes (not all at the first), and leases taken afterwards are renewed on a new
    connection, not queued behind the hung call."""
    faulty = FaultyBackend(db_backend)
    with ExitStack() as stack:
        first = stack.enter_context(lock(f"{lease_name}-a", ttl=TTL, backend=faulty))
        time.sleep(0.3)  # a later deadline; renewed in the same batch (a little early)
        second = stack.enter_context(lock(f"{lease_name}-b", ttl=TTL, backend=faulty))
        faulty.hang_renew.set()
        assert faulty.renew_started.wait(WAIT)
        assert first.lost.wait(WAIT) and second.lost.wait(WAIT)
        assert first.lost_cause is LossReason.IN_FLIGHT
        assert second.lost_cause is LossReason.IN_FLIGHT
        faulty.hang_renew.clear()  # new renewals answer; the hung one still hangs
        third = stack.enter_context(lock(f"{lease_name}-c", ttl=TTL, backend=faulty))
        token = third.token
        renewed = third.renewed_at
        wait_until(
            lambda: third.renewed_at != renewed,
            timeout=WAIT,
            message="a lease taken after the hang was never renewed",
        )
        assert third.held and third.token == token
        faulty.unblock.set()
        assert faulty.hung_renew_returned.wait(WAIT)
        # The hung call's late answers revive nothing.
        assert not first.held and not second.held
    assert first.deadline is not None and second.deadline is not None
    assert first.deadline < second.deadline


def test_each_lease_is_lost_no_sooner_than_its_deadline(db_backend: Any, lease_name: str) -> None:
    faulty = FaultyBackend(db_backend)
    seen: dict[str, float] = {}

    def receiver(sender: Any, lease: Lease, **kwargs: Any) -> None:
        seen[lease.name] = clock()

    signals.leader_lost.connect(receiver, weak=False)
    try:
        with ExitStack() as stack:
            leases = []
            for i in range(3):
                leases.append(
                    stack.enter_context(lock(f"{lease_name}-{i}", ttl=TTL, backend=faulty))
                )
                time.sleep(0.2)
            faulty.hang_renew.set()
            for lease in leases:
                assert lease.lost.wait(WAIT)
            deadlines = {lease.name: lease.deadline or 0.0 for lease in leases}
            wait_until(lambda: len(seen) == 3, timeout=WAIT, message=lambda: seen)
            faulty.unblock.set()
    finally:
        signals.leader_lost.disconnect(receiver)
    for name, at in seen.items():
        assert at >= deadlines[name] > 0, (name, at, deadlines[name])
    # Lost in the order of their deadlines, one by one.
    assert sorted(seen, key=seen.__getitem__) == sorted(deadlines, key=deadlines.__getitem__)


def test_a_slow_loss_receiver_never_holds_back_the_renewals(backend: Any, lease_name: str) -> None:
    """``leader_lost`` receivers (user code) run on the session's caller, not its loop:
    while one blocks, every other lease is still renewed."""
    release = threading.Event()
    entered = threading.Event()

    def receiver(sender: Any, lease: Lease, **kwargs: Any) -> None:
        if lease.name.startswith(lease_name):
            entered.set()
            release.wait(WAIT)

    signals.leader_lost.connect(receiver, weak=False)
    try:
        with ExitStack() as stack:
            victim, other = held(stack, [f"{lease_name}-victim", f"{lease_name}-other"], backend)
            backend.force_release(victim.name)
            assert entered.wait(WAIT)
            renewed = other.renewed_at
            wait_until(
                lambda: other.renewed_at != renewed,
                timeout=WAIT,
                message="no renewal while a leader_lost receiver blocked",
            )
            assert other.held
            release.set()
    finally:
        release.set()
        signals.leader_lost.disconnect(receiver)


@pytest.mark.parametrize("idle", [0.3])
def test_an_idle_session_ends_its_threads(
    db_backend: Any, lease_name: str, idle: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "IDLE_TIMEOUT", idle)
    found = session.session(db_backend)
    with lock(lease_name, ttl=TTL, backend=db_backend) as lease:
        assert lease.held
        thread = found._thread
        assert thread is not None and thread.is_alive() and thread.name == "leader-session"
    thread.join(WAIT)
    assert not thread.is_alive()
    assert session.session(db_backend) is not found  # it left the registry
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("leader-io:session#")],
        timeout=WAIT,
        message=lambda: [t.name for t in threading.enumerate()],
    )


def watch_at_once(
    backend: Any, lease_name: str, count: int, then: Callable[[], Any] = lambda: None
) -> list[tuple[Any, Any]]:
    """``count`` threads watch a name each, all at the same instant (like Electors
    starting together): what each ``watch()`` gave, and what ``then()`` said right after
    in the same thread."""
    start = threading.Barrier(count)
    got: list[tuple[Any, Any]] = []
    guard = threading.Lock()

    def watch(i: int) -> None:
        start.wait()
        made = backend.watch(f"{lease_name}-{i}", lambda: None)
        seen = then()
        with guard:
            got.append((made, seen))

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    return got


@pytest.fixture(params=["postgresql", "redis", "django-redis"])
def pushing_backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A backend of each store that pushes wake-ups over a listening connection."""
    yield from open_store(request.param)


def test_watchers_starting_together_share_one_listening_thread(
    pushing_backend: Any, lease_name: str
) -> None:
    """20 Electors starting at once each watch their name: one listening connection and
    thread for all of them (each made its own, when they raced to make the first)."""
    count = 20
    watches = [made for made, _ in watch_at_once(pushing_backend, lease_name, count)]
    try:
        assert len(watches) == count
        wait_until(lambda: all(made.live for made in watches), timeout=WAIT, message="never live")
        listening = [t.name for t in threading.enumerate() if t.name.startswith("leader-listen")]
        assert len(listening) == 1, listening
    finally:
        for made in watches:
            made.close()


def test_watchers_of_a_database_keep_no_connection_of_their_own(
    lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 Electors start at once in a process that has not yet connected to PostgreSQL:
    each campaign thread watches its name, and the first watch connects to find out
    whether a transaction pooler is in the way. No campaign thread keeps a connection
    afterwards. Old code: every thread that watched before the first connection was made
    kept its own for as long as it campaigned (CI: 12 Electors held a role's 12
    connections, and no store call of the process could connect again)."""
    from django_leader.backends.db import connection as private_connections

    require("postgresql")
    backend = DatabaseBackend("postgresql")
    monkeypatch.delitem(private_connections._POOLED, "postgresql", raising=False)
    count = 20
    got = watch_at_once(
        backend,
        lease_name,
        count,
        then=lambda: backend._connection().connection is not None,  # this thread's own
    )
    watches = [made for made, _ in got]
    kept = [keeps for _, keeps in got]
    try:
        assert len(kept) == count
        assert sum(kept) == 0, f"{sum(kept)} of {count} watching threads kept a connection"
        assert all(made is not None for made in watches)  # PostgreSQL pushes: LISTEN
    finally:
        for made in watches:
            if made is not None:
                made.close()
        backend.close()


def test_each_hung_batch_leaves_one_thread_behind(db_backend: Any, lease_name: str) -> None:
    """A batch that hangs past its bound leaves its own worker (thread and connection)
    behind, and only that one: the worker that took over is not left too (old code: a
    second, fresh worker was abandoned per hang, one more thread and connection each)."""
    faulty = FaultyBackend(db_backend)
    found = session.session(faulty)
    hangs = 3
    try:
        for i in range(hangs):
            faulty.hang_renew.set()
            faulty.renew_started.clear()
            with lock(f"{lease_name}-{i}", ttl=TTL, backend=faulty) as lease:
                assert lease.deadline is not None
                assert faulty.renew_started.wait(WAIT)  # the batch hangs from now on
                # A loop late past the hung call's bound (a loaded machine): the loss it
                # reports finds the worker hung and replaces it before the loop looks.
                with session._registry_lock:
                    deadline = lease.deadline
                    while clock() < deadline + 0.2:
                        time.sleep(0.01)
                assert lease.lost.wait(WAIT)
                faulty.hang_renew.clear()
            # Whatever the loss queued has run on the session's worker.
            assert session.session(faulty) is found
            found.call(WAIT, lambda: None)
            assert found._pool is not None
            calls = found._pool.first
            assert calls.abandoned == i + 1, (calls.abandoned, i + 1)
    finally:
        faulty.unblock.set()
    assert found._pool is not None
    calls = found._pool.first
    assert calls._workers == hangs + 1, calls._workers
    wait_until(
        lambda: (
            len([t for t in threading.enumerate() if t.name.startswith("leader-io:session#")]) == 1
        ),
        timeout=WAIT,
        message=lambda: [t.name for t in threading.enumerate()],
    )


def test_a_session_that_ended_idle_is_never_used_again(
    db_backend: Any, lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Elector keeps the session it started with; when it waits longer than
    IDLE_TIMEOUT between two calls, that session ends and leaves the registry. Its next
    calls go to the registered session (old code: they started the orphan again, which
    close_all() never reached)."""
    monkeypatch.setattr(session, "IDLE_TIMEOUT", 0.2)
    starts: list[Any] = []
    start = session.Session._start

    def counted_start(self: Any) -> None:
        if self._thread is None:
            starts.append(self)
        start(self)

    monkeypatch.setattr(session.Session, "_start", counted_start)
    holder = DatabaseBackend(db_backend.alias)  # the leader: a session of its own
    counted = CountingBackend(db_backend)
    elector = Elector(lease_name, ttl=TTL, retry_interval=0.6, backend=counted)
    try:
        with lock(lease_name, ttl=TTL, backend=holder):
            elector.start()
            wait_until(
                lambda: session._registry.get(id(counted)) is not None,
                timeout=WAIT,
                message="the elector never used a session",
            )
            first = session._registry[id(counted)]
            wait_until(
                lambda: session._registry.get(id(counted)) is not first and first._thread is None,
                timeout=WAIT,
                message="the elector's session never ended idle",
            )
            attempts = counted.log.tally(counted.log.between())["acquire"]
            wait_until(
                lambda: counted.log.tally(counted.log.between())["acquire"] >= attempts + 2,
                timeout=WAIT,
                message="the elector stopped campaigning",
            )
            assert starts.count(first) == 1, "the session that ended idle was started again"
            assert first._pool is None and first._thread is None
            assert not elector.is_leader
    finally:
        elector.stop()
        holder.close()
    session.close_all(WAIT)
    assert not [t.name for t in threading.enumerate() if t.name == "leader-session"]


class SlowAcquire(FaultyBackend):
    """A real store whose acquisitions take ``delay`` seconds longer, noting the thread
    each ran on: calls that overlap show which threads ran them side by side."""

    def __init__(self, real: Any, delay: float) -> None:
        super().__init__(real)
        self.delay = delay
        self.threads: set[str] = set()

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        return self.real.acquire(name, holder, ttl)


def test_threads_locking_at_once_run_side_by_side_on_a_few_callers(
    db_backend: Any, lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: eight threads taking distinct locks at once queued on the session's one
    I/O thread and connection, one acquisition at a time (540 lock()/s on PostgreSQL with
    eight threads). Now up to WORKERS (4) callers run them side by side, each a thread with
    its own connection; one unused for IDLE seconds ends, and the metric hook is told how
    many there are."""
    from django_leader import callers, hooks

    monkeypatch.setattr(callers, "IDLE", 0.5)
    slow = SlowAcquire(db_backend, delay=0.3)
    counts: list[float] = []

    def observe(event: str, name: str, value: float) -> None:
        if event == "store_callers" and name == repr(slow):
            counts.append(value)

    hooks.add_observer(observe)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def take(i: int) -> None:
        start.wait()
        try:
            with lock(f"{lease_name}-{i}", ttl=TTL, backend=slow) as lease:
                assert lease.held
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not errors, errors
        ran_on = {name for name in slow.threads if name.startswith("leader-io:session")}
        # Side by side (old code: all eight on leader-io:session#1), never more than four.
        assert 2 <= len(ran_on) <= callers.WORKERS, sorted(slow.threads)
        assert ran_on == slow.threads, slow.threads  # every one on an I/O thread, bounded
        assert max(counts) == len(ran_on), counts
        # Unused, the added callers end and close their connections; the first stays.
        wait_until(lambda: counts[-1] == 1, timeout=WAIT, message=lambda: counts)
        wait_until(
            lambda: (
                {t.name.split("#")[0] for t in threading.enumerate() if t.name in ran_on}
                <= {"leader-io:session"}
            ),
            timeout=WAIT,
            message=lambda: [t.name for t in threading.enumerate()],
        )
    finally:
        hooks.remove_observer(observe)


class HangingAcquire(SlowAcquire):
    """The acquisitions of ``hang`` block until ``unblock`` is set."""

    def __init__(self, real: Any, delay: float, hang: str) -> None:
        super().__init__(real, delay)
        self.hang = hang

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        if name == self.hang:
            self.unblock.wait(60)
        return super().acquire(name, holder, ttl)


def test_a_call_hung_on_one_caller_holds_back_none_of_the_others(
    db_backend: Any, lease_name: str
) -> None:
    """Four threads lock at once; one acquisition hangs (a frozen connection). Its
    ``lock()`` fails within its bound, the three others are taken meanwhile on their own
    callers, and the hung grant, answered late, is handed back rather than left held."""
    hung = f"{lease_name}-0"
    faulty = HangingAcquire(db_backend, delay=0.0, hang=hung)
    start = threading.Barrier(4)
    outcome: dict[int, Any] = {}

    def take(i: int) -> None:
        start.wait()
        try:
            with lock(f"{lease_name}-{i}", ttl=TTL, backend=faulty, timeout=0) as lease:
                outcome[i] = lease.token
        except Exception as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert all(isinstance(outcome[i], int) for i in (1, 2, 3)), outcome
        assert isinstance(outcome[0], BackendUnavailable), outcome
    finally:
        faulty.unblock.set()
    # The late grant is released at once (on_late), not held until it expires.
    wait_until(
        lambda: db_backend.read(hung) is None and db_backend.names().count(hung) == 1,
        timeout=WAIT,
        message=lambda: db_backend.read(hung),
    )
