"""Django signals sent on leadership changes and candidate membership.

The leadership signals are sent with ``sender`` = the :class:`~django_leader.Elector` or the
lock, and the keyword argument ``lease`` (a :class:`~django_leader.Lease`). The membership
signals are sent by an Elector that reads the candidate registry — a leader every
``renew_interval``, a waiting ``fifo``/``priority`` candidate at each attempt — with the
keyword arguments ``name`` (the lease name) and ``candidate`` (a
:class:`~django_leader.election.Candidate`), for what changed since its last read.
Receivers run in the thread that noticed the change; an exception in a receiver is logged,
never propagated.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_leader")

#: This process became the holder of ``lease``.
leader_elected = Signal()
#: This process stopped holding ``lease`` without releasing it (expired, taken, refused).
leader_lost = Signal()
#: This process released ``lease`` on purpose (``stop()``, end of a ``lock()`` block).
lease_released = Signal()

#: A candidate joined the registry of ``name`` (a new heartbeat).
candidate_joined = Signal()
#: A candidate left the registry before its heartbeat ran out (it withdrew: stopped, or
#: elected).
candidate_left = Signal()
#: A candidate's heartbeat ran out (crashed, frozen, cut off) and the store dropped it.
candidate_expired = Signal()


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error("signal receiver %r raised", receiver, exc_info=result)
