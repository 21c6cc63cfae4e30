"""Where the tasks framework comes from: ``django.tasks`` (Django 6.0+) or the
``django-tasks`` backport (``django_tasks``, for Django 4.2 to 5.2)."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def framework() -> Any:
    """The module with ``task``, ``Task`` and ``task_backends``: ``django.tasks``, else
    ``django_tasks``; ImproperlyConfigured if there is neither."""
    if find_spec("django.tasks") is not None:
        import django.tasks as tasks

        return tasks
    if find_spec("django_tasks") is not None:
        import django_tasks

        return django_tasks
    raise ImproperlyConfigured(
        "django_leader.tasks needs Django's tasks framework: Django 6.0 or later "
        "(django.tasks), or the django-tasks backport (pip install 'django-leader[tasks]')"
    )


def task_class() -> type:
    """The ``Task`` class of the framework in use (in its ``base`` module, both ways)."""
    task: type = import_module(f"{framework().__name__}.base").Task
    return task
