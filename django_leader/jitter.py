"""Jitter: the waits of many processes spread out, so that they do not act in lockstep.

Followers that poll every ``RETRY_INTERVAL``, locks that wait for a lease and renewals
retried after a failure would otherwise all act at the same instant, term after term (they
started together, or were woken by the same release), and every follower of a race would
try the lease at its holder's exact expiry: a herd at the store each time.

- :func:`shorter` draws a wait from ``[(1 - SPREAD) * seconds, seconds]``: never longer, so
  a wait that is part of a promised bound (rule 5: a crashed holder's lease is taken within
  TTL + RETRY_INTERVAL) stays within it.
- :func:`after_expiry` is the small random extra a follower waits past the expiry of the
  lease it saw, before it tries (at most :data:`EXPIRY_SPREAD` of its retry interval, and
  :data:`EXPIRY_CAP` seconds).

One random generator for the process, seeded from the system unless
``DJANGO_LEADER_JITTER_SEED`` is set (or :func:`seed` is called): tests and chaos runs that
set it get the same waits on each run.
"""

from __future__ import annotations

import os
import random

#: The largest part of a wait that :func:`shorter` takes off.
SPREAD = 0.2
#: The largest extra past an expiry, as a part of the retry interval, and in seconds.
EXPIRY_SPREAD = 0.1
EXPIRY_CAP = 0.25

_rng = random.Random(os.environ.get("DJANGO_LEADER_JITTER_SEED"))


def seed(value: int | str | None) -> None:
    """Seed the process's jitter (None: from the system again)."""
    _rng.seed(value)


def shorter(seconds: float) -> float:
    """``seconds`` less a random part of at most :data:`SPREAD` of it."""
    if seconds <= 0:
        return seconds
    return seconds * (1.0 - SPREAD * _rng.random())


def after_expiry(retry_interval: float) -> float:
    """A random extra, in seconds, to wait past a lease's expiry before trying it."""
    return min(EXPIRY_CAP, EXPIRY_SPREAD * retry_interval) * _rng.random()
