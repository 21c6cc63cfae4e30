from __future__ import annotations

from django.apps import AppConfig


class DjangoLeaderConfig(AppConfig):
    name = "django_leader"
    verbose_name = "Leader election"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
