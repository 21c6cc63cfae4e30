"""The ZooKeeper store's shared vocabulary: znode names, the ensemble's times, what the
backend knows of a lease znode it wrote, and how a ``multi`` tells what made it fail. The
znode layout itself is described in the package's docstring (``__init__.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any
from urllib.parse import quote

EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)


@dataclass
class Held:
    """What this backend knows of a lease znode it wrote (see ``_held``)."""

    #: The lease znode's version after our last write.
    version: int
    #: Its ``mtime`` then (the ensemble's milliseconds), and the ttl written.
    mtime: int
    ttl: int
    #: The timeout granted to the session that owns it, in ms: 0 for a persistent znode
    #: (or not known), -1 for another session's.
    granted: int
    #: The version of the name's record when we last read or wrote it. Every grant changes
    #: the record, so a write conditional on this version cannot land on a lease znode made
    #: by a later grant (whose version restarts at 0 and may equal ours).
    record_version: int
    #: The record's content at that version (its hand-over request, its transitions): a
    #: renewal conditional on the version needs not read it again.
    record: dict[str, Any] = field(default_factory=dict)


def to_time(ms: int | float) -> datetime:
    return EPOCH + timedelta(milliseconds=int(ms))


def to_ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def candidate_prefix(identity: str) -> str:
    """The start of the name of ``identity``'s candidate znode (ZooKeeper appends the
    sequence number)."""
    return f"c{digest(identity)}-"


def place_in(queue: list[str], identity: str) -> int | None:
    """The index of ``identity``'s candidate znode in ``queue`` (a queue's children in
    join order), None if it has none there."""
    prefix = candidate_prefix(identity)
    return next((i for i, node in enumerate(queue) if node.startswith(prefix)), None)


def encode_name(name: str) -> str:
    """A lease name as one znode name (percent-encoded; '.' too, since '.' and '..' are
    not znode names)."""
    return quote(name, safe="").replace(".", "%2E")


def standing_handover(record: dict[str, Any], at_ms: int) -> str:
    """The candidate a hand-over request in the name's ``record`` names, if it still stands
    at ``at_ms`` (the ensemble's clock); "" otherwise."""
    to, until = record.get("handover_to"), int(record.get("handover_until") or 0)
    return str(to) if to and until > at_ms else ""


def failed_operation(results: list[Any]) -> tuple[int, Exception] | None:
    """The operation of a failed ``multi`` that made it fail, and why (the others report
    ``RolledBackError``); None if it succeeded."""
    from kazoo.exceptions import RolledBackError

    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return index, result
    return None
