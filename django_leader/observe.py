"""``observe(name)``: follow who leads a name without campaigning (etcd's ``Observe``).

Following is written once, as steps (:mod:`django_leader.core`) that ``for`` drives in
its thread and ``async for`` in its task."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Generator
from types import TracebackType

from .backends.base import Backend
from .conf import resolve_timing, validate_name
from .core import REARM, Call, Emit, Listen, Pause, Steps, aiterate, iterate
from .exceptions import BackendUnavailable
from .lease import Lease
from .term import StoreCaller, call_bound, resolve_backend

logger = logging.getLogger("django_leader")


class Observation:
    """What :func:`~django_leader.observe` returns: an iterator (``for``, ``next()``) and
    an asynchronous iterator (``async for``, ``anext()``) of the holders of one lease name.

    It is one or the other: the first use decides. Its store connection and watch open on
    the first step and close with :meth:`close` / :meth:`aclose`, ``break``-ing out of the
    loop, or the end of a ``with`` / ``async with`` block.
    """

    def __init__(self, name: str, backend: Backend | str | None, interval: float | None) -> None:
        self.name = validate_name(name)
        self.timing = resolve_timing()
        self.interval = self.timing.retry_interval if interval is None else float(interval)
        if not self.interval > 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self.backend = resolve_backend(backend, self.timing)
        self._sync: Generator[Lease | None, None, None] | None = None
        self._async: AsyncGenerator[Lease | None, None] | None = None
        self._last: tuple[str, int] | bool | None = False  # False: nothing yielded yet
        self._failing = False

    def __repr__(self) -> str:
        return f"<Observation of {self.name!r}>"

    # -- synchronous ----------------------------------------------------------------------
    def __iter__(self) -> Generator[Lease | None, None, None]:
        if self._async is not None:
            raise RuntimeError(f"{self!r} is iterated with async for already")
        if self._sync is None:
            self._sync = iterate(self._following())
        return self._sync

    def __next__(self) -> Lease | None:
        return next(iter(self))

    def close(self) -> None:
        """Stop observing: the watch and the store connection close."""
        if self._sync is not None:
            self._sync.close()

    def __enter__(self) -> Observation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- asynchronous ---------------------------------------------------------------------
    def __aiter__(self) -> AsyncGenerator[Lease | None, None]:
        if self._sync is not None:
            raise RuntimeError(f"{self!r} is iterated with for already")
        if self._async is None:
            self._async = aiterate(self._following())
        return self._async

    async def __anext__(self) -> Lease | None:
        return await self.__aiter__().__anext__()

    async def aclose(self) -> None:
        """:meth:`close` for ``async for``."""
        if self._async is not None:
            await self._async.aclose()

    async def __aenter__(self) -> Observation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- both -----------------------------------------------------------------------------
    def _following(self) -> Steps[None]:
        """The steps of following the name: read it when woken by the store or every
        ``interval``, emitting each change (see :func:`observe`)."""
        caller = StoreCaller(self.backend, f"{self.name}:observe")
        watch = None
        try:
            watch = yield Listen(lambda wake: self.backend.watch(self.name, wake))
            bound = call_bound(self.timing)
            while True:
                yield REARM
                try:
                    lease = yield Call(caller, bound, self.backend.read, (self.name,))
                except (BackendUnavailable, TimeoutError) as exc:
                    self._unreadable(exc)
                else:
                    if self._changed(lease):
                        yield Emit(lease)
                yield Pause(self.interval)
        finally:
            if watch is not None:
                watch.close()
            caller.close()

    def _unreadable(self, exc: Exception) -> None:
        if not self._failing:
            logger.warning("observing %r: cannot read the store: %s", self.name, exc)
        self._failing = True

    def _changed(self, lease: Lease | None) -> bool:
        """Whether ``lease`` (just read) is news: a new holder or token, or free now."""
        self._failing = False
        key = None if lease is None else (lease.holder, lease.token)
        if key == self._last:
            return False
        self._last = key
        return True


def observe(
    name: str,
    *,
    backend: Backend | str | None = None,
    interval: float | None = None,
) -> Observation:
    """Yield who holds ``name`` now (a snapshot :class:`~django_leader.Lease`, or None if
    nobody does), then each change: a new holder or token, or the lease becoming free.

    ``for lease in observe(name):`` in a thread, ``async for lease in observe(name):`` in a
    coroutine (the loop runs on while it waits for a change).

    Read-only: it never campaigns nor writes. It reads the store when the store wakes it
    (a release, on PostgreSQL and Redis) and otherwise every ``interval`` seconds (default
    ``RETRY_INTERVAL``), so a change is seen within ``interval`` at the latest. A store
    that cannot be reached is retried quietly (a warning once per outage); it runs until
    the caller stops iterating (``close()`` / ``await aclose()``, ``break``).
    """
    return Observation(name, backend, interval)
