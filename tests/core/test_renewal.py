"""A held lease's renewals (``django_leader.term.Renewer.renewed``, the decision the
session takes for each answer of a batch), driven by hand against the model store of
``test_grant``, with arbitrary interleavings of sends, answers, refusals, lost and late
replies and clock readings, while other contenders try to take the lease.

A holder renews: the request is sent at a reading of the clock, the store applies it at
any later time (extending the lease by the ttl from then, if the holder still holds it
unexpired), and the answer reaches the holder at any later time still, or never (a lost
reply: the renewal is retried, or the deadline passes). The session's loop marks the
lease lost once its local deadline passes (``Session._scan``); here a contender stops
believing it leads at its deadline. No service, no thread: one model store on one clock,
which the lease's own clock (``django_leader.lease.clock``) reads too.

The SPEC rules asserted, at every step:

- at most one holder at any instant by the store's clock (checked by the store before
  every grant, as in ``test_grant``);
- a holder considers itself leader only before the store could give the lease away: after
  every renewal it takes, its local deadline is at most the store's expiry of its term;
- a lease once lost (refused, or its deadline seen to pass) is never held again by a
  renewal's late answer.

The seeded bugs these tests catch (each shrunk by hypothesis to an election and one
``renewal_round``):

- count a renewal's deadline from the answer's arrival instead of the sending — in
  ``Renewer.renewed``, ``sent + took + timing.ttl - …`` for ``sent + timing.ttl - …``:
  "a believes it leads until 11.000, the store may give the lease away at 10.000"
  (applied at once, answered 2 s later);
- let a late answer revive a lost lease — in ``Lease._update``, drop the
  ``clock() >= self.deadline`` test: "a's renewal answered at 9.000, after its deadline,
  made the lost lease held again".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from django_leader import lease as lease_module
from django_leader.caller import Caller
from django_leader.lease import Lease
from django_leader.term import Renewer
from tests.core.test_grant import CONTENDERS, TIMING, GrantMachine, ModelStore


class RenewingStore(ModelStore):
    """The model store with ``renew``: the holder's unexpired lease extended by the ttl
    from when the store applies it."""

    def __init__(self) -> None:
        super().__init__()
        #: The store's latest expiry of each term (token), renewals included.
        self.expiry: dict[int, float] = {}

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        granted, current = super().acquire(name, holder, ttl)
        if granted is not None:
            self.expiry[granted.token] = self.expires
        return granted, current

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        if self.holder != lease.holder or self.token != lease.token or self.now >= self.expires:
            return None
        self.expires = self.now + ttl
        self.expiry[self.token] = self.expires
        return self._lease()


@dataclass
class Renewal:
    """One renewal of a holder's: sent at ``sent``; once applied, the store's answer."""

    sent: float
    applied: bool = False
    answer: Lease | None = None


class RenewalMachine(GrantMachine):
    """The contenders of ``GrantMachine``; a holder's lease renewed, in any interleaving."""

    def __init__(self) -> None:
        super().__init__()
        self.store: RenewingStore = RenewingStore()
        self.store.before_grant = self._no_other_holder
        self.renewers: dict[str, Renewer] = {}
        self.renewals: dict[str, list[Renewal]] = {name: [] for name in CONTENDERS}
        # The lease's own clock reads the model's (its deadline checks).
        self._real_clock = lease_module.clock
        lease_module.clock = lambda: self.store.now

    def teardown(self) -> None:
        lease_module.clock = self._real_clock

    def _renewer(self, name: str) -> Renewer | None:
        """The renewer of the lease ``name`` believes it holds (made on first use)."""
        contender = self.contenders[name]
        lease = contender.lease
        if lease is None or not self._believes(contender, self.store.now):
            return None
        renewer = self.renewers.get(name)
        if renewer is None or renewer.lease is not lease:
            renewer = Renewer(cast(Any, self.store), lease, TIMING, cast(Caller, None))
            self.renewers[name] = renewer
            self.renewals[name] = []
        return renewer

    # -- checks ---------------------------------------------------------------------------
    @invariant()
    def no_holder_past_the_stores_expiry(self) -> None:
        for contender in self.contenders.values():
            lease = contender.lease
            if lease is None or not self._believes(contender, self.store.now):
                continue
            assert lease.deadline is not None
            expiry = self.store.expiry[lease.token]
            assert lease.deadline <= expiry, (
                f"{contender.name} believes it leads until {lease.deadline:.3f}, "
                f"the store may give the lease away at {expiry:.3f}"
            )

    # -- rules ----------------------------------------------------------------------------
    @rule(name=st.sampled_from(CONTENDERS))
    def elect(self, name: str) -> None:
        """An idle contender acquires in one go: sent, applied and answered at once (the
        grant's own interleavings are ``GrantMachine``'s)."""
        if self._idle(name):
            self.attempt(name)
            self.apply(name, 1.0)
            self.answer(name)

    @rule(seconds=st.floats(0.0, TIMING.renew_interval))
    def short_tick(self, seconds: float) -> None:
        """Time passes within a renew interval (``tick`` may pass a whole term)."""
        self.store.now += seconds

    @precondition(lambda self: self.someone_leads())
    @rule()
    def send_renewal(self) -> None:
        """The session sends a renewal of the holder's lease (the clock read as it sends),
        unless one is in flight (``Session._scan``: one at a time per lease)."""
        for name in CONTENDERS:
            if self._renewer(name) is not None and not self.renewals[name]:
                self.renewals[name].append(Renewal(sent=self.store.now))

    @precondition(lambda self: self.someone_leads())
    @rule(
        before=st.floats(0.0, TIMING.renew_interval),
        after=st.floats(0.0, TIMING.renew_interval),
        lost=st.booleans(),
    )
    def renewal_round(self, before: float, after: float, lost: bool) -> None:
        """One whole renewal of the holder's: sent now, applied ``before`` seconds later,
        its answer ``after`` seconds after that (the steps one at a time are the rules
        above and below; this one makes the common path likely)."""
        self.send_renewal()
        self.short_tick(before)
        pending = self._renewals(applied=False)
        for name, renewal in pending:
            self._apply(name, renewal)
        self.short_tick(after)
        for name, renewal in pending:
            self._take_answer(name, renewal, lost)

    @precondition(lambda self: bool(self._renewals(applied=False)))
    @rule(data=st.data())
    def apply_renewal(self, data: st.DataObject) -> None:
        """The store applies a renewal sent."""
        self._apply(*data.draw(st.sampled_from(self._renewals(applied=False))))

    @precondition(lambda self: bool(self._renewals(applied=True)))
    @rule(data=st.data(), lost=st.booleans())
    def answer_renewal(self, data: st.DataObject, lost: bool) -> None:
        """An applied renewal's answer reaches the holder (``Renewer.renewed`` decides), or
        is lost (the session retries, or the deadline passes)."""
        name, renewal = data.draw(st.sampled_from(self._renewals(applied=True)))
        self._take_answer(name, renewal, lost)

    def _renewals(self, applied: bool) -> list[tuple[str, Renewal]]:
        """The renewals in flight, by holder: those the store applied, or not yet."""
        return [(n, r) for n, rs in self.renewals.items() for r in rs if r.applied == applied]

    def _apply(self, name: str, renewal: Renewal) -> None:
        renewal.applied = True
        renewal.answer = self.store.renew(self.renewers[name].lease, TIMING.ttl)

    def _take_answer(self, name: str, renewal: Renewal, lost: bool) -> None:
        self.renewals[name].remove(renewal)
        renewer, contender = self.renewers[name], self.contenders[name]
        if lost or contender.lease is not renewer.lease:
            return  # lost, or the term ended (released): the session renews it no more
        if renewal.answer is None:  # refused: the session drops the lease as lost
            contender.lease = None
            return
        already_lost = not self._believes(contender, self.store.now)
        took = self.store.now - renewal.sent
        if renewer.renewed(renewal.answer, renewal.sent, took):
            assert not already_lost, (
                f"{name}'s renewal answered at {self.store.now:.3f}, after its deadline, "
                "made the lost lease held again"
            )
            assert lease_module.clock() < cast(float, renewer.lease.deadline)
        else:  # too late: the deadline had passed; the lease stays lost
            assert already_lost, f"{name}'s renewal refused before its deadline"
            contender.lease = None


RenewalMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, derandomize=True
)
test_renewals_keep_the_spec_rules = RenewalMachine.TestCase
