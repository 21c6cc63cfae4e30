"""Election modes and the candidate registry's records: pure logic, no store.

An :class:`~django_leader.Elector` in ``race`` mode tries to acquire whenever it may
(ZooKeeper's unfair election: everyone races for one node). In ``fifo`` and ``priority``
mode it first reads the queue — the live candidates the store's registry keeps, in the
order they joined — and only the one whose turn it is tries (ZooKeeper's fair election with
sequence nodes; Azure's preferred leader). The lease's compare-and-set still decides who
holds the lease: the mode only decides who *tries*, so safety never depends on it, and a
registry that cannot be read makes every candidate fall back to racing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from .version import __version__


class Mode(str, Enum):
    """How the waiting candidates of a name take turns (``mode=``, ``ELECTION_MODE``)."""

    #: Every waiting candidate tries; the fastest wins (ZooKeeper's unfair election).
    RACE = "race"
    #: Candidates lead in the order they joined; only the head of the queue tries.
    FIFO = "fifo"
    #: The live candidate with the highest priority leads (ties: the earliest to join); a
    #: leader hands over to a higher-priority newcomer at its next renewal.
    PRIORITY = "priority"

    def __str__(self) -> str:
        return self.value


def validate_mode(mode: Any) -> Mode:
    """``mode`` as a :class:`Mode`; ValueError naming the choices otherwise."""
    try:
        return Mode(mode)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in Mode)
        raise ValueError(f"mode must be one of {choices}, got {mode!r}") from None


def validate_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {priority!r}")
    if not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must fit in 32 bits, got {priority!r}")
    return priority


@dataclass(frozen=True)
class Candidate:
    """One campaigning Elector as the store's registry knows it.

    The campaigner fills ``identity``, ``priority``, ``host``, ``pid`` and ``version``;
    the store adds ``seq`` (join order: greater = joined later), ``joined_at``, ``seen_at``
    (its last heartbeat) and ``expires_at`` — all on the store's clock. A candidate whose
    heartbeat stops is dropped once ``expires_at`` passes.
    """

    identity: str
    priority: int = 0
    host: str = ""
    pid: int = 0
    version: str = ""
    seq: int = 0
    joined_at: datetime | None = None
    seen_at: datetime | None = None
    expires_at: datetime | None = None

    @classmethod
    def here(cls, identity: str, priority: int = 0) -> Candidate:
        """This process as a candidate: its host name, pid and django-leader version."""
        return cls(
            identity=identity,
            priority=priority,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
        )


def queue(
    candidates: Iterable[Candidate], mode: Mode | str, *, holder: str | None = None
) -> list[Candidate]:
    """The candidates in the order they get their turn, the current ``holder`` left out.

    ``race`` and ``fifo``: join order. ``priority``: highest priority first, ties in join
    order.
    """
    waiting = [c for c in candidates if c.identity != holder]
    if Mode(mode) is Mode.PRIORITY:
        return sorted(waiting, key=lambda c: (-c.priority, c.seq))
    return sorted(waiting, key=lambda c: c.seq)


def may_try(
    identity: str,
    candidates: Sequence[Candidate] | None,
    mode: Mode | str,
    *,
    holder: str | None = None,
) -> bool:
    """Whether ``identity`` may try to acquire now.

    Always in ``race`` mode, and whenever the registry is unknown (``None``: the store
    does not keep one, or it could not be read) or empty. Otherwise only the first in
    :func:`queue` may; a candidate that has not joined yet may not (it joins at the tail).
    """
    if Mode(mode) is Mode.RACE or not candidates:
        return True
    order = queue(candidates, mode, holder=holder)
    if not order:
        return True
    return order[0].identity == identity


def next_in_line(
    candidates: Iterable[Candidate], mode: Mode | str, *, holder: str | None = None
) -> Candidate | None:
    """Whose turn comes after ``holder``'s: the first of :func:`queue`, or None."""
    order = queue(candidates, mode, holder=holder)
    return order[0] if order else None


def place(identity: str, candidates: Iterable[Candidate], mode: Mode | str) -> int | None:
    """``identity``'s place in the queue (0 = next), or None if it is not queued."""
    for index, candidate in enumerate(queue(candidates, mode)):
        if candidate.identity == identity:
            return index
    return None


def preempted_by(
    priority: int, candidates: Iterable[Candidate], *, holder: str
) -> Candidate | None:
    """In ``priority`` mode, the live candidate a leader of ``priority`` must hand over to:
    the first of the queue if its priority is higher, else None."""
    first = next_in_line(candidates, Mode.PRIORITY, holder=holder)
    return first if first is not None and first.priority > priority else None
