from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig

logger = logging.getLogger("django_leader")


class DjangoLeaderConfig(AppConfig):
    name = "django_leader"
    verbose_name = "Leader election"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401  (registers the system checks)

        post_migrate.connect(initialize_new_store, sender=self)


def initialize_new_store(plan: list[Any] | None = None, **kwargs: Any) -> None:
    """After the ``migrate`` that created django-leader's tables (its first migration
    applied in this run: a new deployment), mark the lease store as new, so that the first
    lock does not wait out the lock-delay of a store without its marker. A later
    ``migrate`` leaves the store alone: a marker missing then means a loss. A store that
    cannot be reached is left to notice it was new the slow way (a log line)."""
    if not any(
        migration.app_label == "django_leader" and migration.initial and not backwards
        for migration, backwards in plan or []
    ):
        return
    from .backends import get_backend
    from .exceptions import BackendUnavailable

    try:
        if get_backend().initialize():
            logger.info("django_leader: marked the new lease store (manage.py leader init)")
    except BackendUnavailable as exc:
        logger.warning(
            "django_leader: could not mark the new lease store (%s); its first lock will "
            "wait out the lock-delay, or run `manage.py leader init`",
            exc,
        )
