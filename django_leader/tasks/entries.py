"""The entries of ``DJANGO_LEADER["TASKS_SCHEDULE"]``: parsed and validated here, enqueued
by :mod:`django_leader.tasks.schedule`.

Importing this module registers the validation with the settings
(:func:`django_leader.conf.register_setting_check`), so that ``get_settings()`` refuses a
malformed schedule at startup, naming the entry, the key and the rule, without the
settings importing this feature. The system checks import it when the app is ready.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..backends.slots import entry_key
from ..conf import feature_setting, register_setting_check
from .compat import task_class

#: The keys an entry of ``TASKS_SCHEDULE`` may have.
ENTRY_KEYS = ("task", "every", "args", "kwargs", "slot_kwarg")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Entry:
    """One entry of the schedule: enqueue ``task`` every ``every`` seconds."""

    name: str
    task: str  # dotted path of a django.tasks Task
    every: float
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The keyword the slot's time (ISO 8601, the store's clock) is passed as, if any.
    slot_kwarg: str | None = None

    @property
    def key(self) -> str:
        """How the entry is named in the slot records."""
        return entry_key(self.name)

    def due(self, now: datetime) -> datetime:
        """The latest slot at or before ``now``: a multiple of ``every`` since the epoch
        (counted in microseconds, so that a slot is the same datetime every time)."""
        step = max(1, round(self.every * 1_000_000))
        micros = (now - EPOCH) // timedelta(microseconds=1)
        return EPOCH + timedelta(microseconds=micros // step * step)

    def resolve(self) -> Any:
        """The Task the entry enqueues."""
        try:
            task = import_string(self.task)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"DJANGO_LEADER['TASKS_SCHEDULE'][{self.name!r}]['task']: cannot import "
                f"{self.task!r}: {exc}"
            ) from None
        if not isinstance(task, task_class()):
            raise ImproperlyConfigured(
                f"DJANGO_LEADER['TASKS_SCHEDULE'][{self.name!r}]['task']: {self.task!r} is "
                f"not a task (decorate it with @task or @singleton_task), got {task!r}"
            )
        return task


def load_schedule(raw: Any = None) -> list[Entry]:
    """The entries of ``raw`` (default: ``DJANGO_LEADER["TASKS_SCHEDULE"]``), validated;
    ImproperlyConfigured naming the key and the rule otherwise."""
    if raw is None:
        raw = feature_setting("TASKS_SCHEDULE")
    where = "DJANGO_LEADER['TASKS_SCHEDULE']"
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of entry name -> entry")
    entries = []
    for name, spec in raw.items():
        here = f"{where}[{name!r}]"
        if not isinstance(name, str) or not name:
            raise ImproperlyConfigured(f"{where}: entry names must be non-empty strings")
        if not isinstance(spec, Mapping):
            raise ImproperlyConfigured(f"{here} must be a dict with 'task' and 'every'")
        unknown = sorted(set(spec) - set(ENTRY_KEYS))
        if unknown:
            raise ImproperlyConfigured(
                f"{here} has unknown key(s) {', '.join(unknown)}; known: {', '.join(ENTRY_KEYS)}"
            )
        task = spec.get("task")
        if not isinstance(task, str) or "." not in task:
            raise ImproperlyConfigured(f"{here}['task'] must be the dotted path of a task")
        every = spec.get("every")
        if isinstance(every, timedelta):
            every = every.total_seconds()
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise ImproperlyConfigured(
                f"{here}['every'] must be a number of seconds > 0 or a timedelta, got "
                f"{spec.get('every')!r}"
            )
        if not math.isfinite(every):
            raise ImproperlyConfigured(f"{here}['every'] must be finite")
        args = spec.get("args", ())
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise ImproperlyConfigured(f"{here}['args'] must be a list")
        kwargs = spec.get("kwargs", {})
        if not isinstance(kwargs, Mapping):
            raise ImproperlyConfigured(f"{here}['kwargs'] must be a dict")
        slot_kwarg = spec.get("slot_kwarg")
        if slot_kwarg is not None and (not isinstance(slot_kwarg, str) or not slot_kwarg):
            raise ImproperlyConfigured(f"{here}['slot_kwarg'] must be a keyword name or None")
        try:
            json.dumps([list(args), dict(kwargs)])
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"{here}: args and kwargs must be JSON-serializable (tasks store them so): {exc}"
            ) from None
        entries.append(
            Entry(name, task, float(every), tuple(args), dict(kwargs), slot_kwarg or None)
        )
    return entries


register_setting_check("TASKS_SCHEDULE", load_schedule)
