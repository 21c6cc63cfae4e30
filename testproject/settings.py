"""Settings of the test and demo project.

SQLite by default. ``DATABASE_URL`` (postgres://…, mysql://…, sqlite:///path) replaces the
default database and ``REDIS_URL`` adds a Redis cache. For the test suite the project also
defines one alias per reachable database server (``postgresql``, ``mysql``) and, when a
ZooKeeper serves, ``ZOOKEEPER``, so that one run covers every backend; see
``testproject/services.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Safe while nothing in django_leader reads Django's settings on import (django.setup()
# imports it anyway): only the defaults are looked at, to see which keys they know.
from django_leader.conf import DEFAULTS as _LEADER_DEFAULTS
from testproject.services import (
    TEST_RUN_ID,
    database_from_url,
    extra_databases,
    redis_caches,
    zookeeper_hosts,
)

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "django-leader-testproject-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_leader",
    "testproject.demoapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_sqlite_path = os.environ.get("DJANGO_LEADER_SQLITE", str(BASE_DIR / "testproject.sqlite3"))
DATABASES = {
    "default": database_from_url(os.environ.get("DATABASE_URL"))
    or {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _sqlite_path,
        # Tests share the database between processes: it must be a file, not :memory:.
        "TEST": {
            "NAME": str(
                Path(_sqlite_path).with_name(f"test_{TEST_RUN_ID}_" + Path(_sqlite_path).name)
            )
        },
    },
    **extra_databases(),
}
# Processes started by the test suite work on the parent's test databases.
for _alias, _name in json.loads(os.environ.get("DJANGO_LEADER_TEST_DB_NAMES", "{}")).items():
    if _alias in DATABASES:
        DATABASES[_alias]["NAME"] = _name

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    **redis_caches(),
}

DJANGO_LEADER = {
    "BACKEND": os.environ.get("DJANGO_LEADER_BACKEND", "django_leader.backends.db.DatabaseBackend"),
    "DATABASE": os.environ.get("DJANGO_LEADER_DATABASE", "default"),
    "CACHE": os.environ.get("DJANGO_LEADER_CACHE", "redis" if "redis" in CACHES else "default"),
    "LEASE_TTL": float(os.environ.get("DJANGO_LEADER_TTL", "15")),
    "RENEW_INTERVAL": float(os.environ.get("DJANGO_LEADER_RENEW", "5")),
    "RETRY_INTERVAL": float(os.environ.get("DJANGO_LEADER_RETRY", "2")),
}

# The ZooKeeper lease backend's servers: DJANGO_LEADER_ZOOKEEPER_HOSTS (default the local
# 127.0.0.1:2181) when one of them serves, else None and the ZooKeeper tests skip. Leases
# live under a root of this run's own, so that concurrent runs share no lease; processes
# started by a run are given the run's root in DJANGO_LEADER_ZOOKEEPER_ROOT.
_zookeeper_hosts = zookeeper_hosts()
ZOOKEEPER = (
    {
        "HOSTS": _zookeeper_hosts,
        "ROOT": os.environ.get(
            "DJANGO_LEADER_ZOOKEEPER_ROOT", f"/django-leader-test-{TEST_RUN_ID}"
        ),
    }
    if _zookeeper_hosts
    else None
)
# Into DJANGO_LEADER only where its validation knows the key (it refuses unknown ones), or
# where the ZooKeeper backend is asked for (which cannot work without it).
if ZOOKEEPER and (
    "ZOOKEEPER" in _LEADER_DEFAULTS or str(DJANGO_LEADER["BACKEND"]).endswith(".ZooKeeperBackend")
):
    DJANGO_LEADER["ZOOKEEPER"] = ZOOKEEPER

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_leader": {
            "handlers": ["console"],
            "level": os.environ.get("DJANGO_LEADER_LOG_LEVEL", "INFO"),
        }
    },
}
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- Celery ------------------------------------------------------------------------------
# The Celery app is testproject/celery.py (`celery -A testproject worker|beat`), configured
# from the CELERY_* settings below. The test suite and bench/celery_*.py start workers and
# beats with DJANGO_LEADER_CELERY_* variables that pick the broker, the queue and a
# periodic task; the defaults suit a local Redis. Appended as one block: keep it last.
CELERY_BROKER_URL = os.environ.get("DJANGO_LEADER_CELERY_BROKER", "redis://127.0.0.1:6379/10")
CELERY_RESULT_BACKEND = os.environ.get("DJANGO_LEADER_CELERY_RESULTS", CELERY_BROKER_URL)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("DJANGO_LEADER_CELERY_QUEUE", "celery")
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Every beat runs LeaderScheduler; it wraps DJANGO_LEADER["BEAT_SCHEDULER"].
CELERY_BEAT_SCHEDULER = "django_leader.celery:LeaderScheduler"
CELERY_BEAT_LEADER_LEASE = os.environ.get("DJANGO_LEADER_CELERY_BEAT_LEASE", "testproject-beat")
DJANGO_LEADER["BEAT_SCHEDULER"] = os.environ.get(
    "DJANGO_LEADER_BEAT_SCHEDULER", "celery.beat:PersistentScheduler"
)
if os.environ.get("DJANGO_LEADER_DATABASE"):
    DJANGO_LEADER["DATABASE"] = os.environ["DJANGO_LEADER_DATABASE"]
# One periodic task, `record_slot` every N seconds, when DJANGO_LEADER_CELERY_BEAT_EVERY=N.
CELERY_BEAT_SCHEDULE = (
    {
        os.environ.get("DJANGO_LEADER_CELERY_BEAT_ENTRY", "record-slot"): {
            "task": "testproject.demoapp.tasks.record_slot",
            "schedule": float(os.environ["DJANGO_LEADER_CELERY_BEAT_EVERY"]),
            "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": 60},
        }
    }
    if os.environ.get("DJANGO_LEADER_CELERY_BEAT_EVERY")
    else {}
)
# celery-redbeat, for bench/celery_handover.py only.
CELERY_REDBEAT_REDIS_URL = CELERY_BROKER_URL
CELERY_REDBEAT_KEY_PREFIX = os.environ.get("DJANGO_LEADER_REDBEAT_PREFIX", "redbeat")
CELERY_REDBEAT_LOCK_TIMEOUT = int(os.environ.get("DJANGO_LEADER_REDBEAT_LOCK_TIMEOUT", "0")) or None
try:
    import django_celery_beat  # noqa: F401
except ImportError:  # the DatabaseScheduler tests skip
    pass
else:
    INSTALLED_APPS.append("django_celery_beat")

# Django's tasks framework (django.tasks from Django 6, else the django-tasks backport) with
# the database backend of django-tasks-db and its worker (manage.py db_worker): the tests
# of django_leader.tasks. Without django-tasks-db they skip.
try:
    import django_tasks_db  # noqa: F401
except ImportError:
    pass
else:
    from importlib.util import find_spec as _find_spec

    if _find_spec("django.tasks") is None:
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
    if os.environ.get("DJANGO_LEADER_TASKS_SCHEDULE"):
        DJANGO_LEADER["TASKS_SCHEDULE"] = json.loads(os.environ["DJANGO_LEADER_TASKS_SCHEDULE"])
