"""Paginating a history of millions of rows without counting every one of them.

The planner's row estimate stands in for ``COUNT(*)`` when it is large; reading it is
vendor-specific SQL (``EXPLAIN`` on PostgreSQL, ``information_schema`` on MySQL/MariaDB).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

from .constants import COUNT_ESTIMATE_ABOVE


def estimated_rows(rows: QuerySet[Any]) -> int | None:
    """The planner's estimate of how many rows ``rows`` has, or None if it gives none.

    PostgreSQL: the row estimate of the query's plan (any filters). MySQL/MariaDB: the
    table's row estimate, for an unfiltered query only. Others: None.
    """
    connection = connections[rows.db]
    if connection.vendor == "postgresql":
        # Compiled for this database (sql_with_params() compiles for the default one).
        sql, params = rows.order_by().query.get_compiler(rows.db).as_sql()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            raw = cursor.fetchone()[0]
        plan = json.loads(raw) if isinstance(raw, str) else raw
        estimate = plan[0]["Plan"]["Plan Rows"]
    elif connection.vendor == "mysql" and not rows.query.where:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [rows.model._meta.db_table],
            )
            row = cursor.fetchone()
        estimate = row[0] if row else None
    else:
        return None
    return int(estimate) if estimate else None


class HistoryPaginator(Paginator):
    """Counts the rows of the list, unless the planner estimates more than
    :attr:`estimate_above` of them: then the estimate stands in for a ``COUNT(*)`` that
    would read every one of them (the unfiltered list of a big history, a filter on
    ``kind`` alone)."""

    estimate_above = COUNT_ESTIMATE_ABOVE

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        estimate = estimated_rows(rows)
        if estimate is not None and estimate > self.estimate_above:
            return estimate
        return rows.count()
