"""Sphinx configuration of the django-leader documentation.

Build with ``make docs`` (``sphinx-build -W --keep-going -b html docs docs/_build/html``):
every warning is an error. The pages are Markdown (MyST); the API reference is autodoc,
which imports django_leader inside the test project with no database servers looked up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports django_leader, whose models need a configured Django. The test project
# does; DJANGO_LEADER_EXTRA_DATABASES=0 keeps it from probing PostgreSQL, MariaDB and
# Redis, so the build needs no service (and reads no database: nothing is queried).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ["DJANGO_LEADER_EXTRA_DATABASES"] = "0"

import django  # noqa: E402

django.setup()

import django_leader  # noqa: E402

# -- project ---------------------------------------------------------------------------
project = "django-leader"
author = "django-leader contributors"
copyright = "django-leader contributors"
release = django_leader.__version__
version = ".".join(release.split(".")[:2])

# -- general ---------------------------------------------------------------------------
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
language = "en"

# Cross-references that do not resolve are errors (with -W): keep the reference exact.
nitpicky = True
nitpick_ignore = [
    # Type hints name these, and neither Django, Celery, APScheduler, huey nor RQ publishes an
    # inventory that resolves them under these paths.
    ("py:class", "django.http.request.HttpRequest"),
    ("py:class", "django.http.response.HttpResponse"),
    ("py:class", "celery.beat.Scheduler"),
    ("py:class", "apscheduler.schedulers.base.BaseScheduler"),
    ("py:class", "huey.api.Huey"),
    ("py:class", "rq.cron.CronScheduler"),
    # Type aliases and type variables of django_leader's own annotations.
    ("py:class", "Callback"),
    ("py:class", "Work"),
    ("py:class", "Observer"),
    ("py:class", "F"),
    ("py:class", "T"),
    ("py:class", "django_leader.celery.tasks.F"),
    ("py:class", "django_leader.lease.T"),
    ("py:class", "django_leader.lease.HistoryEvent"),  # the history writer's rows, internal
    ("py:class", "django_leader.leading.CampaignThread"),
    ("py:class", "django_leader.tasks.singleton.F"),
    ("py:class", "AsyncWork"),
    ("py:class", "AsyncCallback"),
    ("py:class", "django_leader.session.T"),
    # The session's renewers: documented with the session, not as a class of their own.
    ("py:class", "Renewer"),
    ("py:class", "django_leader.session.Renewer"),
    ("py:class", "django_leader.renewal_batch.Renewer"),
    ("py:class", "CheckMessage"),  # django.core.checks, in check_configuration's signature
    # The stores' own classes in return annotations of the backends' methods: internal,
    # documented by the contract they implement (Backend.slots, Backend.now_expression).
    ("py:class", "DatabaseSlots"),
    ("py:class", "RedisSlots"),
    ("py:class", "ZooKeeperSlots"),
    ("py:class", "django_leader.backends.db.dialect.StoreNow"),
    ("py:class", "django_leader.backends.db.slots.DatabaseSlots"),
    ("py:class", "django_leader.backends.redis.slots.RedisSlots"),
    ("py:class", "django_leader.backends.zookeeper.slots.ZooKeeperSlots"),
    # The parts a store package's backend class is made of (internal modules; the backend
    # is documented by the contract it implements).
    ("py:class", "django_leader.backends.redis.leases.RedisLeases"),
    ("py:class", "django_leader.backends.redis.batch.BatchRenewal"),
    ("py:class", "django_leader.backends.redis.registry.Registry"),
    ("py:class", "django_leader.backends.redis.listen.WakeUps"),
    ("py:class", "django_leader.backends.zookeeper.candidates.Candidacies"),
    ("py:class", "django_leader.backends.zookeeper.renewal.BatchRenewal"),
    ("py:class", "django_leader.backends.zookeeper.retention.Retention"),
    ("py:class", "Backend"),  # a forward reference in django_leader.backends.resolve
    # The history mixin of the Redis and ZooKeeper backends (internal), and the contract's
    # ``record`` that their inherited acquire() docstring names (defined by that mixin).
    ("py:class", "django_leader.backends.history.WrittenAfterwards"),
    ("py:meth", "record"),
    # Inherited docstrings of the ZooKeeper backend's parts name their siblings' methods.
    ("py:meth", "renew"),
    ("py:meth", "acquire"),
]
# The standard library's types in signatures: without intersphinx (the build reads
# nothing from the network) there is no inventory to link them to.
nitpick_ignore_regex = [
    (
        "py:class",
        r"(collections\.abc|concurrent\.futures|contextlib|datetime|threading|types|typing)\..*",
    ),
    ("py:class", r"datetime"),
    # A dataclass field's ``tuple[Any, ...]``, split by autodoc at the comma.
    ("py:class", r"tuple\[~typing\.Any"),
]

# -- MyST ------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
# Anchors for the pages' "page.md#a-heading" links, as GitHub makes them.
myst_heading_anchors = 4

# -- autodoc ---------------------------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autoclass_content = "class"


# -- HTML ------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"django-leader {release}"
html_static_path: list[str] = []
