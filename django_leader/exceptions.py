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


class NotSupportedError(LeaderError, NotImplementedError):
    """The configured backend cannot do this soundly (e.g. ``request_handover()`` on a store
    that cannot hand a lease over)."""
