"""Exceptions raised by django-leader. All subclass :class:`LeaderError`."""

from __future__ import annotations


class LeaderError(Exception):
    """Base class of every django-leader error."""


class LeaseHeld(LeaderError):
    """The lease is held by someone else and could not be acquired (non-blocking or timed out)."""


class LeadershipLost(LeaderError):
    """This holder no longer holds the lease (expired, taken over, released or force-released)."""


class BackendUnavailable(LeaderError):
    """The lease store could not be reached or answered with an error (safe to retry)."""


class StoreBusy(BackendUnavailable):
    """The store answered, but another client's write kept what the call needed for longer
    than the call's bound (SQLite's one write lock; on MySQL/MariaDB a lease row locked by
    its holder's ``fenced()``): contention, not an outage. A blocking
    :func:`~django_leader.lock` waits and tries again, as for a held lease, until its
    ``timeout`` runs out; then, and when not blocking, it raises this error."""


class NotSupportedError(LeaderError, NotImplementedError):
    """The configured backend cannot do this soundly (e.g. ``request_handover()`` on a store
    that cannot hand a lease over)."""
