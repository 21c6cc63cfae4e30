"""Helpers for testing your leader-only code: no cluster, no store, no waiting for a TTL.

::

    from django_leader.testing import override_leader

    @override_leader("nightly-report")            # this process leads it
    def test_report_runs_on_the_leader(): ...

    @override_leader("nightly-report", leader=False)   # another instance leads it
    def test_report_skipped_elsewhere(): ...

While an override is active every :class:`~django_leader.Elector` and :func:`~django_leader.lock`
of the process uses an in-memory :class:`MemoryBackend` (unless given a backend explicitly;
it lives in ``django_leader.backends.memory`` and is importable from here):
a name this process should lead is free and taken at the first campaign; a name it should
not lead is held by ``"another-instance"`` and never expires. With pytest, the
:func:`leader_backend` fixture installs a fresh :class:`MemoryBackend` for one test
(import it into your ``conftest.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import backends
from ..backends.base import Backend
from ..backends.memory import OTHER_HOLDER, MemoryBackend

__all__ = ["OTHER_HOLDER", "MemoryBackend", "override_leader"]  # and leader_backend, below

F = TypeVar("F", bound=Callable[..., Any])

#: The stores of the override_leader blocks open now, innermost last.
_memory_stores: list[MemoryBackend] = []


class override_leader:  # lower case: used like a function, as override_settings
    """Make this process the leader of ``name`` (``leader=True``) or not (``leader=False``).

    A context manager and a decorator (also of async functions' sync wrappers and of
    ``unittest.TestCase`` methods). Nested overrides share one :class:`MemoryBackend`;
    ``backend`` gives the one to use.
    """

    def __init__(
        self, name: str, *, leader: bool = True, backend: MemoryBackend | None = None
    ) -> None:
        self.name = name
        self.leader = leader
        self.backend = backend
        self._previous: Backend | None = None

    def __enter__(self) -> MemoryBackend:
        self._previous = backends._override
        # Nested overrides share the outer one's store, so both names live in one place.
        outer = _memory_stores[-1] if _memory_stores else None
        store = self.backend or (outer if self._previous is outer else None) or MemoryBackend()
        _memory_stores.append(store)
        if self.leader:
            store.unpin(self.name)
        else:
            store.pin(self.name)
        backends._override = store
        self.backend = store
        return store

    def __exit__(self, *exc: object) -> None:
        assert self.backend is not None
        self.backend.unpin(self.name)
        _memory_stores.pop()
        backends._override = self._previous

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with override_leader(self.name, leader=self.leader, backend=self.backend):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pass
else:
    __all__ += ["leader_backend"]

    @pytest.fixture
    def leader_backend() -> Iterator[MemoryBackend]:
        """A fresh :class:`MemoryBackend` used by every Elector and lock() in the test."""
        previous = backends._override
        store = MemoryBackend()
        backends._override = store
        try:
            yield store
        finally:
            backends._override = previous
