"""What every ``singleton_task`` shares, Celery's and django.tasks': the lock key (a format
string over the task's arguments, a callable, or the task's name), the lease time and
``on_locked``, checked when the task is declared.

Lock names live under :data:`NAMESPACE`, apart from every other lease (a task's arguments
cannot name the beat's), and a format string's values are written so that two calls share
a lock only when they have the same values: in a key with several fields, a value's
characters that separate fields in the key (and ``%``) are escaped as ``%XX``.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import string
from collections.abc import Callable
from typing import Any

from .conf import MAX_NAME_LENGTH, get_settings, validate_name

Key = str | Callable[..., str] | None

ON_LOCKED = ("skip", "retry", "raise")

#: The prefix of every singleton_task's lock name.
NAMESPACE = "singleton:"


class SingletonSpec:
    """How one task is made a singleton: its lock key, ttl and what to do when locked.

    ``skip_first``: the function's first parameter is not a task argument (Celery's bound
    task, django.tasks' context), so keys cannot name it."""

    def __init__(
        self,
        fun: Callable[..., Any],
        *,
        key: Key,
        ttl: float | None,
        on_locked: str,
        skip_first: bool = False,
    ) -> None:
        if on_locked not in ON_LOCKED:
            raise ValueError(f"on_locked must be one of {', '.join(ON_LOCKED)}, got {on_locked!r}")
        if key is not None and not isinstance(key, str) and not callable(key):
            raise TypeError(f"key must be a format string, a callable or None, got {key!r}")
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
        ):
            raise ValueError(f"ttl must be a number of seconds > 0, got {ttl!r}")
        self.fun = fun
        self.key = key
        self.ttl = None if ttl is None else float(ttl)
        self.on_locked = on_locked
        signature = inspect.signature(fun)
        parameters = list(signature.parameters.values())
        if skip_first and parameters:
            parameters = parameters[1:]  # the task instance, or the task context
        self.signature = signature.replace(parameters=parameters)
        self._escaped: frozenset[str] = frozenset()
        if isinstance(key, str):
            self._check_key(key)

    def _check_key(self, key: str) -> None:
        """Fail at import time for a key that names no argument of the task, or whose
        fields are not kept apart by some text (``"{a}{b}"``: ``("ab", "c")`` and
        ``("a", "bc")`` would share a lock)."""
        params = self.signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        parsed = list(string.Formatter().parse(key))
        fields = [i for i, (_, field, _, _) in enumerate(parsed) if field is not None]
        between = [parsed[i][0] for i in fields[1:]]  # the text before each later field
        if any(not text for text in between):
            raise ValueError(
                f"singleton_task key {key!r}: put some text between two fields "
                "(e.g. '{a}-{b}'), else different arguments could make one key"
            )
        self._escaped = frozenset("".join(between)) | {"%"} if between else frozenset()
        for _, field, _, _ in parsed:
            if field is None or field == "":
                if field == "":
                    raise ValueError(f"singleton_task key {key!r}: use {{0}} or {{name}}, not {{}}")
                continue
            head = field.split(".", 1)[0].split("[", 1)[0]
            if head.isdigit() or head in params or takes_any:
                continue
            raise ValueError(
                f"singleton_task key {key!r} names {head!r}, which is not an argument of "
                f"{self.fun.__qualname__}{self.signature}"
            )

    # -- naming ---------------------------------------------------------------------------
    def lock_name(
        self, task_name: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        """The lease name for a call with these arguments (without the bound task), under
        :data:`NAMESPACE`."""
        if self.key is None:
            name = task_name or f"{self.fun.__module__}.{self.fun.__qualname__}"
        elif callable(self.key):
            name = self.key(*args, **kwargs)
            if not isinstance(name, str):
                raise TypeError(f"singleton_task key callable returned {name!r}, not a str")
        else:
            name = self._format(self.key, args, kwargs)
        name = NAMESPACE + name
        if len(name) > MAX_NAME_LENGTH:
            digest = hashlib.sha256(name.encode()).hexdigest()[:16]
            name = f"{name[: MAX_NAME_LENGTH - 17]}#{digest}"
        return validate_name(name)

    def _format(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        named: dict[str, Any] = dict(kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            pass  # the call itself will fail; name the lock from what was given
        else:
            bound.apply_defaults()
            for name, value in bound.arguments.items():
                if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                else:
                    named[name] = value
        try:
            return _Escaping(self._escaped).format(key, *args, **named)
        except (KeyError, IndexError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"singleton_task key {key!r} cannot be formatted with args={args!r} "
                f"kwargs={kwargs!r}: {exc!r}"
            ) from None


class _Escaping(string.Formatter):
    """``str.format`` whose every formatted value has the characters ``escaped`` written
    as ``%XX`` (UTF-8 bytes)."""

    def __init__(self, escaped: frozenset[str]) -> None:
        self.escaped = escaped

    def format_field(self, value: Any, format_spec: str) -> str:
        text = super().format_field(value, format_spec)
        if not self.escaped.intersection(text):
            return text
        return "".join(
            "".join(f"%{byte:02X}" for byte in c.encode()) if c in self.escaped else c for c in text
        )


def retry_countdown(delay: float | None) -> float:
    """Seconds before a singleton task that found its lock held runs again: ``delay``
    (default ``RETRY_INTERVAL``) plus up to half of it, so that calls that met one lock
    do not all come back at once."""
    if delay is None:
        delay = get_settings().timing.retry_interval
    return delay * random.uniform(1.0, 1.5)
