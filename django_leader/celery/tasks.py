"""``singleton_task``: a ``shared_task`` of which at most one execution per lock key runs at
a time, across every worker.

The task's function is wrapped, not its class, so every ``shared_task`` option works as
before (``bind``, ``base``, the app's own ``Task`` class such as Django's
``delay_on_commit``…). The wrapper holds a :func:`~django_leader.lock` — acquired without
waiting, renewed in the background, released (owner-checked) when the function returns or
raises, ``self.retry()`` included — and makes its lease the :func:`~django_leader.current_lease`.

A pool process killed by ``revoke(terminate=True)``, lost (``WorkerLostError``) or killed
past its hard time limit (``TimeLimitExceeded``) cannot release its lock: the worker's main
process does it for it once the process is gone (the lock's holder, ``<task id>@<host>:<pid>``,
names the execution and its process; only a process of this host is looked for). A whole
worker killed at once leaves the lock to expire after ``ttl``.

An execution that finds the lock held by **its own task id** is the same task come back: a
message redelivered after its worker died (``acks_late``), or a retry published while the
attempt that published it still held the lock. It is not skipped nor retried: if the holder
was a process of this host that is gone, it frees that lock at once; otherwise it waits for
the lock, at most until that lease would expire by the store's clock (plus one
``RETRY_INTERVAL``), and only then applies ``on_locked``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar, overload

from celery import current_task, shared_task
from celery.signals import task_failure, task_revoked

from ..conf import (
    MAX_IDENTITY_LENGTH,
    get_settings,
    resolve_timing,
    shown,
)
from ..exceptions import BackendUnavailable, LeaseHeld
from ..lease import Lease, _use_lease
from ..locks import Lock
from ..singleton import Key, SingletonSpec, retry_countdown
from ..term import resolve_backend

logger = logging.getLogger("django_leader.celery")

F = TypeVar("F", bound=Callable[..., Any])
#: The attribute of the wrapped function that carries its :class:`Singleton` spec.
SPEC_ATTRIBUTE = "_django_leader_singleton"


class Singleton(SingletonSpec):
    """A Celery task's :class:`~django_leader.singleton.SingletonSpec`, and how it runs."""

    def __init__(
        self,
        fun: Callable[..., Any],
        *,
        key: Key,
        ttl: float | None,
        on_locked: str,
        bind: bool,
        retry_delay: float | None,
    ) -> None:
        super().__init__(fun, key=key, ttl=ttl, on_locked=on_locked, skip_first=bind)
        self.bind = bind
        self.retry_delay = retry_delay

    # -- running --------------------------------------------------------------------------
    def wrap(self) -> Callable[..., Any]:
        fun = self.fun

        @functools.wraps(fun)
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.bind:
                task, call_args = args[0], args[1:]
            else:
                task, call_args = current_task._get_current_object(), args
            return self.call(task, args, call_args, kwargs)

        # Celery checks the arguments of a call against this signature, not (*args, **kw).
        run.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
        setattr(run, SPEC_ATTRIBUTE, self)
        return run

    def call(
        self,
        task: Any,
        args: tuple[Any, ...],
        call_args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        name = self.lock_name(getattr(task, "name", None), call_args, kwargs)
        request = getattr(task, "request", None)
        task_id = getattr(request, "id", None)
        identity = task_identity(task_id)
        lock = Lock(name, ttl=self.ttl, blocking=False, identity=identity)
        try:
            lease = lock.__enter__()
        except LeaseHeld as exc:
            again = self.same_task_held(name, task_id, identity) if task_id else None
            if again is None:
                return self.locked(task, task_id, exc)
            lock, lease = again
        try:
            with _use_lease(lease):
                return self.fun(*args, **kwargs)
        finally:
            lock.__exit__(None, None, None)

    def same_task_held(self, name: str, task_id: str, identity: str) -> tuple[Lock, Lease] | None:
        """The lock, if it is held by an earlier execution of this very task (same task id):
        freed at once if that execution's process, on this host, is gone; else waited for,
        at most until its lease would expire (plus one retry interval). None: held by
        another task, or still held after the wait."""
        lock = Lock(name, ttl=self.ttl, blocking=False, identity=identity)
        timing = resolve_timing(self.ttl)
        backend = resolve_backend(None, timing)  # the store the lock's term talks to
        current = backend.read(name)
        if current is None:  # released in between
            with suppress(LeaseHeld):
                return lock, lock.__enter__()
            return None
        if not current.holder.startswith(f"{task_id}@"):
            return None
        host, pid = holder_host_pid(current.holder)
        if (
            host == socket.gethostname()
            and pid is not None
            and pid != os.getpid()
            and _process_gone(pid)
        ):
            if backend.release(current):
                logger.info(
                    "released lock %r of an earlier execution of task %s, whose process %s "
                    "ended without releasing it",
                    name,
                    task_id,
                    pid,
                )
            with suppress(LeaseHeld):
                return lock, lock.__enter__()
            return None
        remaining = current.expires_in
        if remaining is None:
            remaining = timing.ttl
        wait = max(0.0, remaining) + timing.retry_interval
        logger.info(
            "lock %r is held by an earlier execution of this task (%s): waiting up to %.1fs for it",
            name,
            current.holder,
            wait,
        )
        lock = Lock(name, ttl=self.ttl, blocking=True, timeout=wait, identity=identity)
        try:
            return lock, lock.__enter__()
        except LeaseHeld:
            return None

    def locked(self, task: Any, task_id: str | None, exc: LeaseHeld) -> Any:
        label = f"{getattr(task, 'name', self.fun.__qualname__)}[{task_id or '-'}]"
        if self.on_locked == "skip":
            logger.info("%s skipped: %s", label, exc)
            return None
        if self.on_locked == "raise" or task is None or task_id is None:
            # (A retry needs a task request: not when the function is called directly.)
            logger.info("%s not run: %s", label, exc)
            raise exc
        countdown = retry_countdown(self.retry_delay)
        logger.info("%s retried in %.2fs: %s", label, countdown, exc)
        raise task.retry(exc=exc, countdown=countdown)


def holder_host_pid(holder: str) -> tuple[str, int | None]:
    """The host and pid of a singleton task's lock holder ``<task id>@<host>:<pid>``
    (``("", None)`` for a holder of another form)."""
    _, at, place = holder.rpartition("@")
    host, colon, pid = place.rpartition(":")
    if not at or not colon or not pid.isdigit():
        return "", None
    return host, int(pid)


def task_identity(task_id: str | None) -> str:
    """The lock holder of a task execution: ``<task id>@<host>:<pid>`` (the pid lets the
    worker's main process tell when the execution is over for good). Whoever publishes the
    task chooses its id: a control character in it is escaped (see :func:`shown`)."""
    suffix = f"@{socket.gethostname()}:{os.getpid()}"
    head = shown(task_id or "call")
    return head[: MAX_IDENTITY_LENGTH - len(suffix)] + suffix


@overload
def singleton_task(fun: F, /) -> Any: ...


@overload
def singleton_task(
    *,
    key: Key = None,
    ttl: float | None = None,
    on_locked: str = "skip",
    **task_kwargs: Any,
) -> Callable[[F], Any]: ...


def singleton_task(
    *task_args: Any,
    key: Key = None,
    ttl: float | None = None,
    on_locked: str = "skip",
    **task_kwargs: Any,
) -> Any:
    """A drop-in for ``celery.shared_task`` that runs at most one execution per lock key
    at a time, across all workers.

    ``key``: the lock name — a format string over the task's arguments
    (``"report-{customer_id}"``, ``"sync-{0}"``; arguments passed by position can be named
    too), a callable taking the task's arguments, or None (default: the task's name, one
    execution of the task at a time). ``ttl``: the lock's lease time (default
    ``LEASE_TTL``); the lock is renewed while the task runs, and a crashed worker's lock
    expires after ``ttl``. ``on_locked`` — what a call that finds the lock held does:
    ``"skip"`` (log, return None), ``"retry"`` (``self.retry()`` with a countdown of
    ``default_retry_delay`` if given, else ``RETRY_INTERVAL``, plus jitter; ``max_retries``
    applies) or ``"raise"`` (raise :class:`~django_leader.LeaseHeld`). Inside the task,
    :func:`~django_leader.current_lease` is the lock's lease (``token``, ``lost``,
    ``check()``, ``fenced()``). Every other keyword goes to ``shared_task``.
    """
    retry_delay = task_kwargs.get("default_retry_delay")

    def create(fun: F) -> Any:
        spec = Singleton(
            fun,
            key=key,
            ttl=ttl,
            on_locked=on_locked,
            bind=bool(task_kwargs.get("bind", False)),
            retry_delay=None if retry_delay is None else float(retry_delay),
        )
        return shared_task(**task_kwargs)(spec.wrap())

    if len(task_args) == 1 and callable(task_args[0]) and not task_kwargs:
        return create(task_args[0])
    if task_args:
        raise TypeError("singleton_task takes the task function or keyword arguments only")
    return create


def singleton_spec(task: Any) -> Singleton | None:
    """The :class:`Singleton` spec of a task made by :func:`singleton_task`, else None."""
    return getattr(getattr(task, "run", None), SPEC_ATTRIBUTE, None)


# -- locks of executions that cannot release them themselves ------------------------------
def _process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        pass
    else:
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")  # zombie or dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def release_abandoned(task: Any, task_id: str, args: Any, kwargs: Any) -> threading.Thread | None:
    """Release the lock of execution ``task_id`` of singleton ``task`` once its process is
    gone (in a thread; returns it). The release is owner-checked: it frees the lock only if
    that very execution still holds it."""
    spec = singleton_spec(task)
    if spec is None or not task_id:
        return None
    thread = threading.Thread(
        target=_release_abandoned,
        args=(spec, task.name, task_id, tuple(args or ()), dict(kwargs or {})),
        name=f"leader-release:{task_id}",
        daemon=True,
    )
    thread.start()
    return thread


def _release_abandoned(
    spec: Singleton, task_name: str, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    try:
        name = spec.lock_name(task_name, args, kwargs)
    except Exception:
        return
    # A thread of its own: the backend's connection is per thread, and the worker's main
    # thread forks pool processes, which must not inherit it.
    backend = resolve_backend(None)
    try:
        lease = backend.read(name)
        if lease is None or not lease.holder.startswith(f"{task_id}@"):
            return
        host, pid = holder_host_pid(lease.holder)
        if pid is None or host != socket.gethostname():
            # Another host's process: whether a pid runs here says nothing of it. Its lock
            # expires after its ttl (or its redelivery frees it, on its own host).
            return
        give_up = time.monotonic() + (spec.ttl or get_settings().timing.ttl)
        while not _process_gone(pid):
            if time.monotonic() >= give_up:
                return  # still running (it ignored the signal): its lease is its own
            time.sleep(0.02)
        if backend.release(lease):
            logger.info(
                "released lock %r of %s[%s], whose process %s ended without releasing it",
                name,
                task_name,
                task_id,
                pid,
            )
    except BackendUnavailable as exc:
        logger.warning("could not release lock %r of %s[%s]: %s", name, task_name, task_id, exc)
    finally:
        backend.close()


def _on_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    if terminated and request is not None and singleton_spec(sender) is not None:
        release_abandoned(sender, request.id, request.args, request.kwargs)


def _on_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    from billiard.exceptions import TimeLimitExceeded, WorkerLostError

    # The pool process was lost, or killed at the hard time limit: it cannot release.
    if (
        isinstance(exception, (WorkerLostError, TimeLimitExceeded))
        and task_id
        and singleton_spec(sender) is not None
    ):
        release_abandoned(sender, task_id, args, kwargs)


task_revoked.connect(_on_revoked, weak=False, dispatch_uid="django_leader.singleton.revoked")
task_failure.connect(_on_failure, weak=False, dispatch_uid="django_leader.singleton.failure")
