"""Shared fixtures: one ``backend`` fixture parametrized over every lease store (the
stores and the helpers are in ``tests/support/stores.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from testproject.services import UNAVAILABLE
from tests.support.stores import (
    CACHE_STORES,
    DATABASE_STORES,
    OTHER_STORES,
    open_store,
    require,
)


def pytest_report_header(config: Any) -> list[str]:
    stores = sorted(settings.DATABASES) + sorted(set(settings.CACHES) & set(CACHE_STORES.values()))
    lines = [f"django_leader stores: {', '.join(stores)}"]
    lines += [f"unavailable: {reason}" for reason in UNAVAILABLE.values()]
    return lines


@pytest.fixture(autouse=True)
def _end_sessions() -> Iterator[None]:
    """End every renewal session after each test: their threads and store connections
    would otherwise outlive the backends the test made (until idle for 30 s)."""
    yield
    from django_leader import session

    session.close_all(timeout=5)


@pytest.fixture(params=list(DATABASE_STORES))
def db_alias(request: pytest.FixtureRequest) -> str:
    """The alias of each database under test (the test DB is set up by the django_db mark)."""
    alias = DATABASE_STORES[request.param]
    require(alias)
    return alias


@pytest.fixture(params=[*DATABASE_STORES, *CACHE_STORES, *OTHER_STORES])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A backend of each store: every database, Redis through both cache clients, and
    ZooKeeper."""
    yield from open_store(request.param)


@pytest.fixture
def db_backend(db_alias: str) -> Iterator[Any]:
    """A database backend of each database (for what only a database can do: fenced())."""
    from django_leader.backends.db import DatabaseBackend

    store = DatabaseBackend(db_alias)
    yield store
    store.close()


@pytest.fixture
def lease_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"
