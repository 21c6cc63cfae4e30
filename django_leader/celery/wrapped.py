"""The scheduler :class:`~django_leader.celery.LeaderScheduler` wraps: which class
(``DJANGO_LEADER["BEAT_SCHEDULER"]``, :func:`wrapped_scheduler_class`), and what is mixed
into it: every send goes through the LeaderScheduler (which records the slot, fenced by
its lease, first), and the wrapped scheduler's state is written back only while the
lease it was built under is held."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Protocol

from celery.beat import Scheduler
from celery.utils.imports import load_extension_class_names, symbol_by_name
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from ..backends.slots import Slot
from ..conf import get_settings
from ..forksafe import ForkSafeLock
from ..lease import Lease

logger = logging.getLogger("django_leader.celery")


class SlotOwner(Protocol):
    """What the wrapped scheduler asks of the
    :class:`~django_leader.celery.LeaderScheduler` that built it."""

    #: True on a scheduler that wraps another one (LeaderScheduler and its subclasses):
    #: ``BEAT_SCHEDULER`` must not name one.
    wraps_a_scheduler: ClassVar[bool]

    def _adopt(self, entry: Any) -> None: ...

    def _take_slot(
        self, inner: Any, entry: Any, advance: bool
    ) -> tuple[Any, Lease, Slot] | None: ...

    def _sent(self, lease: Lease, slot: Slot) -> None: ...


class _LeaderMixin:
    """Mixed into the wrapped scheduler's class: every send goes through its LeaderScheduler,
    and schedule state is written back only while the lease it was built under is held."""

    _dl_owner: SlotOwner | None
    _dl_lease: Lease | None

    def __init__(
        self,
        *args: Any,
        _dl_owner: SlotOwner | None = None,
        _dl_lease: Lease | None = None,
        **kwargs: Any,
    ) -> None:
        # Set before the wrapped __init__, which may already sync (PersistentScheduler).
        self._dl_owner = _dl_owner
        self._dl_lease = _dl_lease
        self._dl_reserved: dict[str, Any] = {}
        super().__init__(*args, **kwargs)

    def is_due(self, entry: Any) -> Any:
        if self._dl_owner is not None:
            self._dl_owner._adopt(entry)
        return super().is_due(entry)  # type: ignore[misc]

    def reserve(self, entry: Any) -> Any:
        new_entry = super().reserve(entry)  # type: ignore[misc]
        self._dl_reserved[entry.name] = new_entry.last_run_at
        return new_entry

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        owner = self._dl_owner
        if owner is None:  # the banner's instance: it never sends
            return None
        prepared = owner._take_slot(self, entry, advance)
        if prepared is None:
            return None
        message_entry, lease, slot = prepared
        result = super().apply_async(  # type: ignore[misc]
            message_entry, producer=producer, advance=False, **kwargs
        )
        owner._sent(lease, slot)
        return result

    def sync(self) -> None:
        lease = self._dl_lease
        if lease is None or not lease.held:
            # A follower, or a deposed leader: its view of the schedule is not the truth.
            logger.debug("not syncing the schedule: this beat does not lead")
            return
        super().sync()  # type: ignore[misc]


_classes: dict[type[Scheduler], type[Scheduler]] = {}
_classes_lock = ForkSafeLock()


def _leader_class(cls: type[Scheduler]) -> type[Scheduler]:
    with _classes_lock:
        if cls not in _classes:
            _classes[cls] = type(
                f"Leader{cls.__name__}",
                (_LeaderMixin, cls),
                {"__module__": __name__, "__qualname__": f"Leader{cls.__name__}"},
            )
        return _classes[cls]


class SchedulerAppNotInstalled(ImproperlyConfigured):
    """``BEAT_SCHEDULER`` names a scheduler of an app missing from ``INSTALLED_APPS``."""


def wrapped_scheduler_class(path: str | None = None) -> type[Scheduler]:
    """The scheduler class named by ``DJANGO_LEADER["BEAT_SCHEDULER"]`` (or ``path``):
    ``"module:Class"``, a dotted path or a Celery alias."""
    path = path or get_settings().beat_scheduler
    aliases = dict(load_extension_class_names("celery.beat_schedulers"))
    module = str(aliases.get(path, path)).replace(":", ".").split(".")[0]
    if module == "django_celery_beat" and not apps.is_installed("django_celery_beat"):
        # Importing its scheduler would import its models, which Django refuses with a
        # RuntimeError about app_label that says nothing of the setting at fault.
        raise SchedulerAppNotInstalled(
            f"DJANGO_LEADER['BEAT_SCHEDULER'] is {path!r} but 'django_celery_beat' is not "
            "in INSTALLED_APPS: its models and tables are missing."
        )
    try:
        cls = symbol_by_name(path, aliases=aliases)
    except Exception as exc:  # ImportError, or whatever the module raises as it loads
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['BEAT_SCHEDULER'] {path!r} cannot be imported: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['BEAT_SCHEDULER'] {path!r} is not a celery.beat.Scheduler subclass"
        )
    if getattr(cls, "wraps_a_scheduler", False) or issubclass(cls, _LeaderMixin):
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['BEAT_SCHEDULER'] {path!r} is a LeaderScheduler: it must name "
            "the scheduler LeaderScheduler wraps (e.g. 'celery.beat:PersistentScheduler')"
        )
    return cls
