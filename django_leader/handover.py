"""Hand-over on demand, as an operator asks for it (``manage.py leader handover``, the
admin's action), and the queue of candidates as an operator sees it.

The store does the work (:meth:`~django_leader.backends.base.Backend.request_handover`):
the holder learns of the request at its next renewal, steps down and releases, and until a
window ends only the chosen candidate may acquire the name — so the holder cannot win it
back and the other candidates do not race the chosen one for it. This module decides whom
the lease goes to (a live candidate named by the operator, or the next in line by
``ELECTION_MODE``) and for how long the gate stands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .backends.base import Backend
from .conf import Timing, get_settings
from .election import Candidate, Mode, next_in_line, queue, validate_mode
from .exceptions import LeaderError
from .lease import Lease
from .turns import handover_window


class HandoverRefused(LeaderError):
    """The hand-over cannot be asked for; the message says why (for an operator)."""


class NobodyHolds(HandoverRefused):
    """Nobody holds the lease: there is nothing to hand over."""


@dataclass(frozen=True)
class Waiting:
    """One candidate waiting for a lease, as ``leader status`` and the admin show it."""

    #: Its place in the queue: 1 is the next in line.
    place: int
    candidate: Candidate
    #: Seconds since its last heartbeat by the store's clock (None if the store gave no time).
    seen_ago: float | None

    def as_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "place": self.place,
            "identity": c.identity,
            "priority": c.priority,
            "host": c.host,
            "pid": c.pid,
            "version": c.version,
            "joined_at": c.joined_at.isoformat() if c.joined_at else None,
            "seen_at": c.seen_at.isoformat() if c.seen_at else None,
            "seen_ago": None if self.seen_ago is None else round(self.seen_ago, 3),
        }


def waiting(
    candidates: Iterable[Candidate], mode: Mode | str, *, holder: str | None, now: datetime | None
) -> list[Waiting]:
    """The candidates other than ``holder`` in the order they get their turn under
    ``mode``, with how long ago each was last seen at ``now`` (the store's clock)."""
    return [
        Waiting(
            place,
            candidate,
            None
            if now is None or candidate.seen_at is None
            else max(0.0, (now - candidate.seen_at).total_seconds()),
        )
        for place, candidate in enumerate(queue(candidates, mode, holder=holder), start=1)
    ]


def election_mode() -> Mode:
    """The mode the candidates take turns by (``ELECTION_MODE``), which decides who is next
    in line."""
    return validate_mode(get_settings().election_mode)


def window_for(lease: Lease, timing: Timing | None = None) -> float:
    """Seconds the store lets only the target acquire: :func:`handover_window` of the
    settings' timing, or the holder's own TTL if that is longer (an Elector may run with a
    longer ``ttl`` than ``LEASE_TTL``: it renews at least twice within its TTL, so it sees
    the request in time)."""
    window = handover_window(timing or get_settings().timing)
    if lease.expires_at is not None and lease.renewed_at is not None:
        window = max(window, (lease.expires_at - lease.renewed_at).total_seconds())
    return window


@dataclass(frozen=True)
class Handover:
    """A hand-over asked for."""

    name: str
    #: The lease as read just before asking.
    holder: Lease
    #: The identity of the candidate it goes to.
    to: str
    #: Seconds during which only ``to`` may acquire, from the request on (store clock).
    window: float
    actor: str
    #: Whether the store still had a holder when asked (if not, only the gate applies).
    held: bool
    #: The waiting candidates when asked, in queue order; None if the store keeps no registry.
    queue: list[Candidate] | None
    #: ``priority`` mode: a live candidate of higher priority than ``to`` (it takes the
    #: lease back at ``to``'s next renewal), else None.
    outranked_by: Candidate | None = None


def choose(
    lease: Lease, candidates: list[Candidate] | None, to: str | None, mode: Mode
) -> tuple[str, list[Candidate] | None]:
    """The identity the lease of ``lease.holder`` goes to: ``to`` if it is a live candidate
    (or if the store keeps no registry to check it against), else the next in line; and the
    waiting candidates in queue order. Raises :class:`HandoverRefused`."""
    if to is not None and to == lease.holder:
        raise HandoverRefused(f"{to} already holds {lease.name!r}")
    if candidates is None:
        if to is None:
            raise HandoverRefused(
                f"the store keeps no candidate registry for {lease.name!r}: name the candidate "
                "to hand over to"
            )
        return to, None
    order = queue(candidates, mode, holder=lease.holder)
    if to is None:
        first = next_in_line(order, mode, holder=lease.holder)
        if first is None:
            raise HandoverRefused(
                f"no candidate is waiting for {lease.name!r} (held by {lease.holder}): "
                "nobody to hand it over to"
            )
        return first.identity, order
    if to not in {c.identity for c in order}:
        live = ", ".join(c.identity for c in order) or "none"
        raise HandoverRefused(
            f"{to} is not a live candidate for {lease.name!r}; the candidates waiting, next "
            f"in line first: {live}"
        )
    return to, order


def ask_for_handover(
    backend: Backend,
    name: str,
    to: str | None = None,
    *,
    actor: str,
    reason: str = "",
    mode: Mode | None = None,
    timing: Timing | None = None,
) -> Handover:
    """Ask the holder of ``name`` to hand it over to candidate ``to`` (default: the next in
    line by ``mode``, default ``ELECTION_MODE``), recorded in the history with ``actor``.

    Raises :class:`NobodyHolds`, :class:`HandoverRefused` (no candidate waiting, ``to`` not
    a live candidate or the holder itself),
    :class:`~django_leader.exceptions.NotSupportedError` (the store cannot hand over) and
    :class:`~django_leader.exceptions.BackendUnavailable`."""
    mode = mode or election_mode()
    lease = backend.read(name)
    if lease is None:
        raise NobodyHolds(f"nobody holds {name!r}")
    target, order = choose(lease, backend.candidates(name), to, mode)
    window = window_for(lease, timing)
    detail = f"to {target}" + (f": {reason}" if reason else "")
    held = backend.request_handover(name, target, window, actor=actor, detail=detail)
    outranked = None
    if mode is Mode.PRIORITY and order:
        chosen = next(c for c in order if c.identity == target)
        first = order[0]
        outranked = first if first.priority > chosen.priority else None
    return Handover(
        name=name,
        holder=held or lease,
        to=target,
        window=window,
        actor=actor,
        held=held is not None,
        queue=order,
        outranked_by=outranked,
    )
