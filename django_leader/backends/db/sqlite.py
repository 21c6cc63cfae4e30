"""SQLite's SQL for the database backend (3.35+: ``RETURNING``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from .dialect import BATCH, Dialect, Key


class SQLiteDialect(Dialect):
    """SQLite's ``'now'``, ``INSERT OR IGNORE``; one writer at a time, no row locks."""

    locks_rows = False
    # Doubled %: Django's cursor treats the SQL as a format string when it has params.
    _FORMAT = "'%%Y-%%m-%%d %%H:%%M:%%f'"

    def now(self) -> str:
        return f"strftime({self._FORMAT}, 'now')"

    def expiry(self) -> str:
        return f"strftime({self._FORMAT}, 'now', %s)"

    def ttl_param(self, ttl: float) -> Any:
        return f"{ttl:+.3f} seconds"  # signed: a negative one is a time before now

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT OR IGNORE INTO {table} ({columns}) VALUES ({values})"

    def timeout_options(
        self, options: dict[str, Any], timeout: float, *, startup: bool = True
    ) -> dict[str, Any]:
        options = dict(options)
        options["timeout"] = min(float(options.get("timeout", timeout)), timeout)
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        # SQLite's clock is this machine's (SQLite runs in this process), and its own
        # 'now' has only millisecond resolution: this process's clock, in microseconds.
        return "%s", [time.time_ns() // 1000]

    def busy_hint(self, connection: Any) -> str:
        if not connection.in_atomic_block:
            return ""
        return (
            " (SQLite allows one writer: this thread's own transaction.atomic() on "
            "the same database holds the lock a lease operation needs; take the "
            "lease outside the transaction, or use PostgreSQL/MySQL)"
        )

    def busy(self, exc: Exception) -> bool:
        # SQLITE_BUSY after the busy timeout: another connection holds the write lock.
        return "database is locked" in str(exc)

    def missing_file(self, name: str) -> bool:
        in_memory = name in ("", ":memory:") or "mode=memory" in name
        return not in_memory and not name.startswith("file:") and not os.path.exists(name)

    def batch_size(self, connection: Any) -> int | None:
        # Four parameters a lease, one for the ttl.
        limit = connection.features.max_query_params
        return max(1, min(BATCH, (limit - 1) // 4))

    def renew_rows(
        self, cursor: Any, table: str, select: str, keys: list[Key], ttl: float
    ) -> list[Sequence[Any]]:
        # No row locks (a write locks the whole database): nothing to pass over.
        sql = (
            f"UPDATE {table} SET renewed_at = {self.now()}, expires_at = {self.expiry()} "
            f"WHERE name IN ({', '.join(['%s'] * len(keys))}) "
            f"AND (name, holder, token) IN (VALUES {', '.join(['(%s, %s, %s)'] * len(keys))}) "
            f"AND expires_at > {self.now()} RETURNING {select}"
        )
        names = [key[0] for key in keys]
        cursor.execute(sql, [self.ttl_param(ttl), *names, *(v for key in keys for v in key)])
        rows: list[Sequence[Any]] = cursor.fetchall()  # drain: SQLite completes it only then
        return rows
