"""Settings: ``settings.DJANGO_LEADER`` merged over defaults and validated up front.

Every rule is checked when the settings are first read, and a violation raises
``ImproperlyConfigured`` naming the key and the rule, in the manner of client-go's
``leaseDuration must be greater than renewDeadline``.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .zookeeper_conf import (  # ZooKeeperSettings re-exported: the settings' API
    ZooKeeperSettings,
    validate_zookeeper,
    with_defaults,
)

DEFAULTS: dict[str, Any] = {
    "BACKEND": "django_leader.backends.db.DatabaseBackend",
    "DATABASE": "default",
    "CACHE": "default",
    "LEASE_TTL": 15.0,
    "RENEW_INTERVAL": 5.0,
    "RETRY_INTERVAL": 2.0,
    "IDENTITY": None,
    "HISTORY": True,
    "HISTORY_RETENTION": 30,
    "BEAT_SCHEDULER": "celery.beat:PersistentScheduler",
    "LOCK_DELAY": None,
    "ELECTION_MODE": "race",
    "ZOOKEEPER": None,
    "REDIS_WAIT_REPLICAS": 0,
    # django_leader.views: the fields of a lease the health views show to anyone
    "HEALTH_DETAILS": (),
    # django_leader.metrics: distinct lease names labelled, the others as "other"
    "METRICS_NAMES": 100,
    # django_leader.tasks: entry name -> {"task", "every", ...} (its check is registered there)
    "TASKS_SCHEDULE": {},
}

#: Longest lease name accepted (the width of the ``name`` column).
MAX_NAME_LENGTH = 200
#: Longest holder identity accepted (the width of the ``holder`` column).
MAX_IDENTITY_LENGTH = 255


@dataclass(frozen=True)
class Timing:
    """The three durations that drive a campaign, validated together."""

    ttl: float
    renew_interval: float
    retry_interval: float

    @cached_property  # (read on every store call: worked out once)
    def safety_margin(self) -> float:
        """How long before the store's expiry a holder stops believing it leads.

        It absorbs clock-rate drift between this host and the store, and the time
        it takes to fire the step-down callbacks.
        """
        return min(self.ttl * 0.1, 2.0)

    @cached_property
    def call_timeout(self) -> float:
        """Upper bound of one store call; shorter than the renew deadline (SPEC rule 6)."""
        return max(0.2, min(self.renew_interval, (self.ttl - self.safety_margin) / 3))


def validate_timing(ttl: Any, renew_interval: Any, retry_interval: Any) -> Timing:
    """Check the TTL / renew / retry rules; raise ValueError naming the broken rule."""
    names = {"ttl": "ttl", "renew": "renew_interval", "retry": "retry_interval"}
    values = {"ttl": ttl, "renew": renew_interval, "retry": retry_interval}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{names[key]} must be a number of seconds, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{names[key]} must be greater than 0, got {value!r}")
    if renew_interval >= ttl / 2:
        raise ValueError(
            f"{names['renew']} must be less than {names['ttl']} / 2 so a holder can retry a "
            f"failed renewal before its lease expires (got {names['renew']}={renew_interval!r}, "
            f"{names['ttl']}={ttl!r})"
        )
    return Timing(float(ttl), float(renew_interval), float(retry_interval))


def validate_name(name: Any) -> str:
    """Return ``name`` if it is usable as a lease name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lease name must be a str, got {type(name).__name__}")
    if not name or not name.strip():
        raise ValueError("lease name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"lease name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}"
        )
    if name != name.strip():
        raise ValueError(f"lease name must not begin or end with white space: {name!r}")
    if not printable(name):
        raise ValueError(f"lease name must not contain control characters: {name!r}")
    return name


def validate_identity(identity: Any) -> str:
    if not isinstance(identity, str) or not identity.strip():
        raise ValueError(f"identity must be a non-empty str, got {identity!r}")
    if len(identity) > MAX_IDENTITY_LENGTH:
        raise ValueError(f"identity must be at most {MAX_IDENTITY_LENGTH} characters")
    if not printable(identity):
        # It is logged, listed by `leader status` and shown in the admin: a newline or an
        # escape sequence in it would forge log lines or rewrite a terminal.
        raise ValueError(f"identity must not contain control characters: {identity!r}")
    return identity


#: What a name or an identity may not hold: C0 and C1 controls (newlines, ESC, CSI), line
#: and paragraph separators, and the bidirectional overrides that reorder displayed text.
_CONTROL = frozenset(
    [*map(chr, range(32)), *map(chr, range(127, 160)), "\u2028", "\u2029",
     *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]
)  # fmt: skip


def printable(text: str) -> bool:
    """Whether ``text`` holds none of the control characters names and identities refuse."""
    return _CONTROL.isdisjoint(text)


def shown(text: str) -> str:
    """``text`` with each control character written as an escape (``\\n``, ``\\x1b``): safe
    to print or log, whoever wrote it to the store."""
    if printable(text):
        return text
    return "".join(repr(c)[1:-1] if c in _CONTROL else c for c in text)


@dataclass(frozen=True)
class LeaderSettings:
    backend: str
    database: str
    cache: str
    timing: Timing
    identity: str | None
    history: bool
    history_retention: int
    beat_scheduler: str
    #: Seconds no lease may be taken after the store may have lost state (``LOCK_DELAY``;
    #: None: ``LEASE_TTL``). See :func:`lock_delay`.
    lock_delay: float
    #: How the waiting candidates take turns (``ELECTION_MODE``): "race", "fifo" or
    #: "priority" (see docs/elections.md).
    election_mode: str = "race"
    #: The ZooKeeper backend's connection (``ZOOKEEPER``), validated.
    zookeeper: ZooKeeperSettings | None = None
    #: Replicas that must confirm every lease write of the Redis backend (``WAIT``) before
    #: it counts (``REDIS_WAIT_REPLICAS``; 0: none). See docs/production.md.
    redis_wait_replicas: int = 0


#: Checks of the keys that belong to a feature (key -> a callable raising
#: ImproperlyConfigured), registered by the feature itself (``django_leader.tasks``
#: registers ``TASKS_SCHEDULE``'s): the settings import no feature.
_setting_checks: dict[str, Callable[[Any], object]] = {}


def register_setting_check(key: str, check: Callable[[Any], object]) -> None:
    """Have :func:`get_settings` call ``check`` with ``DJANGO_LEADER[key]`` when it is set
    (not empty); ``check`` raises ImproperlyConfigured naming what is wrong."""
    global _cached
    _setting_checks[key] = check
    _cached = None  # settings read before the check was known are checked again


def feature_setting(key: str) -> Any:
    """``DJANGO_LEADER[key]`` as set, else its default: for a key that the feature owning
    it validates itself (:func:`register_setting_check`)."""
    raw = getattr(django_settings, "DJANGO_LEADER", None) or {}
    return raw.get(key, DEFAULTS[key])


def _build() -> LeaderSettings:
    raw = getattr(django_settings, "DJANGO_LEADER", None)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("DJANGO_LEADER must be a dict")
    conf = with_defaults(raw, DEFAULTS, "DJANGO_LEADER")
    for key in ("BACKEND", "DATABASE", "CACHE", "BEAT_SCHEDULER"):
        if not isinstance(conf[key], str) or not conf[key]:
            raise ImproperlyConfigured(f"DJANGO_LEADER['{key}'] must be a non-empty string")
    if conf["DATABASE"] not in django_settings.DATABASES:
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['DATABASE'] must name an alias in DATABASES, got {conf['DATABASE']!r}"
        )
    timing = _validate_settings_timing(conf)
    identity = conf["IDENTITY"]
    if identity is not None:
        try:
            validate_identity(identity)
        except ValueError as exc:
            raise ImproperlyConfigured(f"DJANGO_LEADER['IDENTITY']: {exc}") from None
    if not isinstance(conf["HISTORY"], bool):
        raise ImproperlyConfigured("DJANGO_LEADER['HISTORY'] must be True or False")
    retention = conf["HISTORY_RETENTION"]
    if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
        raise ImproperlyConfigured(
            "DJANGO_LEADER['HISTORY_RETENTION'] must be a whole number of days >= 1, "
            f"got {retention!r}"
        )
    lock_delay = conf["LOCK_DELAY"]
    if lock_delay is None:
        lock_delay = timing.ttl
    elif (
        isinstance(lock_delay, bool)
        or not isinstance(lock_delay, (int, float))
        or not math.isfinite(lock_delay)
        or lock_delay < 0
    ):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['LOCK_DELAY'] must be None or a number of seconds >= 0 (how long "
            "no lease may be taken after the store may have forgotten leases), "
            f"got {lock_delay!r}"
        )
    zookeeper = validate_zookeeper(conf["ZOOKEEPER"])
    wait_replicas = conf["REDIS_WAIT_REPLICAS"]
    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
        raise ImproperlyConfigured(
            "DJANGO_LEADER['REDIS_WAIT_REPLICAS'] must be a whole number >= 0 (how many "
            f"replicas must confirm each lease write), got {wait_replicas!r}"
        )
    for key, check in _setting_checks.items():
        if conf[key]:
            check(conf[key])  # ImproperlyConfigured naming the key and the rule
    from .election import validate_mode

    try:
        mode = validate_mode(conf["ELECTION_MODE"]).value
    except ValueError as exc:
        raise ImproperlyConfigured(f"DJANGO_LEADER['ELECTION_MODE']: {exc}") from None
    return LeaderSettings(
        election_mode=mode,
        backend=conf["BACKEND"],
        database=conf["DATABASE"],
        cache=conf["CACHE"],
        timing=timing,
        identity=identity,
        history=conf["HISTORY"],
        history_retention=retention,
        beat_scheduler=conf["BEAT_SCHEDULER"],
        lock_delay=float(lock_delay),
        zookeeper=zookeeper,
        redis_wait_replicas=wait_replicas,
    )


def _validate_settings_timing(conf: dict[str, Any]) -> Timing:
    try:
        return validate_timing(conf["LEASE_TTL"], conf["RENEW_INTERVAL"], conf["RETRY_INTERVAL"])
    except ValueError as exc:
        message = str(exc)
        for arg, key in (
            ("renew_interval", "RENEW_INTERVAL"),
            ("retry_interval", "RETRY_INTERVAL"),
            ("ttl", "LEASE_TTL"),
        ):
            message = message.replace(arg, f"DJANGO_LEADER['{key}']")
        raise ImproperlyConfigured(message) from None


_cached: LeaderSettings | None = None


def get_settings() -> LeaderSettings:
    """The validated settings (cached; reset when Django's ``setting_changed`` fires)."""
    global _cached
    if _cached is None:
        _cached = _build()
    return _cached


@receiver(setting_changed)
def _reset(setting: str, **kwargs: Any) -> None:
    global _cached, _identity
    if setting in ("DJANGO_LEADER", "DATABASES"):
        _cached = None
        _identity = None


_identity: tuple[int, str] | None = None


def default_identity() -> str:
    """``IDENTITY`` if set, else ``<hostname>:<pid>:<random>`` (made anew after a fork)."""
    global _identity
    configured = get_settings().identity
    if configured:
        return configured
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
    return _identity[1]


def lock_delay(ttl: float) -> float:
    """Seconds during which no candidate may take a lease after the store may have lost
    state (SPEC rule 7: a flushed or restarted Redis, a lease row deleted by hand).

    Every holder that could still believe it leads passes its local deadline within its
    own ttl of its last successful renewal, which came before the loss. The candidates of
    one name run the same code with the same ttl, so the delay is the longer of
    ``LOCK_DELAY`` (default ``LEASE_TTL``) and the acquirer's own ``ttl``; where callers of
    one name use different ttls, set ``LOCK_DELAY`` to the longest.
    """
    return max(get_settings().lock_delay, ttl)


def resolve_timing(
    ttl: float | None = None,
    renew_interval: float | None = None,
    retry_interval: float | None = None,
) -> Timing:
    """Per-call timing: explicit values over the settings; ValueError if a rule is broken.

    A ``ttl`` given without ``renew_interval`` renews at ``min(RENEW_INTERVAL, ttl / 3)``,
    so a short ttl alone is always valid.
    """
    defaults = get_settings().timing
    if ttl is None:
        ttl = defaults.ttl
    elif renew_interval is None and isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
        renew_interval = (
            min(defaults.renew_interval, ttl / 3) if ttl > 0 else defaults.renew_interval
        )
    if renew_interval is None:
        renew_interval = defaults.renew_interval
    if retry_interval is None:
        retry_interval = defaults.retry_interval
    return validate_timing(ttl, renew_interval, retry_interval)
