"""The lease contract as a test suite a backend runs: ``django_leader.testing.contract``.

Every store django-leader ships runs it (``tests/contract/test_conformance.py``), and so can a
backend of your own::

    # test_my_backend.py
    import pytest
    from django_leader.testing.contract import BackendContract

    # if your store, or its history, uses the database:
    pytestmark = pytest.mark.django_db(transaction=True)

    class TestMyBackend(BackendContract):
        def make_backend(self):
            return MyBackend()

Run it with pytest and pytest-django (``pip install "django-leader[dev]"`` has both) in a
project whose settings include ``django_leader``. Each test gets a fresh backend from
:meth:`BackendContract.make_backend` and a lease name of its own. Two hooks are optional:

* :meth:`BackendContract.forget` — make the store lose everything it knows of a name,
  as a restart without persistence or a row deleted by hand would. Without it the
  "store that forgets" test is not collected.
* :meth:`BackendContract.history_of` — the history events of a name; by default read
  from ``LeaseEvent`` in the backend's ``history_database``, and not checked when that
  is None.

The tests wait for real expiries of :attr:`BackendContract.ttl` (1 s): the whole suite
takes about half a minute per store. See docs/howto/write-a-backend.md.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..backends.base import Backend
from ..election import Candidate
from ..exceptions import NotSupportedError
from ..lease import Lease

__all__ = ["BackendContract", "wait_until_expired"]

#: ``(kind, holder, previous_holder, token, actor)`` of one history event.
Event = tuple[str, str, str, int, str]


def wait_until_expired(backend: Backend, name: str, timeout: float = 10.0) -> None:
    """Wait until the store itself says nobody holds ``name`` (its clock, not ours)."""
    give_up = time.monotonic() + timeout
    while backend.read(name) is not None:
        assert time.monotonic() < give_up, "lease never expired"
        time.sleep(0.05)


class BackendContract:
    """The tests every lease store must pass. Subclass it as ``Test…`` and implement
    :meth:`make_backend`; pytest collects the ``test_*`` methods of the subclass."""

    #: The short lease time (seconds) of the expiry tests.
    ttl = 1.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.forget is BackendContract.forget:
            # A store that cannot be made to forget has nothing for this test to check.
            cls.test_store_that_forgets_a_lease_waits_out_its_term_and_never_repeats_a_token = (  # type: ignore[method-assign]
                None
            )

    def make_backend(self) -> Backend:
        """A new instance of the backend under test."""
        raise NotImplementedError("implement make_backend() in your subclass")

    def forget(self, backend: Backend, name: str) -> None:
        """Make the store lose all it knows of ``name`` (optional, see the module)."""
        raise NotImplementedError

    def history_of(self, backend: Backend, name: str) -> list[Event] | None:
        """The history events of ``name``, oldest first; None if the store keeps none."""
        if backend.history_database is None:
            return None
        from ..models import LeaseEvent

        assert backend.flush_history(10), "history not written in time"
        return list(
            LeaseEvent.objects.using(backend.history_database)
            .filter(name=name)
            .order_by("at", "id")
            .values_list("kind", "holder", "previous_holder", "token", "actor")
        )

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

    def test_renew_many_answers_for_each_lease_as_renew_does(
        self, backend: Any, lease_name: str
    ) -> None:
        """``renew_many``: each lease renewed or refused on its own, exactly as ``renew``
        would (held, released, force-released, expired, taken over, another holder's,
        a duplicate), the results in order; an empty batch is answered at once."""
        assert backend.renew_many([], 30) == []
        names = {kind: f"{lease_name}-{kind}" for kind in ("held", "rel", "forced", "exp", "over")}
        held, _ = backend.acquire(names["held"], "alice", 30)
        released, _ = backend.acquire(names["rel"], "alice", 30)
        forced, _ = backend.acquire(names["forced"], "alice", 30)
        expired, _ = backend.acquire(names["exp"], "alice", self.ttl)
        old, _ = backend.acquire(names["over"], "alice", self.ttl)
        assert None not in (held, released, forced, expired, old)
        assert backend.release(released) and backend.force_release(names["forced"])
        wait_until_expired(backend, names["exp"])
        wait_until_expired(backend, names["over"])
        new, _ = backend.acquire(names["over"], "bob", 30)
        assert new is not None and new.token > old.token
        impostor = type(held)(**{**vars(held), "holder": "mallory"})
        batch = [held, released, forced, expired, old, new, impostor, held]
        time.sleep(0.05)
        renewed = backend.renew_many(batch, 20)
        assert [lease is not None for lease in renewed] == [
            True, False, False, False, False, True, False, True,
        ]  # fmt: skip
        for before, after in zip(batch, renewed, strict=True):
            if after is None:
                continue
            assert (after.name, after.holder, after.token) == (
                before.name,
                before.holder,
                before.token,
            )
            assert (after.acquired_at, after.transitions) == (
                before.acquired_at,
                before.transitions,
            )
            assert after.renewed_at > before.renewed_at
            assert after.expires_at - after.renewed_at == datetime.timedelta(seconds=20)
            assert after.handover_to == ""
            # (A duplicate renewed one after the other may have been renewed again since.)
            assert backend.read(after.name).expires_at >= after.expires_at
        # One by one, renew gives the same answers.
        one_by_one = [backend.renew(lease, 20) for lease in batch]
        assert [lease is None for lease in one_by_one] == [lease is None for lease in renewed]
        # Renewals update the leases, not the history.
        events = self.history_of(backend, names["held"])
        if events is not None:
            assert [event[0] for event in events] == ["acquired"]

    def test_renew_many_reports_a_handover_request(self, backend: Any, lease_name: str) -> None:
        lease, _ = backend.acquire(lease_name, "alice", 30)
        other, _ = backend.acquire(f"{lease_name}-2", "alice", 30)
        try:
            backend.request_handover(lease_name, "carol", 5.0)
        except NotSupportedError:
            return
        renewed = backend.renew_many([other, lease], 30)
        assert [lease.handover_to for lease in renewed] == ["", "carol"]
        assert renewed[1].handover_to == backend.renew(lease, 30).handover_to

    #: Leases of the large batch of :meth:`test_renew_many_of_a_large_batch`: more than one
    #: statement or script of the shipped stores takes. Lower it for a store whose
    #: acquisitions are slow (they must all be made within the batch's 30 s ttl).
    large_batch = 2500

    def test_renew_many_of_a_large_batch(self, backend: Any, lease_name: str) -> None:
        """Thousands of leases in one call (more than a statement or a script of most
        stores takes): every one renewed, its expiry extended."""
        leases: list[Any] = []
        kept = time.monotonic()
        for i in range(self.large_batch):
            leases.append(backend.acquire(f"{lease_name}-{i:05d}", f"holder-{i % 3}", 30)[0])
            assert leases[-1] is not None
            if time.monotonic() - kept > 10:
                # A slow store or a loaded machine: keep the first ones alive while the
                # batch grows (2,500 acquisitions took 33 s on ZooKeeper under load).
                leases = backend.renew_many(leases, 30)
                assert None not in leases
                kept = time.monotonic()
        time.sleep(0.05)  # so that every renewal ends later than its acquisition
        stale = type(leases[7])(**{**vars(leases[7]), "token": leases[7].token + 1})
        renewed = backend.renew_many([*leases, stale], 30)
        assert renewed[-1] is None
        assert len(renewed) == len(leases) + 1
        for before, after in zip(leases, renewed, strict=False):
            assert after is not None, before
            assert (after.name, after.holder, after.token) == (
                before.name,
                before.holder,
                before.token,
            )
            assert after.expires_at > before.expires_at
            assert after.expires_at - after.renewed_at == datetime.timedelta(seconds=30)
        for i in (0, self.large_batch // 2, self.large_batch - 1):
            assert backend.read(leases[i].name).expires_at == renewed[i].expires_at

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

    def test_candidates_announce_expire_and_withdraw(self, backend: Any, lease_name: str) -> None:
        """The candidate registry: announced (in join order, with what the candidate said of
        itself and the store's times), heart-beating without losing its place, expired by
        the store's clock, withdrawn. A store that keeps no registry (``candidates()`` is
        None) must take announce() and withdraw() as no-ops."""
        if backend.candidates(lease_name) is None:
            backend.announce(lease_name, Candidate("bob"), 30)
            backend.withdraw(lease_name, "bob")
            assert backend.candidates(lease_name) is None
            return
        assert backend.candidates(lease_name) == []
        backend.announce(lease_name, Candidate("bob", priority=5, host="h1", pid=11), 30)
        backend.announce(lease_name, Candidate("alice", version="9.9"), 30)
        backend.announce(lease_name, Candidate("carol"), 3.0)
        first = backend.candidates(lease_name)
        # A heartbeat keeps the place in the queue and updates the priority.
        backend.announce(lease_name, Candidate("bob", priority=7, host="h1", pid=11), 30)
        found = backend.candidates(lease_name)
        assert [c.identity for c in found] == ["bob", "alice", "carol"]
        assert [c.seq for c in found] == sorted(c.seq for c in found)
        assert len({c.seq for c in found}) == 3
        bob = found[0]
        assert (bob.priority, bob.host, bob.pid) == (7, "h1", 11)
        assert found[1].version == "9.9"
        assert bob.joined_at == first[0].joined_at and bob.joined_at is not None
        assert bob.seen_at is not None and bob.seen_at >= first[0].seen_at
        assert bob.expires_at is not None and bob.expires_at > bob.seen_at
        assert backend.candidates(f"{lease_name}-other") == []

        backend.withdraw(lease_name, "alice")
        backend.withdraw(lease_name, "nobody")  # a no-op
        give_up = time.monotonic() + 15
        while [c.identity for c in backend.candidates(lease_name)] != ["bob"]:
            # carol's candidacy expires
            assert time.monotonic() < give_up, backend.candidates(lease_name)
            time.sleep(0.05)
        # Back after withdrawing: at the tail.
        backend.announce(lease_name, Candidate("alice"), 30)
        assert [c.identity for c in backend.candidates(lease_name)] == ["bob", "alice"]
        # Candidacy is no lease: bob announced, yet anyone may take the lease.
        lease, _ = backend.acquire(lease_name, "dave", 30)
        assert lease is not None and lease.holder == "dave"

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

    def test_handover_lets_only_its_target_acquire_and_the_holder_learns_of_it(
        self, backend: Any, lease_name: str
    ) -> None:
        """``request_handover``: the holder's next renewal reports the target; once it
        releases, nobody but the target may acquire until the window ends; the target's
        acquisition ends the request. A store that cannot raises NotSupportedError."""
        lease, _ = backend.acquire(lease_name, "alice", 30)
        try:
            held = backend.request_handover(lease_name, "carol", 2.0, actor="ops")
        except NotSupportedError:
            return
        assert held is not None and held.holder == "alice" and held.token == lease.token
        renewed = backend.renew(lease, 30)
        assert renewed is not None and renewed.handover_to == "carol"
        assert backend.release(lease)
        assert backend.acquire(lease_name, "bob", 30) == (None, None)
        taken, _ = backend.acquire(lease_name, "carol", 30)
        assert taken is not None and taken.token > lease.token
        again = backend.renew(taken, 30)
        assert again is not None and again.handover_to == ""
        assert backend.release(taken)
        # The request ended with carol's acquisition: anyone may acquire again.
        other, _ = backend.acquire(lease_name, "bob", 30)
        assert other is not None
        backend.release(other)
        # A request whose target never comes: the gate opens when its window ends.
        backend.request_handover(lease_name, "nobody", 1.0)
        assert backend.acquire(lease_name, "bob", 30) == (None, None)
        give_up = time.monotonic() + 10
        while backend.acquire(lease_name, "bob", 30)[0] is None:
            assert time.monotonic() < give_up, "the hand-over gate never opened"
            time.sleep(0.05)
        events = self.history_of(backend, lease_name)
        if events is not None:
            assert [event[0] for event in events].count("handover") == 2
            assert ("handover", "alice", "", lease.token, "ops") in events

    def test_wake_reaches_the_watchers_it_names(self, backend: Any, lease_name: str) -> None:
        """``watch``/``wake``: a release and ``wake(name)`` reach the watchers of the name,
        ``wake(name, identity)`` only the one watching for that identity. A store that
        cannot push returns None from watch()."""
        woken = {who: threading.Event() for who in ("all", "a", "b")}
        watches = []
        for who, event in woken.items():
            watch = backend.watch(lease_name, event.set, identity=None if who == "all" else who)
            if watch is None:
                return
            watches.append(watch)

        def only(*expected: str) -> None:
            for who in expected:
                assert woken[who].wait(5), f"{who} was not woken"
            time.sleep(0.3)  # a wake-up for the others would have arrived by now
            assert sorted(who for who, event in woken.items() if event.is_set()) == sorted(expected)
            for event in woken.values():
                event.clear()

        try:
            give_up = time.monotonic() + 10
            while not all(watch.live for watch in watches):
                assert time.monotonic() < give_up, "the watches never came live"
                time.sleep(0.02)
            # A watch may be woken once as it comes live (it may have missed a wake-up).
            time.sleep(0.3)
            for event in woken.values():
                event.clear()
            backend.wake(lease_name, "b")
            only("b")
            backend.wake(lease_name)
            only("all")
            lease, _ = backend.acquire(lease_name, "alice", 30)
            assert backend.release(lease)
            only("all")
        finally:
            for watch in watches:
                watch.close()
        assert not any(watch.live for watch in watches)


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
