"""django-leader: leader election and distributed locks for Django, with leases in your
database or Redis.

Public names: :class:`Elector`, :func:`lock`, :class:`Lease`, :func:`current_lease`, and the
exceptions :class:`LeaderError`, :class:`LeaseHeld`, :class:`LeadershipLost`,
:class:`BackendUnavailable`.
"""

from __future__ import annotations

from .elector import Elector
from .exceptions import (
    BackendUnavailable,
    LeaderError,
    LeadershipLost,
    LeaseHeld,
    NotSupportedError,
)
from .lease import Lease, current_lease
from .locks import lock

__version__ = "0.1.0.dev0"

__all__ = [
    "BackendUnavailable",
    "Elector",
    "LeaderError",
    "LeadershipLost",
    "Lease",
    "LeaseHeld",
    "NotSupportedError",
    "current_lease",
    "lock",
]
