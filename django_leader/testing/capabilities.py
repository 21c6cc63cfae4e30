"""The optional capabilities of a lease store, as tests: one class each.

A store may or may not keep a candidate registry, take hand-over requests, push wake-ups or
renew a batch in one round trip better than one by one. Each test finds out from the store
itself whether it can, through the contract (``candidates()`` is None, ``request_handover``
raises :class:`~django_leader.exceptions.NotSupportedError`, ``watch()`` returns None), and
then checks only that it declines correctly: no store is named. Fencing and the beat's slot
records are checked by the repository's own suites (``tests/contract``), which need a
database.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

from ..election import Candidate, next_in_line
from ..exceptions import NotSupportedError
from .lease_contract import ContractBase, LeaseContract, wait_until_expired


class BatchRenewalContract(LeaseContract):
    """``renew_many``: a batch renewed as each lease would be by ``renew``."""

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

    def test_renew_many_gives_each_lease_its_own_handover_request(
        self, backend: Any, lease_name: str
    ) -> None:
        """Requests for some leases of a batch, a refused lease among them: each renewed
        lease is answered with its own request, in order (a store that answers a batch in
        one reply must not shift them)."""
        leases = [backend.acquire(f"{lease_name}-{i}", "alice", 30)[0] for i in range(5)]
        try:
            backend.request_handover(leases[1].name, "carol", 5.0)
            backend.request_handover(leases[4].name, "dave", 5.0)
        except NotSupportedError:
            return
        assert backend.release(leases[2])
        renewed = backend.renew_many(leases, 30)
        assert [None if lease is None else lease.handover_to for lease in renewed] == [
            "",
            "carol",
            None,
            "",
            "dave",
        ]
        assert [lease.token for lease in renewed if lease is not None] == [
            leases[i].token for i in (0, 1, 3, 4)
        ]

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


class RegistryContract(LeaseContract):
    """The candidate registry (``announce``, ``withdraw``, ``candidates``)."""

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

    def test_candidates_many_answers_for_each_name_as_candidates_does(
        self, backend: Any, lease_name: str
    ) -> None:
        first, second, nobody = (f"{lease_name}-{x}" for x in "abc")
        backend.announce(first, Candidate("bob", priority=2), 30)
        backend.announce(first, Candidate("alice"), 30)
        backend.announce(second, Candidate("carol"), 30)
        found = backend.candidates_many([first, nobody, second, first])
        if backend.candidates(first) is None:  # a store that keeps no registry
            assert found == [None] * 4
            return
        expected = [backend.candidates(name) for name in (first, nobody, second, first)]
        assert [[c.identity for c in each] for each in found] == [
            ["bob", "alice"],
            [],
            ["carol"],
            ["bob", "alice"],
        ]
        assert [[(c.seq, c.priority) for c in each] for each in found] == [
            [(c.seq, c.priority) for c in each] for each in expected
        ]
        assert backend.candidates_many([]) == []

    def test_next_in_line_is_the_head_of_the_registry(self, backend: Any, lease_name: str) -> None:
        """``next_in_line()`` answers what the whole registry says (``election.next_in_line``
        of ``candidates()``) in each mode, the holder left out, a withdrawn or expired head
        skipped; None with nobody waiting, or without a registry."""
        if backend.candidates(lease_name) is None:
            assert backend.next_in_line(lease_name, "fifo") is None
            return
        assert backend.next_in_line(lease_name, "fifo") is None
        backend.announce(lease_name, Candidate("carol", priority=1), 2.0)
        backend.announce(lease_name, Candidate("bob", priority=5), 30)
        backend.announce(lease_name, Candidate("alice", priority=5), 30)
        backend.announce(lease_name, Candidate("dave", priority=9), 30)

        def head(mode: str, holder: str | None = None) -> str | None:
            found = backend.next_in_line(lease_name, mode, holder=holder)
            members = backend.candidates(lease_name)
            expected = next_in_line(members, mode, holder=holder)
            assert (found and found.identity) == (expected and expected.identity), members
            if found is not None:  # the whole record, as candidates() has it
                assert expected is not None and found.seq == expected.seq
                assert (found.priority, found.joined_at) == (expected.priority, expected.joined_at)
            return found.identity if found is not None else None

        assert head("fifo") == head("race") == "carol"
        assert head("fifo", holder="carol") == "bob"
        assert head("priority") == "dave"
        assert head("priority", holder="dave") == "bob"
        backend.withdraw(lease_name, "bob")
        assert head("fifo", holder="carol") == "alice"
        give_up = time.monotonic() + 15
        # carol's candidacy expires (not compared meanwhile: it may expire between reads)
        while getattr(backend.next_in_line(lease_name, "fifo"), "identity", None) == "carol":
            assert time.monotonic() < give_up
            time.sleep(0.05)
        assert head("fifo") == "alice"
        for identity in ("alice", "dave"):
            backend.withdraw(lease_name, identity)
        assert head("fifo") is None and head("priority") is None


class HandoverContract(LeaseContract):
    """Hand-over requests (``request_handover``)."""

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


class WakeUpContract(LeaseContract):
    """Wake-ups pushed by the store (``watch``, ``wake``)."""

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


class RetentionContract(ContractBase):
    """``prune``: the names nobody has used for a while forgotten, their tokens never going
    backwards. Not part of :class:`~django_leader.testing.contract.BackendContract`: it
    forgets every unused name of the store, so give it a store (or a key prefix, a root)
    of its own."""

    def test_prune_forgets_unused_names_and_their_tokens_go_on(
        self, backend: Any, lease_name: str
    ) -> None:
        """A released name and an expired one are forgotten once unused for longer than
        asked; a held one is kept and still renews. Taken again, each forgotten name gets a
        token greater than any it had. A store without retention forgets nothing (0)."""
        released, expired, held = (f"{lease_name}-{kind}" for kind in ("rel", "exp", "held"))
        first, _ = backend.acquire(released, "alice", 30)
        assert first is not None and backend.release(first)
        old, _ = backend.acquire(expired, "alice", self.ttl)
        assert old is not None
        wait_until_expired(backend, expired)
        kept, _ = backend.acquire(held, "alice", 30)
        assert kept is not None
        time.sleep(1.0)  # both ended more than half a second ago, by any clock
        forgotten = backend.prune(datetime.timedelta(seconds=0.5))
        names = backend.names()
        if forgotten == 0:  # a store that keeps everything
            assert {released, expired, held} <= set(names)
            return
        assert forgotten >= 2
        assert held in names and released not in names and expired not in names
        assert backend.renew(kept, 30) is not None
        for name, before in ((released, first), (expired, old)):
            again, _ = backend.acquire(name, "bob", 30)
            assert again is not None and again.token > before.token, (before, again)

    def test_prune_keeps_what_was_used_recently(self, backend: Any, lease_name: str) -> None:
        """A name released just now is not forgotten by a prune asking for an hour."""
        lease, _ = backend.acquire(lease_name, "alice", 30)
        assert lease is not None and backend.release(lease)
        backend.prune(datetime.timedelta(hours=1))
        assert lease_name in backend.names()
        again, _ = backend.acquire(lease_name, "bob", 30)
        assert again is not None and again.token > lease.token
