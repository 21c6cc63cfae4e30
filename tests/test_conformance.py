"""The lease contract, run unchanged against every store (SPEC.md, rules 1-5)."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from django.db import connections, transaction

from django_leader import LeadershipLost
from django_leader.lease import clock
from tests.conftest import history, stores_db, wipe

pytestmark = stores_db

TTL = 1.0


def wait_until_expired(backend: Any, name: str, timeout: float = 10.0) -> None:
    """Wait until the store itself says nobody holds ``name`` (its clock, not ours)."""
    give_up = time.monotonic() + timeout
    while backend.read(name) is not None:
        assert time.monotonic() < give_up, "lease never expired"
        time.sleep(0.05)


def test_acquire_free_lease(backend: Any, lease_name: str) -> None:
    lease, current = backend.acquire(lease_name, "alice", TTL)
    assert lease is not None and current is lease
    assert (lease.name, lease.holder, lease.transitions) == (lease_name, "alice", 1)
    assert lease.token >= 1
    assert lease.acquired_at == lease.renewed_at
    assert lease.expires_at - lease.acquired_at == datetime.timedelta(seconds=TTL)
    assert backend.read(lease_name).holder == "alice"


def test_second_holder_refused_while_unexpired(backend: Any, lease_name: str) -> None:
    first, _ = backend.acquire(lease_name, "alice", 30)
    second, current = backend.acquire(lease_name, "bob", 30)
    assert second is None
    assert current is not None and (current.holder, current.token) == ("alice", first.token)
    # The holder itself cannot "acquire" again either: it must renew.
    again, _ = backend.acquire(lease_name, "alice", 30)
    assert again is None


def test_takeover_after_expiry(backend: Any, lease_name: str) -> None:
    first, _ = backend.acquire(lease_name, "alice", TTL)
    wait_until_expired(backend, lease_name)
    second, _ = backend.acquire(lease_name, "bob", TTL)
    assert second is not None and second.holder == "bob"
    assert second.token == first.token + 1
    assert second.transitions == first.transitions + 1
    assert history(backend, lease_name)[-1] == ("taken_over", "bob", "alice", second.token, "")


def test_renew_by_holder_extends_expiry(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", TTL)
    time.sleep(0.05)
    renewed = backend.renew(lease, 5.0)
    assert renewed is not None and renewed.token == lease.token
    assert renewed.expires_at > lease.expires_at
    assert renewed.expires_at - renewed.renewed_at == datetime.timedelta(seconds=5)
    # Still held after the original TTL: the renewal counts on the store's clock.
    time.sleep(TTL + 0.2)
    assert backend.read(lease_name).token == lease.token
    # Renewals update the lease, not the history.
    assert [event[0] for event in history(backend, lease_name)] == ["acquired"]


def test_renew_by_non_holder_refused(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", 30)
    impostor = type(lease)(**{**vars(lease), "holder": "mallory"})
    assert backend.renew(impostor, 30) is None
    stale_token = type(lease)(**{**vars(lease), "token": lease.token - 1})
    assert backend.renew(stale_token, 30) is None
    assert backend.read(lease_name).expires_at == lease.expires_at


def test_renew_of_expired_lease_refused(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", TTL)
    wait_until_expired(backend, lease_name)
    assert backend.renew(lease, TTL) is None


def test_renew_fails_after_takeover_and_late_release_is_noop(backend: Any, lease_name: str) -> None:
    old, _ = backend.acquire(lease_name, "alice", TTL)
    wait_until_expired(backend, lease_name)
    new, _ = backend.acquire(lease_name, "bob", 30)
    assert backend.renew(old, 30) is None
    assert backend.release(old) is False
    current = backend.read(lease_name)
    assert (current.holder, current.token) == ("bob", new.token)


def test_release_then_immediate_acquire_by_another(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", 30)
    assert backend.release(lease) is True
    assert backend.read(lease_name) is None
    taken, _ = backend.acquire(lease_name, "bob", 30)
    assert taken is not None and taken.token == lease.token + 1
    kinds = [event[:2] for event in history(backend, lease_name)]
    assert kinds == [("acquired", "alice"), ("released", "alice"), ("acquired", "bob")]


def test_release_by_non_holder_is_noop(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", 30)
    impostor = type(lease)(**{**vars(lease), "holder": "mallory"})
    assert backend.release(impostor) is False
    assert backend.read(lease_name).holder == "alice"
    assert backend.release(lease) is True
    assert backend.release(lease) is False  # twice is still a no-op


def test_force_release(backend: Any, lease_name: str) -> None:
    lease, _ = backend.acquire(lease_name, "alice", TTL)
    released = backend.force_release(lease_name, actor="operator", detail="maintenance")
    assert released is not None and (released.holder, released.token) == ("alice", lease.token)
    assert backend.read(lease_name) is None
    assert backend.renew(lease, TTL) is None  # the holder notices at its next renewal
    assert backend.force_release(lease_name) is None
    # Until the term ends nobody takes over: the holder may not have noticed yet; and
    # nobody is reported as holding it meanwhile.
    assert backend.acquire(lease_name, "bob", 30) == (None, None)
    give_up = time.monotonic() + 10
    while (taken := backend.acquire(lease_name, "bob", 30)[0]) is None:
        assert time.monotonic() < give_up, "never acquirable after the term ended"
        time.sleep(0.05)
    assert taken.token == lease.token + 1
    assert backend.release(lease) is False  # the old holder's late release changes nothing
    kinds = [(event[0], event[1], event[4]) for event in history(backend, lease_name)]
    assert kinds == [
        ("acquired", "alice", ""),
        ("forced_release", "alice", "operator"),
        ("acquired", "bob", ""),
    ]


@pytest.mark.parametrize("released", [True, False], ids=["released", "held"])
def test_store_that_forgets_a_lease_waits_out_its_term_and_never_repeats_a_token(
    backend: Any, lease_name: str, released: bool, settings: Any
) -> None:
    """A store that loses a lease (its Redis keys or its database row deleted by hand)
    lets nobody take it while the holder could still believe it leads (SPEC rule 7), and
    the next holder's token is still greater (rule 3)."""
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "LOCK_DELAY": 0}  # delay = ttl
    first, _ = backend.acquire(lease_name, "alice", TTL)
    assert first is not None
    if released:
        backend.release(first)
    assert backend.flush_history(10)
    wipe(backend, lease_name)
    give_up = time.monotonic() + 10 * TTL + 5
    while (second := backend.acquire(lease_name, "bob", TTL)[0]) is None:
        assert time.monotonic() < give_up, "the forgotten lease was never given again"
        time.sleep(0.05)
    assert second.token > first.token
    if not released:
        # By the store's own clock, not before alice's term could have ended.
        assert second.acquired_at >= first.expires_at
    third, _ = backend.acquire(lease_name, "carol", TTL)
    assert third is None  # and the new lease is honoured as usual
    assert backend.renew(first, TTL) is None


@pytest.mark.parametrize("skew", [-3600, 3600], ids=["behind-1h", "ahead-1h"])
def test_client_clock_skew_changes_nothing(backend: Any, lease_name: str, skew: int) -> None:
    time_machine = pytest.importorskip("time_machine")
    with time_machine.travel(
        datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=skew), tick=True
    ):
        lease, _ = backend.acquire(lease_name, "alice", TTL)
        assert lease is not None
        server_now = lease.acquired_at
        # The store's times are the store's: an hour of client skew does not show.
        assert (
            abs((server_now - datetime.datetime.now(datetime.timezone.utc)).total_seconds() + skew)
            < 60
        )
        assert backend.acquire(lease_name, "bob", TTL)[0] is None
        assert backend.renew(lease, TTL) is not None
        wait_until_expired(backend, lease_name)
        taken, _ = backend.acquire(lease_name, "bob", TTL)
        assert taken is not None and taken.token == lease.token + 1


def test_threads_race_exactly_one_wins(backend: Any, lease_name: str) -> None:
    barrier = threading.Barrier(20)
    winners: list[str] = []
    errors: list[BaseException] = []

    def contend(i: int) -> None:
        try:
            barrier.wait()
            lease, _ = backend.acquire(lease_name, f"thread-{i}", 30)
            if lease is not None:
                winners.append(lease.holder)
        except BaseException as exc:
            errors.append(exc)
        finally:
            backend.close()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A contender may see a transient "busy" error (SQLite's lock), never a second win.
    assert len(winners) == 1, (winners, errors)
    assert backend.read(lease_name).holder == winners[0]


def test_lease_commits_inside_callers_atomic(db_alias: str, lease_name: str) -> None:
    from django_leader import lock
    from django_leader.backends.db import DatabaseBackend

    observer = DatabaseBackend(db_alias)
    try:
        with (
            transaction.atomic(using=db_alias),
            lock(lease_name, backend=DatabaseBackend(db_alias), blocking=False) as lease,
        ):
            # Another connection sees the lease while the caller's transaction is open.
            seen = observer.read(lease_name)
            assert seen is not None and seen.token == lease.token
            raise_rollback = True
        assert raise_rollback
    finally:
        observer.close()


def test_lease_survives_callers_rollback(db_alias: str, lease_name: str) -> None:
    from django_leader.backends.db import DatabaseBackend

    store = DatabaseBackend(db_alias)
    try:
        with pytest.raises(RuntimeError), transaction.atomic(using=db_alias):
            lease, _ = store.acquire(lease_name, "alice", 30)
            raise RuntimeError("caller rolls back")
        assert store.read(lease_name).token == lease.token
    finally:
        store.close()


def test_fenced_write_commits_while_held(db_backend: Any, lease_name: str) -> None:
    from django_leader.conf import resolve_timing
    from django_leader.locks import acquire_once
    from testproject.demoapp.models import FencedWrite

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(30))
    with lease.fenced():
        FencedWrite.objects.using(db_backend.alias).create(writer="alice", token=lease.token)
    assert FencedWrite.objects.using(db_backend.alias).filter(token=lease.token).count() == 1


def test_fenced_write_rejected_after_takeover(db_backend: Any, lease_name: str) -> None:
    from django_leader.conf import resolve_timing
    from django_leader.locks import acquire_once
    from testproject.demoapp.models import FencedWrite

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(TTL))
    wait_until_expired(db_backend, lease_name)
    db_backend.acquire(lease_name, "bob", 30)
    lease.deadline = clock() + 60  # pretend the local deadline did not catch it
    with pytest.raises(LeadershipLost), lease.fenced():
        FencedWrite.objects.using(db_backend.alias).create(writer="alice", token=lease.token)
    assert not FencedWrite.objects.using(db_backend.alias).filter(writer="alice").exists()


def test_fenced_refused_by_cache_backend(backend: Any, lease_name: str) -> None:
    """Redis is not the database the writes go to: fencing there cannot be atomic with them."""
    from django_leader import NotSupportedError
    from django_leader.backends.cache import CacheBackend
    from django_leader.conf import resolve_timing
    from django_leader.locks import acquire_once

    lease, _ = acquire_once(backend, lease_name, "alice", resolve_timing(30))
    if isinstance(backend, CacheBackend):
        with pytest.raises(NotSupportedError), lease.fenced():
            pytest.fail("fenced() entered on the cache backend")
    else:
        with lease.fenced():
            pass


def test_fenced_uses_statement_time_inside_callers_transaction(
    db_backend: Any, lease_name: str
) -> None:
    """An outer transaction that began before the lease expired must not make it look
    unexpired (PostgreSQL's now() is the transaction's start time)."""
    from django_leader.conf import resolve_timing
    from django_leader.locks import acquire_once

    lease, _ = acquire_once(db_backend, lease_name, "alice", resolve_timing(TTL))
    with transaction.atomic(using=db_backend.alias):
        with connections[db_backend.alias].cursor() as cursor:
            cursor.execute("SELECT 1")  # the transaction has begun
        time.sleep(TTL + 0.3)
        lease.deadline = clock() + 60  # pretend the local deadline missed it
        with pytest.raises(LeadershipLost), lease.fenced():
            pytest.fail("fenced() passed an expired lease")


def test_names_are_exact(backend: Any, lease_name: str) -> None:
    """Case and accents make different leases on every store (MySQL included)."""
    names = [f"{lease_name}-Report", f"{lease_name}-report", f"{lease_name}-rèport"]
    tokens = [backend.acquire(name, f"holder-{i}", 30)[0] for i, name in enumerate(names)]
    assert all(token is not None for token in tokens)
    assert [backend.read(name).holder for name in names] == ["holder-0", "holder-1", "holder-2"]


def test_candidates_announce_expire_and_withdraw(backend: Any, lease_name: str) -> None:
    """Who campaigns (for ``leader status``): announced, expired by the store's clock, withdrawn."""
    assert backend.candidates(lease_name) == []
    backend.announce(lease_name, "bob", 30)
    backend.announce(lease_name, "alice", 30)
    backend.announce(lease_name, "carol", 3.0)
    backend.announce(lease_name, "bob", 30)  # again: still one entry
    assert backend.candidates(lease_name) == ["alice", "bob", "carol"]
    assert backend.candidates(f"{lease_name}-other") == []

    backend.withdraw(lease_name, "alice")
    backend.withdraw(lease_name, "nobody")  # a no-op
    give_up = time.monotonic() + 15
    while backend.candidates(lease_name) != ["bob"]:  # carol's candidacy expires
        assert time.monotonic() < give_up, backend.candidates(lease_name)
        time.sleep(0.05)
    # Candidacy is no lease: bob announced, yet anyone may take the lease.
    lease, _ = backend.acquire(lease_name, "dave", 30)
    assert lease is not None and lease.holder == "dave"
