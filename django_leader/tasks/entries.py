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
ENTRY_KEYS = ("task", "every", "cron", "catch_up", "max_catch_up", "args", "kwargs", "slot_kwarg")
#: What a newly elected process does with the slots that fell due while no leader ran:
#: ``skip`` them, enqueue the latest ``once`` (the default), or ``all`` of them (the latest
#: ``max_catch_up``).
CATCH_UP = ("skip", "once", "all")
#: ``max_catch_up`` when ``catch_up`` is ``all`` and the entry does not say.
MAX_CATCH_UP = 10

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Entry:
    """One entry of the schedule: enqueue ``task`` every ``every`` seconds, or at the times
    of the cron expression ``cron`` (in Django's ``TIME_ZONE``)."""

    name: str
    task: str  # dotted path of a django.tasks Task
    every: float | None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The keyword the slot's time (ISO 8601, the store's clock) is passed as, if any.
    slot_kwarg: str | None = None
    cron: str | None = None
    catch_up: str = "once"
    max_catch_up: int = MAX_CATCH_UP

    @property
    def key(self) -> str:
        """How the entry is named in the slot records."""
        return entry_key(self.name)

    def due(self, now: datetime) -> datetime:
        """The latest slot at or before ``now``: a multiple of ``every`` since the epoch
        (counted in microseconds, so that a slot is the same datetime every time), or the
        latest time of ``cron``."""
        if self.cron is not None:
            return _cron_time(self.cron, now + timedelta(microseconds=1), forward=False)
        step = self._step()
        micros = (now - EPOCH) // timedelta(microseconds=1)
        return EPOCH + timedelta(microseconds=micros // step * step)

    def after(self, slot: datetime) -> datetime:
        """The slot after ``slot``."""
        if self.cron is not None:
            return _cron_time(self.cron, slot, forward=True)
        return self.due(slot) + timedelta(microseconds=self._step())

    def before(self, slot: datetime) -> datetime:
        """The slot before ``slot``."""
        return self.due(slot - timedelta(microseconds=1))

    def missed(self, last: datetime, now: datetime, limit: int) -> list[datetime]:
        """The slots after ``last`` up to ``now``, oldest first: the latest ``limit``."""
        slots = [self.due(now)]
        while len(slots) < limit:
            earlier = self.before(slots[-1])
            if earlier <= last:
                break
            slots.append(earlier)
        return [slot for slot in reversed(slots) if slot > last]

    def _step(self) -> int:
        assert self.every is not None
        return max(1, round(self.every * 1_000_000))

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
        every, cron = _every(spec, here), _cron(spec, here)
        catch_up = spec.get("catch_up", "once")
        if catch_up not in CATCH_UP:
            raise ImproperlyConfigured(
                f"{here}['catch_up'] must be one of {', '.join(map(repr, CATCH_UP))}, got "
                f"{catch_up!r}"
            )
        max_catch_up = spec.get("max_catch_up", MAX_CATCH_UP)
        if "max_catch_up" in spec and catch_up != "all":
            raise ImproperlyConfigured(f"{here}['max_catch_up'] goes with 'catch_up': 'all'")
        if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
            raise ImproperlyConfigured(f"{here}['max_catch_up'] must be a whole number >= 1")
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
            Entry(
                name,
                task,
                every,
                tuple(args),
                dict(kwargs),
                slot_kwarg or None,
                cron,
                catch_up,
                max_catch_up,
            )
        )
    return entries


def _every(spec: Mapping[str, Any], here: str) -> float | None:
    every = spec.get("every")
    if every is None:
        if "cron" not in spec:
            raise ImproperlyConfigured(f"{here} needs 'every' (seconds) or 'cron'")
        return None
    if "cron" in spec:
        raise ImproperlyConfigured(f"{here} takes 'every' or 'cron', not both")
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
        raise ImproperlyConfigured(
            f"{here}['every'] must be a number of seconds > 0 or a timedelta, got "
            f"{spec.get('every')!r}"
        )
    if not math.isfinite(every):
        raise ImproperlyConfigured(f"{here}['every'] must be finite")
    return float(every)


def _cron(spec: Mapping[str, Any], here: str) -> str | None:
    cron = spec.get("cron")
    if cron is None:
        return None
    try:
        from croniter import croniter
    except ImportError:
        raise ImproperlyConfigured(
            f"{here}['cron'] needs croniter: pip install \"django-leader[cron]\""
        ) from None
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise ImproperlyConfigured(
            f"{here}['cron'] must be a cron expression of five fields "
            f"(minute hour day-of-month month day-of-week), got {cron!r}"
        )
    return cron


def _cron_time(expression: str, start: datetime, *, forward: bool) -> datetime:
    """The time of ``expression`` after (or before) ``start``, strictly, in UTC: the cron
    fields are read in Django's ``TIME_ZONE``."""
    from croniter import croniter
    from django.utils import timezone as django_timezone

    local = start.astimezone(django_timezone.get_default_timezone())
    times = croniter(expression, local)
    at: datetime = times.get_next(datetime) if forward else times.get_prev(datetime)
    return at.astimezone(timezone.utc)


register_setting_check("TASKS_SCHEDULE", load_schedule)
