"""Lease stores. Pick one with ``DJANGO_LEADER["BACKEND"]`` (a dotted path).

The contract is :class:`~django_leader.backends.base.Backend`; the stores shipped are
:class:`~django_leader.backends.db.DatabaseBackend` (the package ``backends/db/``),
:class:`~django_leader.backends.redis.RedisBackend` (the package ``backends/redis/``;
``backends/cache.py`` keeps its former name ``CacheBackend``) and
:class:`~django_leader.backends.zookeeper.ZooKeeperBackend` (the package
``backends/zookeeper/``); :class:`~django_leader.backends.memory.MemoryBackend` is for
tests. Code outside this package uses the contract and the functions below,
never a concrete store.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..conf import get_settings
from ..forksafe import ForkSafeLock
from .base import Backend

#: Store-call timeouts shorter than the settings' are rounded down to this times a power of
#: two (0.2 s is the shortest call timeout a Timing gives).
TIMEOUT_STEP = 0.2

_lock = ForkSafeLock()
_shared: dict[tuple[str, float | None], Backend] = {}
_shared_conf: object = None
#: Set by django_leader.testing: every Elector and lock() of this process uses it.
_override: Backend | None = None


def get_backend(path: str | None = None, *, timeout: float | None = None) -> Backend:
    """The backend named by ``path`` (default: the ``BACKEND`` setting), shared per process.

    ``timeout`` bounds each store call when it is shorter than the settings' call timeout
    (for an Elector or lock whose ttl is shorter than ``LEASE_TTL``). It is rounded down to
    a power of two times :data:`TIMEOUT_STEP`, so that however many distinct ttls a
    process uses, it keeps a few backends (each with its connections) per path.
    """
    global _shared_conf
    if _override is not None:
        return _override
    conf = get_settings()
    what = "backend" if path else "DJANGO_LEADER['BACKEND']"
    path = path or conf.backend
    if timeout is not None:
        timeout = None if timeout >= conf.timing.call_timeout else timeout_bucket(timeout)
    key = (path, timeout)
    with _lock:
        if conf is not _shared_conf:  # the settings changed (tests): build anew
            _shared.clear()
            _shared_conf = conf
        if key not in _shared:
            _shared[key] = _load(path, timeout, what)
        return _shared[key]


def timeout_bucket(timeout: float) -> float:
    """The largest ``TIMEOUT_STEP * 2**k`` (k an integer, maybe negative) not above
    ``timeout``: never longer than asked (every call is bounded, see docs/safety.md), at
    most half as long."""
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    bucket = TIMEOUT_STEP
    while bucket > timeout:
        bucket /= 2
    while bucket * 2 <= timeout:
        bucket *= 2
    return bucket


def _load(path: str, timeout: float | None, what: str) -> Backend:
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{what} {path!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ImproperlyConfigured(
            f"{what} {path!r} must name a django_leader.backends.base.Backend subclass"
        )
    factory: Any = cls  # the contract does not fix constructor arguments; ours take timeout
    return factory() if timeout is None else factory(timeout=timeout)


def resolve(backend: Backend | str | None, *, timeout: float | None = None) -> Backend:
    """``backend`` if it is a :class:`Backend` instance, else :func:`get_backend` of the
    dotted path it names (``None``: the ``BACKEND`` setting) with ``timeout``.

    :raises TypeError: for anything else.
    """
    if backend is None or isinstance(backend, str):
        return get_backend(backend, timeout=timeout)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend or a dotted path, got {backend!r}")
    return backend
