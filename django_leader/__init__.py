"""django-leader: leader election and distributed locks for Django, with leases in your
database or Redis.

Public names: :class:`Elector`, :func:`lock`, :func:`observe`, :class:`Lease`, and for
asyncio :func:`alock` and :class:`AsyncElector`,
:func:`current_lease`, the election's :class:`Mode` and :class:`Candidate`, and the
exceptions :class:`LeaderError`, :class:`LeaseHeld`, :class:`LeadershipLost`,
:class:`BackendUnavailable`.
"""

from __future__ import annotations

from .async_elector import AsyncElector
from .election import Candidate, Mode
from .elector import Elector
from .exceptions import (
    BackendUnavailable,
    LeaderError,
    LeadershipLost,
    LeaseHeld,
    NotSupportedError,
)
from .lease import Lease, current_lease
from .locks import alock, lock
from .observe import observe
from .version import __version__ as __version__

__all__ = [
    "AsyncElector",
    "BackendUnavailable",
    "Candidate",
    "Elector",
    "LeaderError",
    "LeadershipLost",
    "Lease",
    "LeaseHeld",
    "Mode",
    "NotSupportedError",
    "alock",
    "current_lease",
    "lock",
    "observe",
]
