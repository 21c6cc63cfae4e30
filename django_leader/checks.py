"""System checks (``manage.py check``): ``django_leader.E001``… and ``W001``…

* E001 — ``DJANGO_LEADER`` breaks a rule (unknown key, bad value, RENEW_INTERVAL ≥ TTL/2…).
* E002 — ``BACKEND`` cannot be imported or is not a Backend.
* E003 — the lease database cannot be inspected (``manage.py check --database <alias>``).
* W002 — migrations of django_leader are not applied to the lease database (run ``manage.py
  migrate django_leader``); also in a plain ``manage.py check``. A warning, not an error, so
  that it never blocks ``migrate`` itself.
* E004 — ``BACKEND`` is the Redis backend but ``CACHE`` does not name a Redis cache
  (django-redis or Django's RedisCache): no other cache gives an atomic compare-and-set
  across processes.
* Any other message the configured backend class reports about the settings
  (:meth:`Backend.check_configuration <django_leader.backends.base.Backend.check_configuration>`;
  E004 is the Redis backend's).
* W001 — the lease database is an in-memory SQLite database, which other connections
  (and so other processes) cannot see.
* W010…W016 — Celery beat and broker (below).
* W017 — the ZooKeeper ensemble does not answer (``manage.py check --database <alias>``).
* W020…W023 — what a failover of the lease store's replicas can do, or a pooler in the
  way, as the backend tells (:meth:`Backend.check_replication
  <django_leader.backends.base.Backend.check_replication>`; ``--database`` too).
* W000 — one of these checks failed unexpectedly: no check raises (:func:`never_raises`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from .backends.base import Backend
    from .conf import LeaderSettings

# Registers the check of DJANGO_LEADER["TASKS_SCHEDULE"] with the settings, which import
# no feature: a malformed schedule is then refused by get_settings() at startup.
from .tasks import entries as _tasks_entries  # noqa: F401

CheckFunction = Callable[..., list[CheckMessage]]


#: The backends that ship with django-leader, for the hint of E002.
BACKENDS_HINT = (
    "Use 'django_leader.backends.db.DatabaseBackend', "
    "'django_leader.backends.redis.RedisBackend' or "
    "'django_leader.backends.zookeeper.ZooKeeperBackend'."
)


def never_raises(check: CheckFunction) -> CheckFunction:
    """A check that fails unexpectedly reports W000 instead of raising: Django runs the
    checks before ``migrate``, ``runserver`` and every management command, and a check
    that raises stops all of them with a traceback about the check, not the project."""

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> list[CheckMessage]:
        try:
            return check(*args, **kwargs)
        except Exception as exc:
            return [
                Warning(
                    f"django_leader's check {check.__name__}() could not run: "
                    f"{type(exc).__name__}: {exc}",
                    hint="The project's configuration made the check itself fail; please "
                    "report it to django-leader with this message.",
                    id="django_leader.W000",
                )
            ]

    return wrapper


@register("django_leader")
@never_raises
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .backends.base import Backend
    from .conf import get_settings

    try:
        conf = get_settings()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="See the settings reference in the django-leader docs.",
                id="django_leader.E001",
            )
        ]
    messages: list[CheckMessage] = []
    try:
        backend = import_string(conf.backend)
    except ImportError as exc:
        messages.append(
            Error(
                f"DJANGO_LEADER['BACKEND'] {conf.backend!r} cannot be imported: {exc}",
                hint=BACKENDS_HINT,
                id="django_leader.E002",
            )
        )
    else:
        # A class, and a subclass of the contract (whichever store it is).
        is_class = isinstance(backend, type)
        if not (is_class and issubclass(backend, Backend)):
            messages.append(
                Error(
                    f"DJANGO_LEADER['BACKEND'] {conf.backend!r} is not a "
                    "django_leader.backends.base.Backend subclass",
                    hint=BACKENDS_HINT,
                    id="django_leader.E002",
                )
            )
        else:
            messages += backend.check_configuration(conf)
    db = connections.settings.get(conf.database, {})
    if db.get("ENGINE", "").endswith("sqlite3") and _in_memory(db.get("NAME")):
        messages.append(
            Warning(
                f"DJANGO_LEADER['DATABASE'] {conf.database!r} is an in-memory SQLite database: "
                "leases there are invisible to other processes.",
                hint="Use a file-based SQLite database, PostgreSQL or MySQL/MariaDB.",
                id="django_leader.W001",
            )
        )
    return messages


def _in_memory(name: Any) -> bool:
    text = str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text


@register("django_leader")
@never_raises
def check_migrations(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """W002: a django_leader table missing, or a migration not applied, in the lease
    database.

    Unlike most checks that read a database, this one also runs in a plain ``manage.py
    check`` (a missing lease table is a misconfiguration to report there). It looks over a
    connection of its own, bounded by the lease store's timeouts and closed at once, and
    never creates a SQLite file. A database it cannot reach makes it say nothing: that is
    :func:`check_database`'s E003, when databases are checked on purpose.

    Inside ``migrate`` it says nothing, since the command is about to create the tables
    (it looked alarming on a first ``migrate``).
    """
    alias = _lease_database()
    if alias is None:
        return []
    what = _not_migrated(alias, "django_leader")
    if what is None:
        return []
    from .backends.db.migrations import migrate_hint

    return [
        Warning(
            f"django_leader {what} in database {alias!r}",
            hint=migrate_hint(alias),
            id="django_leader.W002",
        )
    ]


def _not_migrated(alias: str, app_label: str) -> str | None:
    """What of app ``app_label`` is not migrated in database ``alias`` (``"table(s) …
    missing"``, ``"migration(s) … not applied"``), or None: all is, the database cannot be
    looked at, or the checks run inside ``migrate``, which is about to create the tables
    (a warning then looked alarming on a first migrate)."""
    from .backends.db import migration_state

    if _inside_migrate():
        return None
    try:
        missing_tables, unapplied = migration_state(alias, app_label)
    except Exception:  # unreachable, or database access not allowed here (tests)
        return None
    if missing_tables:
        return f"table(s) {', '.join(missing_tables)} missing"
    if unapplied:
        return f"migration(s) {', '.join(unapplied)} not applied"
    return None


def _inside_migrate() -> bool:
    """Whether these checks run inside ``manage.py migrate`` (or a subclass of it). Its
    arguments to the checks cannot tell: Django 6 passes every database alias to every
    check in a plain ``check`` too. So look for the command up the stack."""
    migrate = sys.modules.get("django.core.management.commands.migrate")
    if migrate is None:
        return False
    frame = inspect.currentframe()
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), migrate.Command):
            return True
        frame = frame.f_back
    return False


@register(Tags.database)
@never_raises
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """E003: the lease database cannot be inspected. A database check: Django runs it only
    when asked to (``manage.py check --database <alias>``, ``migrate``)."""
    from .backends.db import migration_state

    alias = _lease_database()
    if alias is None or not databases or alias not in databases:
        return []
    try:
        migration_state(alias)
    except Exception as exc:
        return [Error(f"cannot inspect database {alias!r}: {exc}", id="django_leader.E003")]
    return []


#: Seconds the ZooKeeper check waits for the ensemble when CONNECT_TIMEOUT is not set.
ZOOKEEPER_CHECK_TIMEOUT = 3.0


@register(Tags.database)
@never_raises
def check_zookeeper(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """W017: the ZooKeeper ensemble does not answer within ``CONNECT_TIMEOUT`` (default
    3 s). A database check,
    like E003: Django runs it only when asked to (``manage.py check --database default``,
    ``migrate``), never on every command."""
    from .exceptions import BackendUnavailable

    found = _configured_backend() if databases else None
    # A store that can be pinged (the ZooKeeper ensemble) is asked; the others are not.
    if found is None or not found[1].answers_ping():
        return []
    conf, backend_class = found
    zk = conf.zookeeper
    timeout = (zk.connect_timeout if zk else None) or ZOOKEEPER_CHECK_TIMEOUT
    backend = backend_class()
    try:
        backend.ping(timeout)
    except BackendUnavailable as exc:
        return [
            Warning(
                f"the ZooKeeper ensemble does not answer within {timeout:g}s: {exc}",
                hint="Check DJANGO_LEADER['ZOOKEEPER']['HOSTS'] and that the servers run.",
                id="django_leader.W017",
            )
        ]
    finally:
        backend.shutdown()
    return []


def _lease_database() -> str | None:
    from .conf import get_settings

    try:
        alias = get_settings().database
    except ImproperlyConfigured:
        return None  # reported by check_settings
    return alias if alias in connections.settings else None


# -- Celery beat ---------------------------------------------------------------------------
# W010 — DJANGO_LEADER["BEAT_SCHEDULER"] cannot be imported, is not a Celery scheduler, or is
#        LeaderScheduler itself (it must name the scheduler LeaderScheduler wraps).
# W011 — it is django-celery-beat's scheduler but ``django_celery_beat`` is not installed.
# W012 — beats use LeaderScheduler but BACKEND cannot fence the beat's slot records (its
#        ``shared_slots`` is False; the database and Redis backends can): a failover may
#        send a slot again.
# W013 — DJANGO_LEADER["BEAT_SCHEDULER"] is set but CELERY_BEAT_SCHEDULER is not set or
#        names another scheduler: the beats do not elect a leader, every one of them sends.
# W015 — it is django-celery-beat's scheduler, on SQLite without IMMEDIATE transactions.
# W016 — it is django-celery-beat's scheduler, and its tables or migrations are missing.
# Warnings, not errors: they concern beat processes only, and must not stop a web deploy.
@register("django_leader")
@never_raises
def check_celery_beat(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        import celery  # noqa: F401
    except ImportError:
        return []
    from django.conf import settings

    from .conf import get_settings

    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []  # reported by check_settings
    from .celery.wrapped import SchedulerAppNotInstalled, wrapped_scheduler_class

    messages: list[CheckMessage] = []
    try:
        wrapped = wrapped_scheduler_class(conf.beat_scheduler)
    except SchedulerAppNotInstalled as exc:
        messages.append(
            Warning(
                str(exc),
                hint="Add 'django_celery_beat' to INSTALLED_APPS and run migrate.",
                id="django_leader.W011",
            )
        )
    except ImproperlyConfigured as exc:
        messages.append(
            Warning(
                str(exc),
                hint="Name the scheduler LeaderScheduler wraps, e.g. "
                "'celery.beat:PersistentScheduler' or "
                "'django_celery_beat.schedulers:DatabaseScheduler'.",
                id="django_leader.W010",
            )
        )
    else:
        if wrapped.__module__.startswith("django_celery_beat"):
            messages += _check_database_scheduler_on_sqlite()
            messages += _check_database_scheduler_tables()
    beat_scheduler = str(getattr(settings, "CELERY_BEAT_SCHEDULER", "") or "")
    if "LeaderScheduler" in beat_scheduler:
        try:
            backend = import_string(conf.backend)
        except ImportError:
            backend = None  # reported as E002
        if isinstance(backend, type) and not getattr(backend, "shared_slots", False):
            messages.append(
                Warning(
                    f"DJANGO_LEADER['BACKEND'] {conf.backend!r} cannot fence the beat's "
                    "records of the slots it sent: they stay in each beat process, and a "
                    "failover may send an entry's last slot again.",
                    hint="Use the database backend or the Redis backend.",
                    id="django_leader.W012",
                )
            )
    elif "BEAT_SCHEDULER" in (getattr(settings, "DJANGO_LEADER", None) or {}):
        # Set for LeaderScheduler, which beat does not use: the setting does nothing.
        what = repr(beat_scheduler) if beat_scheduler else "not set (Celery's default)"
        messages.append(
            Warning(
                f"DJANGO_LEADER['BEAT_SCHEDULER'] is set but CELERY_BEAT_SCHEDULER is {what}: "
                "beats started with it do not elect a leader, and every one of them sends "
                "the schedule.",
                hint="Set CELERY_BEAT_SCHEDULER = 'django_leader.celery:LeaderScheduler' (if "
                "every beat is started with -S django_leader.celery:LeaderScheduler instead, "
                "add 'django_leader.W013' to SILENCED_SYSTEM_CHECKS).",
                id="django_leader.W013",
            )
        )
    return messages


def _check_database_scheduler_tables() -> list[CheckMessage]:
    """W016: django-celery-beat's tables missing or its migrations not applied (a how-to
    once migrated ``django_leader`` only): the elected beat fails at every tick while it
    holds the lease. Quiet, as W002, on the database ``migrate`` is migrating, and on a
    database it cannot reach."""
    from django.db import router
    from django_celery_beat.models import PeriodicTask

    alias = router.db_for_write(PeriodicTask)
    if alias not in connections.settings:
        return []
    what = _not_migrated(alias, "django_celery_beat")
    if what is None:
        return []
    return [
        Warning(
            f"BEAT_SCHEDULER is django-celery-beat's scheduler but its {what} in database "
            f"{alias!r}: the elected beat would fail at every tick while it holds the lease.",
            hint=f"Run `manage.py migrate --database {alias}` (every app, not only django_leader).",
            id="django_leader.W016",
        )
    ]


def _check_database_scheduler_on_sqlite() -> list[CheckMessage]:
    """W015: django-celery-beat's scheduler on SQLite with deferred transactions. Its
    transaction reads, then writes: if another process (a beat campaigning for the lease)
    writes meanwhile, SQLite refuses the upgrade at once ("database is locked", no busy
    timeout applies) and the entry is never sent."""
    import django
    from django.db import router
    from django_celery_beat.models import PeriodicTask

    alias = router.db_for_write(PeriodicTask)
    database = connections.settings.get(alias, {})
    if not database.get("ENGINE", "").endswith("sqlite3"):
        return []
    if (database.get("OPTIONS") or {}).get("transaction_mode") == "IMMEDIATE":
        return []
    hint = (
        f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE".'
        if django.VERSION >= (5, 1)
        else "Use PostgreSQL or MySQL/MariaDB (Django 5.1 and later can also set "
        'OPTIONS["transaction_mode"] = "IMMEDIATE" on SQLite).'
    )
    return [
        Warning(
            f"django-celery-beat's scheduler keeps its schedule in SQLite database {alias!r} "
            "with deferred transactions: while another beat writes to the lease table, "
            "saving the schedule fails with 'database is locked' and that entry is not sent.",
            hint=hint,
            id="django_leader.W015",
        )
    ]


# W014 — the Celery broker is Redis but kombu's Redis transport cannot load (redis-py or one
#        of the transport's own imports missing): every worker and beat would die at start.
REDIS_BROKER_SCHEMES = ("redis://", "rediss://", "redis+socket://", "sentinel://")


@register("django_leader")
@never_raises
def check_celery_broker(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        import celery  # noqa: F401
    except ImportError:
        return []
    from django.conf import settings

    url = str(
        getattr(settings, "CELERY_BROKER_URL", None) or os.environ.get("CELERY_BROKER_URL") or ""
    )
    if not url.lower().startswith(REDIS_BROKER_SCHEMES):
        return []
    try:
        importlib.import_module("kombu.transport.redis")
        problem = None if importlib.util.find_spec("redis") else "redis-py is not installed"
    except Exception as exc:  # an import of the transport's own that fails
        problem = f"kombu's Redis transport cannot be imported: {type(exc).__name__}: {exc}"
    if problem is None:
        return []
    return [
        Warning(
            f"CELERY_BROKER_URL is a Redis URL but {problem}: Celery workers and beats "
            "will fail to start.",
            hint='Install Celery with its Redis extra: pip install "celery[redis]" '
            '(or "django-leader[celery,redis]").',
            id="django_leader.W014",
        )
    ]


#: Seconds the replication check waits for the store.
REPLICATION_CHECK_TIMEOUT = 3.0


@register(Tags.database)
@never_raises
def check_replication(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """W020… : what a failover of the lease store's replicas can do (SPEC rule 9), as the
    backend tells (:meth:`Backend.check_replication`). A database check, like W017: run by
    ``manage.py check --database default`` and ``migrate``, never on every command."""
    found = _configured_backend() if databases else None
    if found is None:
        return []
    conf, backend_class = found
    return backend_class.check_replication(conf, REPLICATION_CHECK_TIMEOUT)


def _configured_backend() -> tuple[LeaderSettings, type[Backend]] | None:
    """The settings and the backend class they name; None if either is wrong (which
    check_settings reports)."""
    from .backends.base import Backend
    from .conf import get_settings

    try:
        conf = get_settings()
        backend_class = import_string(conf.backend)
    except (ImproperlyConfigured, ImportError):
        return None
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        return None
    return conf, backend_class
