"""``singleton_task`` for Django's tasks framework: at most one execution per lock key at a
time, across every worker.

The task's function is wrapped before the framework's ``task`` decorator sees it. The
wrapper keeps the function's module and name, so the task is found by its path as before
(the database backend's worker imports it), and every ``task`` option works as before
(``priority``, ``queue_name``, ``backend``, ``takes_context``). The wrapper holds a
:func:`~django_leader.lock` (an :func:`~django_leader.alock` for a coroutine function)
without waiting, renewed by the process's session while the function runs, and released
when it returns or raises; inside, :func:`~django_leader.current_lease` is its lease.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

from django.utils import timezone

from ..exceptions import LeaseHeld
from ..lease import _use_lease
from ..locks import Lock
from ..singleton import Key, SingletonSpec, retry_countdown
from .compat import framework


def worker_log() -> logging.Logger:
    """Where a singleton task's execution says it skipped, was refused or was enqueued
    again: beside the worker's own lines about the task, under the tasks framework's logger
    (``django.tasks.django_leader``, or ``django_tasks.django_leader`` with the backport),
    which ``db_worker`` shows at its default verbosity."""
    return logging.getLogger(f"{framework().__name__}.django_leader")


F = TypeVar("F", bound=Callable[..., Any])


class TaskSingleton(SingletonSpec):
    """A django.tasks task's :class:`~django_leader.singleton.SingletonSpec`, and how it
    runs."""

    def __init__(
        self,
        fun: Callable[..., Any],
        *,
        key: Key,
        ttl: float | None,
        on_locked: str,
        takes_context: bool,
        retry_delay: float | None,
    ) -> None:
        super().__init__(fun, key=key, ttl=ttl, on_locked=on_locked, skip_first=takes_context)
        if retry_delay is not None and (
            isinstance(retry_delay, bool)
            or not isinstance(retry_delay, (int, float))
            or not retry_delay >= 0
        ):
            raise ValueError(f"retry_delay must be a number of seconds >= 0, got {retry_delay!r}")
        self.takes_context = takes_context
        self.retry_delay = None if retry_delay is None else float(retry_delay)
        #: The framework's Task made of the wrapper (for a retry to enqueue again).
        self.task: Any = None

    def wrap(self) -> Callable[..., Any]:
        fun = self.fun
        if inspect.iscoroutinefunction(fun):

            @functools.wraps(fun)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                lock = self._lock(args, kwargs)
                try:
                    lease = await lock.__aenter__()
                except LeaseHeld as exc:
                    return self.locked(args, kwargs, exc)
                try:
                    with _use_lease(lease):
                        return await fun(*args, **kwargs)
                finally:
                    await lock.__aexit__(None, None, None)

            return run_async

        @functools.wraps(fun)
        def run(*args: Any, **kwargs: Any) -> Any:
            lock = self._lock(args, kwargs)
            try:
                lease = lock.__enter__()
            except LeaseHeld as exc:
                return self.locked(args, kwargs, exc)
            try:
                with _use_lease(lease):
                    return fun(*args, **kwargs)
            finally:
                lock.__exit__(None, None, None)

        return run

    def _lock(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
        task_args = args[1:] if self.takes_context else args
        name = self.lock_name(None, task_args, kwargs)
        return Lock(name, ttl=self.ttl, blocking=False)

    def locked(self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: LeaseHeld) -> None:
        """What an execution that finds the lock held does (``on_locked``)."""
        label = self.fun.__qualname__
        logger = worker_log()
        if self.on_locked == "skip":
            logger.info("%s skipped: %s", label, exc)
            return None
        task = self.task
        backend = task.get_backend() if task is not None else None
        if self.on_locked == "raise" or backend is None:
            logger.info("%s not run: %s", label, exc)
            raise exc
        if not getattr(backend, "supports_defer", False):
            logger.warning(
                "%s not run, and not retried: the task backend %r cannot defer a task "
                "(on_locked='retry' needs run_after): %s",
                label,
                task.backend,
                exc,
            )
            raise exc
        countdown = retry_countdown(self.retry_delay)
        task_args = args[1:] if self.takes_context else args
        # Django's now: aware, or naive local time with USE_TZ = False (where the ORM of
        # a database task backend refuses an aware one).
        later = timezone.now() + timedelta(seconds=countdown)
        result = task.using(run_after=later).enqueue(*task_args, **kwargs)
        logger.info("%s enqueued again to run in %.2fs (%s): %s", label, countdown, result.id, exc)
        return None


@overload
def singleton_task(function: F, /) -> Any: ...


@overload
def singleton_task(
    *,
    key: Key = None,
    ttl: float | None = None,
    on_locked: str = "skip",
    retry_delay: float | None = None,
    **task_kwargs: Any,
) -> Callable[[F], Any]: ...


def singleton_task(
    *task_args: Any,
    key: Key = None,
    ttl: float | None = None,
    on_locked: str = "skip",
    retry_delay: float | None = None,
    **task_kwargs: Any,
) -> Any:
    """A drop-in for Django's ``task`` decorator (``django.tasks.task``, or the backport's
    ``django_tasks.task``) that runs at most one execution per lock key at a time, across
    every worker; bare (``@singleton_task``) or with arguments.

    ``key``: the lock name — a format string over the task's arguments
    (``"report-{customer_id}"``, ``"sync-{0}"``), a callable taking the task's arguments,
    or None (default: the task's module path, one execution of the task at a time). With
    ``takes_context=True`` the context is not an argument a key can name. ``ttl``: the
    lock's lease time (default ``LEASE_TTL``); the lock is renewed while the task runs,
    and a crashed worker's lock expires after ``ttl``. ``on_locked`` — what an execution
    that finds the lock held does: ``"skip"`` (log, return None), ``"retry"`` (enqueue the
    task again with ``run_after`` ``retry_delay`` seconds from now, default
    ``RETRY_INTERVAL``, plus jitter, and return None; the backend must support deferred
    tasks, else it raises), or ``"raise"`` (raise :class:`~django_leader.LeaseHeld`: the
    result is FAILED). Inside the task, :func:`~django_leader.current_lease` is the lock's
    lease (``token``, ``lost``, ``check()``, ``fenced()``). Every other keyword goes to
    ``task``. A coroutine function is locked with :func:`~django_leader.alock`.
    """

    def create(fun: F) -> Any:
        spec = TaskSingleton(
            fun,
            key=key,
            ttl=ttl,
            on_locked=on_locked,
            takes_context=bool(task_kwargs.get("takes_context", False)),
            retry_delay=retry_delay,
        )
        made = framework().task(spec.wrap(), **task_kwargs)
        spec.task = made
        return made

    if len(task_args) == 1 and callable(task_args[0]) and not task_kwargs:
        return create(task_args[0])
    if task_args:
        raise TypeError("singleton_task takes the task function or keyword arguments only")
    return create
