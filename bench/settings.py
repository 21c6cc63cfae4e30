"""The benchmarks' Django settings: the test project's, with ``DEBUG = False``.

With ``DEBUG = True`` (the test project's) Django keeps every query of every connection in
``connection.queries_log``, a cost on each lease operation that a deployment does not
pay. The bench's processes (``bench/*.py`` and the candidates, workers and holders they
start) run with ``DJANGO_SETTINGS_MODULE=bench.settings``.
"""

from __future__ import annotations

import importlib.util

from testproject.settings import *  # noqa: F403
from testproject.settings import CELERY_BROKER_URL

DEBUG = False

# celery-singleton's task (bench/peer_tasks.py), for the workers of the celery part, where
# the bench's environment has celery-singleton (make bench installs it in .venv-bench).
if importlib.util.find_spec("celery_singleton") is not None:
    CELERY_IMPORTS = ["bench.peer_tasks"]
    CELERY_SINGLETON_BACKEND_URL = CELERY_BROKER_URL
