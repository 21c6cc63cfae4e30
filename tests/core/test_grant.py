"""The grant of a term (``django_leader.term.attempting``), driven by hand against a model
store, with arbitrary interleavings of answers, timeouts, lost replies and clock readings.

The steps are the ones ``lock()``, ``alock()`` and the Elector run (through the thread or
the asyncio driver of ``django_leader.core``); here the test is their driver. Each
contender's store call is, in any order the machine picks: applied by the store (its
request sent at any reading of the clock between the step asking for it and the store
applying it), answered (at any later time), timed out before or after the store applied it
(a lost reply: the store acted, the answer never came), and, for a timed-out grant,
answered late to the worker (which hands it back). The clock moves on between any two of
them. No service, no database: one model store on one clock, in memory.

The SPEC rules asserted, at every step:

- at most one holder at any instant by the store's clock: the store never grants the
  lease while a contender still believes it leads;
- a holder considers itself leader only before the store could give the lease away: its
  local deadline is at most the store's expiry of its grant, because the deadline counts
  from when the request was SENT (the store counted its ttl from when it applied it,
  later);
- fencing tokens strictly increase from grant to grant;
- a released lease can be taken at once.

The seeded bug these tests catch (the demonstration in issue 25's closing note): count
the deadline from the answer's arrival instead of the sending — in ``attempting``,
``now = yield NOW`` moved before the grant is made held and ``_granted(backend, acquired,
now, timing)`` instead of ``sent``. ``test_the_grant_keeps_the_spec_rules`` then fails,
hypothesis shrinking it to one contender whose answer arrives more than the safety margin
after the store applied the call: its deadline lies past the store's expiry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_leader.caller import Caller
from django_leader.conf import Timing
from django_leader.core import NOW, Call, Steps, stamped
from django_leader.lease import Lease
from django_leader.term import attempting, hand_back

NAME = "core-model"
TIMING = Timing(ttl=10.0, renew_interval=3.0, retry_interval=1.0)
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
CONTENDERS = ("a", "b", "c")


class ModelStore:
    """A lease store as the SPEC describes it (``Backend.acquire`` / ``release``), on a
    clock the test moves: the same clock the contenders read (one host, one store)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.holder: str | None = None
        self.token = 0
        self.expires = -math.inf
        #: Every grant: (token, holder, applied at, expires at).
        self.grants: list[tuple[int, str, float, float]] = []
        #: Called with (holder, applied at) before the store grants: the test's check.
        self.before_grant: Any = None

    def _lease(self) -> Lease:
        assert self.holder is not None
        return Lease(
            name=NAME,
            holder=self.holder,
            token=self.token,
            acquired_at=EPOCH + timedelta(seconds=self.now),
            renewed_at=EPOCH + timedelta(seconds=self.now),
            expires_at=EPOCH + timedelta(seconds=self.expires),
            transitions=len(self.grants),
        )

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        if self.holder is not None and self.now < self.expires:
            return None, self._lease()
        self.before_grant(holder, self.now)
        self.holder, self.token, self.expires = holder, self.token + 1, self.now + ttl
        self.grants.append((self.token, holder, self.now, self.expires))
        lease = self._lease()
        return lease, lease

    def release(self, lease: Lease) -> bool:
        if self.holder != lease.holder or self.token != lease.token or self.now >= self.expires:
            return False
        self.holder, self.expires = None, -math.inf
        return True

    def fenced(self, lease: Lease, using: str | None = None) -> Any:
        raise AssertionError("not used here")


class _NoCaller:
    """The caller the steps name in their calls: the test performs the calls itself."""


@dataclass
class Contender:
    """One would-be holder and where its steps are."""

    name: str
    steps: Steps[tuple[Lease | None, Lease | None]] | None = None
    call: Call | None = None  # the store call the steps wait for
    asked_at: float = 0.0  # when the steps asked for it
    outcome: Any = None  # the store's result, once applied
    applied: bool = False
    #: Applied calls whose reply was lost: their late success goes to ``on_late``.
    lost_replies: list[tuple[Call, Any]] = field(default_factory=list)
    lease: Lease | None = None  # held, as far as the contender believes


class GrantMachine(RuleBasedStateMachine):
    """Contenders attempting one lease on a model store, in any interleaving."""

    def __init__(self) -> None:
        super().__init__()
        self.store = ModelStore()
        self.store.before_grant = self._no_other_holder
        self.contenders = {name: Contender(name) for name in CONTENDERS}

    # -- checks ---------------------------------------------------------------------------
    def _no_other_holder(self, holder: str, at: float) -> None:
        """At most one holder at any instant by the store's clock."""
        for other in self.contenders.values():
            lease = other.lease
            if other.name != holder and lease is not None and self._believes(other, at):
                raise AssertionError(
                    f"the store grants {NAME!r} to {holder} at {at:.3f} while {other.name} "
                    f"believes it leads until {lease.deadline:.3f} (token {lease.token})"
                )

    def _believes(self, contender: Contender, at: float) -> bool:
        lease = contender.lease
        return lease is not None and lease.deadline is not None and at < lease.deadline

    def _check_grant(self, contender: Contender, lease: Lease) -> None:
        """A holder stops before the store could give the lease away."""
        assert lease.deadline is not None
        assert self.store.now < lease.deadline, "a lease returned held after its deadline"
        expiry = {token: expires for token, _, _, expires in self.store.grants}[lease.token]
        assert lease.deadline <= expiry, (
            f"{contender.name} believes it leads until {lease.deadline:.3f}, "
            f"the store may give the lease away at {expiry:.3f}"
        )

    @invariant()
    def tokens_increase(self) -> None:
        tokens = [token for token, _, _, _ in self.store.grants]
        assert tokens == sorted(set(tokens)), f"tokens not strictly increasing: {tokens}"

    # -- driving the steps ----------------------------------------------------------------
    def _advance(self, contender: Contender, value: Any = None, error: Any = None) -> None:
        """Hand the steps an outcome; take their next store call, reading them the clock
        when they ask, or what they return."""
        steps = contender.steps
        assert steps is not None
        contender.call, contender.outcome, contender.applied = None, None, False
        try:
            effect = steps.throw(error) if error is not None else steps.send(value)
            while effect is NOW:
                effect = steps.send(self.store.now)
        except StopIteration as stop:
            contender.steps = None
            granted, _ = stop.value
            if granted is not None:
                self._check_grant(contender, granted)
                contender.lease = granted
            return
        except TimeoutError:
            contender.steps = None  # the attempt failed: the lock or Elector tries again
            return
        assert isinstance(effect, Call), effect
        contender.call, contender.asked_at = effect, self.store.now

    def _idle(self, name: str) -> bool:
        contender = self.contenders[name]
        return contender.steps is None and not self._believes(contender, self.store.now)

    def someone_leads(self) -> bool:
        return any(self._believes(c, self.store.now) for c in self.contenders.values())

    # -- rules ----------------------------------------------------------------------------
    @rule(name=st.sampled_from(CONTENDERS))
    def attempt(self, name: str) -> None:
        """An idle contender starts one acquisition."""
        contender = self.contenders[name]
        if not self._idle(name):
            return
        contender.lease = None
        contender.steps = attempting(
            cast(Any, self.store),
            cast(Caller, _NoCaller()),
            NAME,
            name,
            TIMING,
            3.0,
            f"contender {name}",
        )
        self._advance(contender)

    @rule(name=st.sampled_from(CONTENDERS), sent=st.floats(0.0, 1.0))
    def apply(self, name: str, sent: float) -> None:
        """The store applies a contender's call now; its request was sent at any time since
        the steps asked for it (``sent``: how far along)."""
        contender = self.contenders[name]
        call = contender.call
        if call is None or contender.applied:
            return
        if call.fn is stamped:
            fn, *args = call.args
            reading = contender.asked_at + sent * (self.store.now - contender.asked_at)
            contender.outcome = (reading, fn(*args))
        else:
            contender.outcome = call.fn(*call.args)
        contender.applied = True

    @rule(name=st.sampled_from(CONTENDERS))
    def answer(self, name: str) -> None:
        """The answer of an applied call arrives."""
        contender = self.contenders[name]
        if contender.call is not None and contender.applied:
            self._advance(contender, contender.outcome)

    @rule(name=st.sampled_from(CONTENDERS))
    def time_out(self, name: str) -> None:
        """The waiter gives the call up: before the store applied it, or after (a lost
        reply)."""
        contender = self.contenders[name]
        call = contender.call
        if call is None:
            return
        if contender.applied:
            contender.lost_replies.append((call, contender.outcome))
        self._advance(contender, error=TimeoutError("no answer within the bound"))

    @rule(name=st.sampled_from(CONTENDERS))
    def late_answer(self, name: str) -> None:
        """A lost reply reaches the worker after all: ``on_late`` takes it (a grant is
        handed back)."""
        contender = self.contenders[name]
        if contender.lost_replies:
            call, outcome = contender.lost_replies.pop(0)
            if call.on_late is not None:
                call.on_late(outcome)

    @rule(seconds=st.floats(0.0, 2 * TIMING.ttl))
    def tick(self, seconds: float) -> None:
        self.store.now += seconds

    @precondition(lambda self: self.someone_leads())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """The holder ends its term; at once, another contender takes the lease."""
        holders = [c for c in self.contenders.values() if self._believes(c, self.store.now)]
        holder = data.draw(st.sampled_from(holders))
        assert holder.lease is not None
        hand_back(cast(Any, self.store), holder.lease, f"contender {holder.name}", "done")
        holder.lease = None
        others = [name for name in CONTENDERS if name != holder.name and self._idle(name)]
        if not others or self.store.holder is not None:
            return  # a lost reply of the holder's own, granted since: it expires
        taker = self.contenders[data.draw(st.sampled_from(others))]
        self.attempt(taker.name)
        self.apply(taker.name, 1.0)
        self.answer(taker.name)
        assert taker.lease is not None, "a released lease was not taken at once"


GrantMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None, derandomize=True
)
test_the_grant_keeps_the_spec_rules = GrantMachine.TestCase
