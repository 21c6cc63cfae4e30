"""What every lease store must do, as tests: :class:`LeaseContract`.

Acquire, renew, release, read, names and force release, each one atomic decision of the
store with the store's clock; tokens that only grow, even across a store that forgets; a
client clock that changes nothing; threads that race. The optional capabilities are tested
in :mod:`django_leader.testing.capabilities`, and :class:`~django_leader.testing.contract.
BackendContract` runs both (see :mod:`django_leader.testing.contract`).
"""

from __future__ import annotations

import datetime
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..backends.base import Backend
from ..lease import Lease

#: ``(kind, holder, previous_holder, token, actor)`` of one history event.
Event = tuple[str, str, str, int, str]


def history(backend: Backend, name: str) -> list[Event]:
    """``(kind, holder, previous_holder, token, actor)`` of each history event of ``name``
    in ``backend``'s history database, oldest first, once its queued events are written."""
    from ..models import LeaseEvent

    assert backend.flush_history(10), "history not written in time"
    return list(
        LeaseEvent.objects.using(backend.history_database)
        .filter(name=name)
        .order_by("at", "id")
        .values_list("kind", "holder", "previous_holder", "token", "actor")
    )


def wait_until_expired(backend: Backend, name: str, timeout: float = 10.0) -> None:
    """Wait until the store itself says nobody holds ``name`` (its clock, not ours)."""
    give_up = time.monotonic() + timeout
    while backend.read(name) is not None:
        assert time.monotonic() < give_up, "lease never expired"
        time.sleep(0.05)


class ContractBase:
    """What every part of the contract needs: the backend under test
    (:meth:`make_backend`), a lease name of each test's own, the short ttl."""

    #: The short lease time (seconds) of the expiry tests.
    ttl = 1.0

    def make_backend(self) -> Backend:
        """A new instance of the backend under test."""
        raise NotImplementedError("implement make_backend() in your subclass")

    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        store = self.make_backend()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def lease_name(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"


class LeaseContract(ContractBase):
    """The tests of the lease operations every store must pass, with the hooks every part
    of the contract uses (:meth:`forget`, :meth:`history_of`)."""

    def forget(self, backend: Backend, name: str) -> None:
        """Make the store lose all it knows of ``name`` (optional, see the module)."""
        raise NotImplementedError

    def history_of(self, backend: Backend, name: str) -> list[Event] | None:
        """The history events of ``name``, oldest first; None if the store keeps none."""
        if backend.history_database is None:
            return None
        return history(backend, name)

    def test_acquire_free_lease(self, backend: Any, lease_name: str) -> None:
        lease, current = backend.acquire(lease_name, "alice", self.ttl)
        assert lease is not None and current is lease
        assert (lease.name, lease.holder, lease.transitions) == (lease_name, "alice", 1)
        assert lease.token >= 1
        assert lease.acquired_at == lease.renewed_at
        assert lease.expires_at - lease.acquired_at == datetime.timedelta(seconds=self.ttl)
        assert backend.read(lease_name).holder == "alice"

    def test_second_holder_refused_while_unexpired(self, backend: Any, lease_name: str) -> None:
        first, _ = backend.acquire(lease_name, "alice", 30)
        second, current = backend.acquire(lease_name, "bob", 30)
        assert second is None
        assert current is not None and (current.holder, current.token) == ("alice", first.token)
        # The holder itself cannot "acquire" again either: it must renew.
        again, _ = backend.acquire(lease_name, "alice", 30)
        assert again is None

    def test_takeover_after_expiry(self, backend: Any, lease_name: str) -> None:
        first, _ = backend.acquire(lease_name, "alice", self.ttl)
        wait_until_expired(backend, lease_name)
        second, _ = backend.acquire(lease_name, "bob", self.ttl)
        assert second is not None and second.holder == "bob"
        assert second.token == first.token + 1
        assert second.transitions == first.transitions + 1
        events = self.history_of(backend, lease_name)
        if events is not None:
            assert events[-1] == ("taken_over", "bob", "alice", second.token, "")

    def test_renew_by_holder_extends_expiry(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", self.ttl)
        time.sleep(0.05)
        renewed = backend.renew(lease, 5.0)
        assert renewed is not None and renewed.token == lease.token
        assert renewed.expires_at > lease.expires_at
        assert renewed.expires_at - renewed.renewed_at == datetime.timedelta(seconds=5)
        # Still held after the original self.ttl: the renewal counts on the store's clock.
        time.sleep(self.ttl + 0.2)
        assert backend.read(lease_name).token == lease.token
        # Renewals update the lease, not the history.
        events = self.history_of(backend, lease_name)
        if events is not None:
            assert [event[0] for event in events] == ["acquired"]

    def test_renew_by_non_holder_refused(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", 30)
        impostor = type(lease)(**{**vars(lease), "holder": "mallory"})
        assert backend.renew(impostor, 30) is None
        stale_token = type(lease)(**{**vars(lease), "token": lease.token - 1})
        assert backend.renew(stale_token, 30) is None
        assert backend.read(lease_name).expires_at == lease.expires_at

    def test_renew_of_expired_lease_refused(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", self.ttl)
        wait_until_expired(backend, lease_name)
        assert backend.renew(lease, self.ttl) is None

    def test_renew_fails_after_takeover_and_late_release_is_noop(
        self, backend: Any, lease_name: str
    ) -> None:
        old, _ = backend.acquire(lease_name, "alice", self.ttl)
        wait_until_expired(backend, lease_name)
        new, _ = backend.acquire(lease_name, "bob", 30)
        assert backend.renew(old, 30) is None
        assert backend.release(old) is False
        current = backend.read(lease_name)
        assert (current.holder, current.token) == ("bob", new.token)

    def test_release_then_immediate_acquire_by_another(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", 30)
        assert backend.release(lease) is True
        assert backend.read(lease_name) is None
        taken, _ = backend.acquire(lease_name, "bob", 30)
        assert taken is not None and taken.token == lease.token + 1
        events = self.history_of(backend, lease_name)
        if events is not None:
            kinds = [event[:2] for event in events]
            assert kinds == [("acquired", "alice"), ("released", "alice"), ("acquired", "bob")]

    def test_release_by_non_holder_is_noop(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", 30)
        impostor = type(lease)(**{**vars(lease), "holder": "mallory"})
        assert backend.release(impostor) is False
        assert backend.read(lease_name).holder == "alice"
        assert backend.release(lease) is True
        assert backend.release(lease) is False  # twice is still a no-op

    def test_force_release(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", self.ttl)
        released = backend.force_release(lease_name, actor="operator", detail="maintenance")
        assert released is not None and (released.holder, released.token) == ("alice", lease.token)
        assert backend.read(lease_name) is None
        assert backend.renew(lease, self.ttl) is None  # the holder notices at its next renewal
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
        events = self.history_of(backend, lease_name)
        if events is not None:
            kinds = [(event[0], event[1], event[4]) for event in events]
            assert kinds == [
                ("acquired", "alice", ""),
                ("forced_release", "alice", "operator"),
                ("acquired", "bob", ""),
            ]

    @pytest.mark.parametrize("released", [True, False], ids=["released", "held"])
    def test_store_that_forgets_a_lease_waits_out_its_term_and_never_repeats_a_token(
        self, backend: Any, lease_name: str, released: bool, settings: Any
    ) -> None:
        """A store that loses a lease (its Redis keys or its database row deleted by hand)
        lets nobody take it while the holder could still believe it leads (the lock-delay
        of docs/safety.md), and the next holder's token is still greater."""
        settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "LOCK_DELAY": 0}  # delay = ttl
        first, _ = backend.acquire(lease_name, "alice", self.ttl)
        assert first is not None
        if released:
            backend.release(first)
        assert backend.flush_history(10)
        self.forget(backend, lease_name)
        # The holder's renewals are refused, alone or in a batch.
        assert backend.renew_many([first, first], self.ttl) == [None, None]
        assert backend.renew(first, self.ttl) is None
        give_up = time.monotonic() + 10 * self.ttl + 5
        while (second := backend.acquire(lease_name, "bob", self.ttl)[0]) is None:
            assert time.monotonic() < give_up, "the forgotten lease was never given again"
            time.sleep(0.05)
        assert second.token > first.token
        if not released:
            # By the store's own clock, not before alice's term could have ended.
            assert second.acquired_at >= first.expires_at
        third, _ = backend.acquire(lease_name, "carol", self.ttl)
        assert third is None  # and the new lease is honoured as usual
        assert backend.renew(first, self.ttl) is None

    @pytest.mark.parametrize("skew", [-3600, 3600], ids=["behind-1h", "ahead-1h"])
    def test_client_clock_skew_changes_nothing(
        self, backend: Any, lease_name: str, skew: int
    ) -> None:
        time_machine = pytest.importorskip("time_machine")
        with time_machine.travel(
            datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=skew),
            tick=True,
        ):
            lease, _ = backend.acquire(lease_name, "alice", self.ttl)
            assert lease is not None
            server_now = lease.acquired_at
            # The store's times are the store's: an hour of client skew does not show.
            assert (
                abs(
                    (server_now - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
                    + skew
                )
                < 60
            )
            assert backend.acquire(lease_name, "bob", self.ttl)[0] is None
            assert backend.renew(lease, self.ttl) is not None
            wait_until_expired(backend, lease_name)
            taken, _ = backend.acquire(lease_name, "bob", self.ttl)
            assert taken is not None and taken.token == lease.token + 1

    def test_threads_race_exactly_one_wins(self, backend: Any, lease_name: str) -> None:
        winners, errors = race(backend, lease_name, 20)
        # A contender may see a transient "busy" error (SQLite's lock), never a second win.
        assert len(winners) == 1, (winners, errors)
        assert backend.read(lease_name).holder == winners[0].holder

    def test_tokens_increase_by_one_whatever_ended_the_term(
        self, backend: Any, lease_name: str
    ) -> None:
        """Each grant of a name has the token after the previous grant's, whatever ended
        the previous term: a release, an expiry, a force release."""
        tokens = []
        lease, _ = backend.acquire(lease_name, "alice", 30)
        assert lease is not None
        tokens.append(lease.token)
        assert backend.release(lease) is True
        lease, _ = backend.acquire(lease_name, "bob", self.ttl)
        assert lease is not None
        tokens.append(lease.token)
        wait_until_expired(backend, lease_name)
        lease, _ = backend.acquire(lease_name, "carol", self.ttl)
        assert lease is not None
        tokens.append(lease.token)
        assert backend.force_release(lease_name) is not None
        assert backend.release(lease) is False
        give_up = time.monotonic() + 10 * self.ttl + 5
        while (taken := backend.acquire(lease_name, "dave", 30)[0]) is None:
            assert time.monotonic() < give_up, "never acquirable after the term ended"
            time.sleep(0.05)
        tokens.append(taken.token)
        assert tokens == list(range(tokens[0], tokens[0] + 4)), tokens

    def test_read_is_a_snapshot_of_the_holder(self, backend: Any, lease_name: str) -> None:
        assert backend.read(lease_name) is None
        lease, _ = backend.acquire(lease_name, "alice", 30)
        assert lease is not None
        seen = backend.read(lease_name)
        assert seen is not None
        assert (seen.name, seen.holder, seen.token) == (lease_name, "alice", lease.token)
        assert (seen.acquired_at, seen.expires_at, seen.transitions) == (
            lease.acquired_at,
            lease.expires_at,
            lease.transitions,
        )
        assert seen.read_at is not None  # the store's clock when read
        assert seen.deadline is None and not seen.lost.is_set()  # held by nobody here

    def test_read_many_answers_for_each_name_as_read_does(
        self, backend: Any, lease_name: str
    ) -> None:
        """Held, released, expired, never taken, listed twice and names a store might
        encode alike: ``read_many`` answers each as ``read`` does, in order."""
        held, released, expired, never = (f"{lease_name}-{x}" for x in "abcd")
        braced, upper = f"{lease_name}-{{e}}", f"{lease_name}-A"
        for name, holder in ((held, "alice"), (braced, "bob"), (upper, "carol")):
            assert backend.acquire(name, holder, 30)[0] is not None
        lease, _ = backend.acquire(released, "dave", 30)
        assert lease is not None and backend.release(lease)
        assert backend.acquire(expired, "erin", 0.2)[0] is not None
        time.sleep(0.5)
        names = [never, held, released, expired, braced, upper, held]
        seen = backend.read_many(names)
        assert [lease and (lease.name, lease.holder) for lease in seen] == [
            None,
            (held, "alice"),
            None,
            None,
            (braced, "bob"),
            (upper, "carol"),
            (held, "alice"),
        ]
        one = backend.read(held)
        assert one is not None and seen[1] is not None and seen[1].read_at is not None
        assert (seen[1].token, seen[1].expires_at) == (one.token, one.expires_at)
        assert backend.read_many([]) == []

    def test_threads_racing_for_a_released_lease_one_wins(
        self, backend: Any, lease_name: str
    ) -> None:
        """The race again, for a name the store already knows: released, so free at once."""
        first, _ = backend.acquire(lease_name, "alice", 30)
        assert first is not None and backend.release(first) is True
        won, errors = race(backend, lease_name, 10)
        assert len(won) == 1, (won, errors)
        assert won[0].token == first.token + 1

    def test_names_lists_held_and_released_names_sorted(
        self, backend: Any, lease_name: str
    ) -> None:
        held, released = f"{lease_name}-b", f"{lease_name}-a"
        assert backend.acquire(held, "alice", 30)[0] is not None
        lease, _ = backend.acquire(released, "bob", 30)
        assert lease is not None and backend.release(lease)
        mine = [name for name in backend.names() if name.startswith(lease_name)]
        assert mine == [released, held]
        again, _ = backend.acquire(released, "carol", 30)
        assert again is not None and again.transitions == lease.transitions + 1

    def test_names_are_exact(self, backend: Any, lease_name: str) -> None:
        """Case and accents make different leases on every store (MySQL included)."""
        names = [f"{lease_name}-Report", f"{lease_name}-report", f"{lease_name}-rèport"]
        tokens = [backend.acquire(name, f"holder-{i}", 30)[0] for i, name in enumerate(names)]
        assert all(token is not None for token in tokens)
        assert [backend.read(name).holder for name in names] == ["holder-0", "holder-1", "holder-2"]

    def test_names_a_store_might_encode_alike_are_different_leases(
        self, backend: Any, lease_name: str
    ) -> None:
        """Braces (a Redis hash tag), the digest a store might put in their place, slashes,
        dots and percent signs (a path): each name its own lease; releasing one frees no
        other."""
        braced = f"{lease_name}-{{customer}}"
        names = [
            braced,
            hashlib.sha256(braced.encode()).hexdigest(),
            f"{lease_name}-}}{{",
            f"{lease_name}/a.b",
            f"{lease_name}%2Fa%2Eb",
        ]
        granted = [backend.acquire(name, f"holder-{i}", 30)[0] for i, name in enumerate(names)]
        assert all(lease is not None for lease in granted), granted
        assert backend.force_release(names[1]) is not None
        holders = [getattr(backend.read(name), "holder", None) for name in names]
        assert holders == ["holder-0", None, "holder-2", "holder-3", "holder-4"], holders

    def test_an_acquisition_refused_reports_when_the_current_lease_was_read(
        self, backend: Any, lease_name: str
    ) -> None:
        """A waiting candidate learns from a refused acquisition when the holder's lease
        would run out: ``current.read_at`` (the store's clock) beside ``expires_at``."""
        backend.acquire(lease_name, "alice", 30)
        _, current = backend.acquire(lease_name, "bob", 30)
        assert current is not None and current.holder == "alice"
        if current.read_at is not None:
            assert 25 < current.expires_in <= 30


def race(backend: Any, name: str, contenders: int) -> tuple[list[Lease], list[BaseException]]:
    """``contenders`` threads released together by a barrier, each trying once to acquire
    ``name`` as ``thread-<i>``: the leases won, and the errors raised."""
    barrier = threading.Barrier(contenders)
    won: list[Lease] = []
    errors: list[BaseException] = []

    def contend(i: int) -> None:
        try:
            barrier.wait()
            lease, _ = backend.acquire(name, f"thread-{i}", 30)
            if lease is not None:
                won.append(lease)
        except BaseException as exc:
            errors.append(exc)
        finally:
            backend.close()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, errors
