"""The test project's Celery app: ``celery -A testproject worker`` / ``celery -A testproject beat``.

Configured from Django settings (``CELERY_*``, see the Celery block at the end of
``testproject/settings.py``). Tasks are in ``testproject/demoapp/tasks.py``.

Workers and beats started by the test suite use its test databases through
``DJANGO_LEADER_TEST_DB_NAMES``, which ``testproject/settings.py`` reads.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
