"""The fence row's table, named by the store contract's side without importing the model."""

from __future__ import annotations

from django_leader.backends.fence_row import FENCE_TABLE
from django_leader.models import LeaseFence


def test_the_fence_table_is_the_models_table() -> None:
    assert LeaseFence._meta.db_table == FENCE_TABLE
