"""Django signals sent on leadership changes.

Each is sent with ``sender`` = the :class:`~django_leader.Elector` or the lock, and the
keyword argument ``lease`` (a :class:`~django_leader.Lease`). Receivers run in the thread
that noticed the change; an exception in a receiver is logged, never propagated.
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


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error("signal receiver %r raised", receiver, exc_info=result)
