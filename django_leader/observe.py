"""``observe(name)``: follow who leads a name without campaigning (etcd's ``Observe``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator

from .backends.base import Backend
from .conf import resolve_timing, validate_name
from .exceptions import BackendUnavailable
from .lease import Lease
from .term import StoreCaller, call_bound, resolve_backend

logger = logging.getLogger("django_leader")


def observe(
    name: str,
    *,
    backend: Backend | str | None = None,
    interval: float | None = None,
) -> Generator[Lease | None, None, None]:
    """Yield who holds ``name`` now (a snapshot :class:`~django_leader.Lease`, or None if
    nobody does), then each change: a new holder or token, or the lease becoming free.

    Read-only: it never campaigns nor writes. It reads the store when the store wakes it
    (a release, on PostgreSQL and Redis) and otherwise every ``interval`` seconds (default
    ``RETRY_INTERVAL``), so a change is seen within ``interval`` at the latest. A store
    that cannot be reached is retried quietly (a warning once per outage); the generator
    runs until the caller stops iterating (``close()``, ``break``).
    """
    name = validate_name(name)
    timing = resolve_timing()
    every = timing.retry_interval if interval is None else float(interval)
    if not every > 0:
        raise ValueError(f"interval must be > 0, got {interval!r}")
    store = resolve_backend(backend, timing)
    woken = threading.Event()
    watch = store.watch(name, woken.set)
    caller = StoreCaller(store, f"{name}:observe")
    bound = call_bound(timing)
    last: tuple[str, int] | bool | None = False  # False: nothing yielded yet
    failing = False
    try:
        while True:
            woken.clear()
            try:
                lease = caller.call(bound, store.read, name)
            except (BackendUnavailable, TimeoutError) as exc:
                if not failing:
                    logger.warning("observing %r: cannot read the store: %s", name, exc)
                failing = True
                woken.wait(every)
                continue
            failing = False
            key = None if lease is None else (lease.holder, lease.token)
            if key != last:
                last = key
                yield lease
            woken.wait(every)
    finally:
        if watch is not None:
            watch.close()
        caller.close()
