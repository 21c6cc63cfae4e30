"""Finding the Celery app for ``manage.py runleader --beat``, and the beat command line.

``runleader --beat [options]`` runs ``python -m celery [-A APP] beat [options]`` under
its guard. Without ``-A`` among the options, the app is the ``celery`` module of the
settings' package (``proj.celery`` for ``proj.settings``), the layout of Celery's Django
guide, unless ``CELERY_APP`` is set, which Celery reads itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from django.core.exceptions import ImproperlyConfigured


def settings_package() -> str | None:
    """The package of the settings module (``proj`` for ``proj.settings``), if any."""
    from django.conf import settings

    module = getattr(settings, "SETTINGS_MODULE", None) or ""
    return module.rpartition(".")[0] or None


def project_celery_app() -> str | None:
    """The Celery app of the project as ``-A`` takes it: ``<proj>.celery`` when the
    settings package has that module (Celery's documented Django layout), else None.
    An ImportError from inside that module propagates: it exists but is broken."""
    package = settings_package()
    if package is None:
        return None
    try:
        import_module(f"{package}.celery")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"{package}.celery", package):
            raise  # the module exists but imports something missing: say what
        return None
    return f"{package}.celery"


def default_beat_app() -> str | None:
    """The app for ``--beat`` given without ``-A``: None if Celery will read
    ``CELERY_APP``, else the project's ``celery`` module.

    Raises ImproperlyConfigured, with a message for the user, if there is none or it
    cannot be imported (rather than let Celery run its empty default app)."""
    if os.environ.get("CELERY_APP"):
        return None
    try:
        app = project_celery_app()
    except ImportError as exc:
        raise ImproperlyConfigured(f"cannot import the project's Celery app: {exc}") from None
    if app is None:
        raise ImproperlyConfigured(
            "give the Celery app, e.g. --beat -A proj (no "
            f"{settings_package() or '<project>'}.celery module was found)"
        )
    return app


def beat_command(
    options: Sequence[str], default_app: Callable[[], str | None] | None = None
) -> list[str]:
    """``python -m celery [-A app] beat [options]`` from the options given after --beat;
    without ``-A``/``--app`` there, the app ``default_app()`` names, if any. ``-A`` goes
    before ``beat``, where Celery takes it; the interpreter is this one."""
    app: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(options):
        option = options[i]
        if option in ("-A", "--app") and i + 1 < len(options):
            app += [option, options[i + 1]]
            i += 2
            continue
        if option.startswith("--app=") or (option.startswith("-A") and len(option) > 2):
            app.append(option)
        else:
            rest.append(option)
        i += 1
    if not app and default_app is not None and (name := default_app()) is not None:
        app = ["-A", name]
    return [sys.executable, "-m", "celery", *app, "beat", *rest]
