"""Prometheus metrics (``pip install 'django-leader[prometheus]'``).

Call :func:`install` once (the ``metrics/`` view of :mod:`django_leader.urls` does) to
register, in prometheus-client's default registry:

* ``django_leader_is_leader{name}`` — 1 while this process holds the lease (Elector or lock);
* ``django_leader_transitions_total{name}`` — elections won by this process;
* ``django_leader_renew_seconds{name}`` — histogram of successful renewal round-trips;
* ``django_leader_renew_failures_total{name,reason}`` — renewals that failed (``error``)
  or were refused (``refused``);
* ``django_leader_leaderless_seconds{name}`` — histogram of how long the name had no
  leader before this process took it over after an expiry (store clock).
* ``django_leader_store_callers{store}`` — the threads, each with its store connection,
  that run this process's calls to the store (``callers.py``: 1, up to 4 while several
  holders wait on calls at once; 0 once the session ended).

A process labels at most ``DJANGO_LEADER["METRICS_NAMES"]`` (default 100) distinct names,
the first it sees; every later one is counted under the name ``(other)``, so that names
made from data (``invoice-42``) cannot grow the exposition without bound.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import hooks, signals
from .conf import feature_setting, register_setting_check
from .forksafe import ForkSafeLock

_installed = False
_lock = ForkSafeLock()
_metrics: dict[str, Any] = {}
#: The label of the names past the first ``METRICS_NAMES``.
OTHER = "(other)"
_labelled: set[str] = set()


def names_limit(raw: Any) -> int:
    """``METRICS_NAMES`` validated: a whole number >= 0."""
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ImproperlyConfigured(
            "DJANGO_LEADER['METRICS_NAMES'] must be a whole number >= 0 (how many distinct "
            f"lease names the metrics label; the others count as {OTHER!r}), got {raw!r}"
        )
    return raw


register_setting_check("METRICS_NAMES", names_limit)


def label(name: str) -> str:
    """``name`` as the metrics label it: itself if labelled already or while fewer than
    ``METRICS_NAMES`` are, else :data:`OTHER`."""
    with _lock:
        if name in _labelled:
            return name
        if len(_labelled) < names_limit(feature_setting("METRICS_NAMES")):
            _labelled.add(name)
            return name
    return OTHER


def install() -> None:
    """Create the metrics and connect them; idempotent."""
    global _installed
    with _lock:
        if _installed:
            return
        from prometheus_client import Counter, Gauge, Histogram

        _metrics["is_leader"] = Gauge(
            "django_leader_is_leader", "1 while this process holds the lease", ["name"]
        )
        _metrics["transitions"] = Counter(
            "django_leader_transitions", "Elections won by this process", ["name"]
        )
        _metrics["renew"] = Histogram(
            "django_leader_renew_seconds",
            "Successful renewal round-trips",
            ["name"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        _metrics["failures"] = Counter(
            "django_leader_renew_failures",
            "Renewals that failed or were refused",
            ["name", "reason"],
        )
        _metrics["leaderless"] = Histogram(
            "django_leader_leaderless_seconds",
            "Seconds without a leader before a takeover by this process",
            ["name"],
            buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
        )
        _metrics["callers"] = Gauge(
            "django_leader_store_callers",
            "Threads (each with its store connection) running this process's store calls",
            ["store"],
        )
        signals.leader_elected.connect(_elected, dispatch_uid="django_leader.metrics")
        signals.leader_lost.connect(_ended, dispatch_uid="django_leader.metrics")
        signals.lease_released.connect(_ended, dispatch_uid="django_leader.metrics")
        hooks.add_observer(_observe)
        _installed = True


def _elected(sender: Any, lease: Any, **kwargs: Any) -> None:
    name = label(lease.name)
    if name != OTHER:  # a gauge of many names at once would say nothing
        _metrics["is_leader"].labels(name).set(1)
    _metrics["transitions"].labels(name).inc()


def _ended(sender: Any, lease: Any, **kwargs: Any) -> None:
    name = label(lease.name)
    if name != OTHER:
        _metrics["is_leader"].labels(name).set(0)


def _observe(event: str, name: str, value: float) -> None:
    if event == "renew":
        _metrics["renew"].labels(label(name)).observe(value)
    elif event == "renew_failed":
        _metrics["failures"].labels(label(name), "error").inc()
    elif event == "renew_refused":
        _metrics["failures"].labels(label(name), "refused").inc()
    elif event == "leaderless":
        _metrics["leaderless"].labels(label(name)).observe(value)
    elif event == "store_callers":  # ``name``: the store
        _metrics["callers"].labels(name).set(value)
