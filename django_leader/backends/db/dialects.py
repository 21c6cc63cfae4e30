"""The dialect of a Django database: chosen once, by its vendor."""

from __future__ import annotations

from django.db import connections

from .dialect import Dialect
from .mysql import MySQLDialect
from .postgresql import PostgreSQLDialect
from .sqlite import SQLiteDialect

DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": PostgreSQLDialect,
    "mysql": MySQLDialect,
    "sqlite": SQLiteDialect,
}


def dialect_for(alias: str) -> Dialect:
    """The dialect of database ``alias``.

    :raises NotImplementedError: for a vendor other than SQLite, PostgreSQL, MySQL/MariaDB.
    """
    vendor = connections[alias].vendor
    if vendor not in DIALECTS:
        raise NotImplementedError(f"django_leader has no SQL for database vendor {vendor!r}")
    return DIALECTS[vendor]()
