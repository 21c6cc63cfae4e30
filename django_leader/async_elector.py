"""``AsyncElector``: the :class:`~django_leader.Elector`'s campaign for asyncio code.

The campaign itself is the Elector's, unchanged: it runs in the Elector's thread, and the
lease is renewed, and its local deadline kept, by the process's session thread
(:mod:`django_leader.session`). Neither depends on the event loop, so leadership is kept —
and given up at the deadline — exactly as in synchronous code, also while the loop is
blocked. What this class adds is the bridge to the loop: coroutine work run as a task and
cancelled when leadership ends, callbacks run on the loop, and awaitable waits and reads.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from . import aio
from .backends.base import Backend
from .conf import Timing
from .election import Candidate, Mode
from .elector import Elector
from .exceptions import BackendUnavailable
from .lease import Lease
from .session import session as session_of
from .term import call_bound

logger = logging.getLogger("django_leader")

#: ``work(lease)`` of an AsyncElector: a coroutine function (a task on the loop), or a
#: plain function (a thread, as with :class:`~django_leader.Elector`).
AsyncWork = Callable[[Lease], Any]
#: A callback: a coroutine function (awaited on the loop) or a plain function (run in the
#: campaign thread).
AsyncCallback = Callable[[Lease], Any]

_CALLBACKS = ("on_elected", "on_lost", "on_new_leader")


class AsyncElector:
    """Campaigns for lease ``name`` from asyncio code; the arguments are
    :class:`~django_leader.Elector`'s.

    ``await start(work)`` / ``await stop()`` (or ``async with AsyncElector(...)``),
    ``await run(work)``, ``await wait_for_leadership()``, ``await leader()``,
    ``await candidates()``; ``is_leader`` and ``lease`` as the Elector's.

    ``work(lease)`` may be a coroutine function: each time this elector is elected it runs
    as a task on the loop that started it, with ``current_lease()`` set; when leadership
    ends the task is cancelled, and the elector waits for it to finish before it releases
    the lease and campaigns again (a plain function runs in a thread, as with the Elector).
    Callbacks ``on_elected``, ``on_lost``, ``on_new_leader`` — keyword arguments, or
    methods of a subclass — may be coroutine functions, awaited on the loop one after the
    other in the order the campaign reported them, or plain functions, which run at once in
    the campaign thread as the Elector's do (so a plain ``on_lost`` runs on time even while
    the loop is blocked). The work starts once this term's ``on_elected`` has finished.

    A coroutine callback is bounded by the lease TTL (:meth:`callback_timeout`): it waits
    at most that long for the callbacks reported before it, then starts anyway, and once
    it has run that long it is cancelled (a warning is logged) and nothing waits for it any
    more — one that ignores the cancellation runs on, on its own. So a callback that hangs
    holds up neither the work (which starts at most two TTLs after the election) nor later
    callbacks and terms, and hung callbacks do not pile up.

    The lease is renewed, and given up at its local deadline, by the session thread
    whatever the loop does: while the loop is blocked, ``is_leader`` turns false and
    ``lease.lost`` is set on time; the work is cancelled and the callbacks run when the
    loop next runs.
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        renew_interval: float | None = None,
        retry_interval: float | None = None,
        identity: str | None = None,
        backend: Backend | str | None = None,
        mode: Mode | str | None = None,
        priority: int = 0,
        watchdog: float | None = None,
        on_elected: AsyncCallback | None = None,
        on_lost: AsyncCallback | None = None,
        on_new_leader: AsyncCallback | None = None,
    ) -> None:
        for attr, callback in zip(_CALLBACKS, (on_elected, on_lost, on_new_leader), strict=True):
            if callback is not None:
                if not callable(callback):
                    raise TypeError(f"{attr} must be callable")
                setattr(self, attr, callback)
        self._elector = Elector(
            name,
            ttl=ttl,
            renew_interval=renew_interval,
            retry_interval=retry_interval,
            identity=identity,
            backend=backend,
            mode=mode,
            priority=priority,
            watchdog=watchdog,
            on_elected=functools.partial(self._relay, "on_elected"),
            on_lost=functools.partial(self._relay, "on_lost"),
            on_new_leader=functools.partial(self._relay, "on_new_leader"),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Event | None = None  # set once the campaign thread is over
        self._thread: threading.Thread | None = None
        self._callbacks: asyncio.Future[None] | None = None  # the last callback reported
        # The coroutine on_elected of the latest term, and its lease: what the work awaits.
        self._elected: tuple[Lease, asyncio.Future[None]] | None = None
        self._failed: BaseException | None = None  # what ended the campaign thread

    def __repr__(self) -> str:
        return f"<AsyncElector {self.name!r} as {self.identity!r} ({self.mode})>"

    # -- callbacks (override, as plain or coroutine functions, or pass as arguments) ------
    def on_elected(self, lease: Lease) -> Any:
        """Called when this elector becomes leader (a coroutine function: on the loop)."""

    def on_lost(self, lease: Lease) -> Any:
        """Called when this elector's leadership ends, lost or stopped (a plain function
        at once, in the campaign thread: on time even while the loop is blocked)."""

    def on_new_leader(self, lease: Lease) -> Any:
        """Called when a new holder of the lease is observed, this one included."""

    # -- state ----------------------------------------------------------------------------
    @property
    def elector(self) -> Elector:
        """The synchronous :class:`~django_leader.Elector` that campaigns."""
        return self._elector

    @property
    def name(self) -> str:
        return self._elector.name

    @property
    def identity(self) -> str:
        return self._elector.identity

    @property
    def mode(self) -> Mode:
        return self._elector.mode

    @property
    def priority(self) -> int:
        return self._elector.priority

    @property
    def timing(self) -> Timing:
        return self._elector.timing

    @property
    def callback_timeout(self) -> float:
        """How long a coroutine callback may run, and wait for those before it: the lease
        TTL. One still running then is cancelled and no longer waited for."""
        return self.timing.ttl

    @property
    def backend(self) -> Backend:
        return self._elector.backend

    @property
    def is_leader(self) -> bool:
        """True while this elector holds the lease and its local deadline has not passed."""
        return self._elector.is_leader

    @property
    def lease(self) -> Lease | None:
        """The lease this elector holds now, or None."""
        return self._elector.lease

    async def leader(self) -> Lease | None:
        """Who holds the lease now, read from the store (a snapshot), or None; bounded
        like :meth:`Elector.leader() <django_leader.Elector.leader>`."""
        return await self._read(self.backend.read, self.name)

    async def candidates(self) -> list[Candidate] | None:
        """The live candidates, as :meth:`Elector.candidates()
        <django_leader.Elector.candidates>`."""
        return await self._read(self.backend.candidates, self.name)

    async def _read(self, call: Callable[..., Any], *args: Any) -> Any:
        bound = call_bound(self.timing)
        try:
            return await session_of(self.backend).acall(bound, call, *args)
        except TimeoutError:
            raise BackendUnavailable(
                f"reading {self.name!r}: the store did not answer within {bound:.2f}s"
            ) from None

    async def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Wait, without blocking the loop, until this elector leads (True) or ``timeout``
        seconds pass (False)."""
        return await self._elector._await_leadership(timeout)

    # -- running --------------------------------------------------------------------------
    async def start(self, work: AsyncWork | None = None) -> None:
        """Campaign in the background (the Elector's thread), from now until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{self!r} is already running")
        loop = self._bind()
        ended, end = aio.wakeable()
        self._ended = ended
        self._failed = None
        self._elector._stop.clear()
        run_work: AsyncWork | None = work
        if work is not None and inspect.iscoroutinefunction(work):
            coroutine_work = work

            async def after_on_elected(lease: Lease) -> Any:
                # As with the Elector: the work starts once this term's on_elected has
                # returned (or been given up: see _in_turn). Its _in_turn ran before: the
                # campaign relayed on_elected before it started the work.
                elected = self._elected
                if elected is not None and elected[0] is lease:
                    await asyncio.wait({elected[1]})
                return await coroutine_work(lease)

            run_work = after_on_elected

        def campaign() -> None:
            try:
                # A coroutine work runs on ``loop`` as a task (django_leader.aio.lead).
                self._elector._run(run_work, loop)
            except BaseException as exc:  # for run() to raise
                logger.exception("the campaign for %r failed", self.name)
                self._failed = exc
            finally:
                end()

        self._thread = threading.Thread(
            target=campaign, name=f"leader-elector:{self.name}", daemon=True
        )
        self._thread.start()

    async def run(self, work: AsyncWork | None = None) -> None:
        """Campaign until :meth:`stop` (or until the awaiting task is cancelled: then the
        elector stops, releasing the lease)."""
        await self.start(work)
        assert self._ended is not None
        try:
            await self._ended.wait()
        except asyncio.CancelledError:
            await asyncio.shield(self.stop())
            raise
        if self._failed is not None:
            raise self._failed

    async def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning: as :meth:`Elector.stop() <django_leader.Elector.stop>`
        (``lease.lost`` set, the work cancelled and awaited, then the lease released),
        awaited without blocking the loop. Called from the work or a callback, it only asks
        and returns: the campaign ends once that returns."""
        self._elector._ask_stop(release)
        if asyncio.current_task() in aio.terms_of(self._elector):
            return  # the work itself: the campaign ends once it returns
        await self._elector._await_stop(release, timeout)
        if self._ended is not None and timeout is None:
            await self._ended.wait()

    def resign(self, backoff: float | None = None) -> None:
        """Step down now and campaign again after ``backoff`` (as the Elector's)."""
        self._elector.resign(backoff)

    async def hand_over(self, to: str | None = None) -> None:
        """Step down in favour of candidate ``to`` (as the Elector's), awaited."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._elector.hand_over, to)

    async def __aenter__(self) -> AsyncElector:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.stop())

    # -- the bridge to the loop -----------------------------------------------------------
    def _bind(self) -> asyncio.AbstractEventLoop:
        """The loop this elector reports to: the running one."""
        loop = asyncio.get_running_loop()
        running = self._thread is not None and self._thread.is_alive()
        if running and self._loop is not None and self._loop is not loop:
            raise RuntimeError(f"{self!r} runs on another event loop")
        self._loop = loop
        return loop

    def _relay(self, attr: str, lease: Lease) -> None:
        """A callback of the campaign, on its thread. A plain function runs here and now,
        as the Elector's do: on time even while the loop is blocked. A coroutine function's
        coroutine goes to the loop (the Elector logs what raises here)."""
        outcome = getattr(self, attr)(lease)
        if not inspect.isawaitable(outcome):
            return
        loop = self._loop
        try:
            if loop is None:
                raise RuntimeError("no event loop")
            loop.call_soon_threadsafe(self._in_turn, outcome, attr, lease)
        except RuntimeError:  # the loop is closed: nobody listens any more
            logger.warning("%s of %r not run: its event loop is closed", attr, self.name)
            if asyncio.iscoroutine(outcome):
                outcome.close()

    def _in_turn(self, outcome: Awaitable[Any], attr: str, lease: Lease) -> None:
        """Await a coroutine callback on the loop once those reported before it have
        finished (they do not overtake one another), but bounded: it waits for them up to
        ``callback_timeout`` from now, then runs for up to as long (:func:`aio.bounded`).
        So each is over within two bounds of its report, whatever the others do, and only
        those reported in the last two bounds are pending."""
        loop = asyncio.get_running_loop()
        timeout = self.callback_timeout
        start_by = loop.time() + timeout
        label = f"{attr} of {self!r}"
        previous = self._callbacks

        async def in_turn() -> None:
            nonlocal previous
            if previous is not None and not previous.done():
                await asyncio.wait({previous}, timeout=max(0.0, start_by - loop.time()))
                if not previous.done():
                    logger.warning(
                        "%s waited %gs for the callbacks before it: it runs now", label, timeout
                    )
            previous = None  # no chain of finished callbacks is kept alive
            await aio.bounded(outcome, timeout, label)

        self._callbacks = current = asyncio.ensure_future(in_turn())
        if attr == "on_elected":
            self._elected = (lease, current)
