"""Fixtures of the component tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_leader import Elector
from django_leader.backends import get_backend
from tests.support.electing import WAIT


@pytest.fixture
def store() -> Iterator[Any]:
    """The configured backend, the one the admin uses; its history written and its
    connections closed afterwards. (test_celery has a ``store`` of its own.)"""
    backend = get_backend()
    yield backend
    backend.flush_history(10)
    backend.close()


@pytest.fixture
def electors() -> Iterator[list[Elector]]:
    """The Electors a test started (see tests.support.electing.start), stopped after it."""
    started: list[Elector] = []
    yield started
    for elector in started:
        elector.stop(timeout=WAIT)
