"""MySQL's and MariaDB's SQL for the database backend (mysqlclient)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import suppress
from datetime import timedelta
from typing import Any

from django.db.utils import Error as DjangoDBError

from .dialect import Dialect, Key

#: MySQL's and MariaDB's error numbers of contention: ER_LOCK_WAIT_TIMEOUT (a lock wait
#: that ran out) and ER_LOCK_DEADLOCK.
CONTENDED = (1205, 1213)


class MySQLDialect(Dialect):
    """``UTC_TIMESTAMP(6)``, ``INSERT IGNORE``; no ``RETURNING``."""

    returning = False

    def now(self) -> str:
        return "UTC_TIMESTAMP(6)"

    def expiry(self) -> str:
        return "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND)"

    def ttl_param(self, ttl: float) -> Any:
        return round(ttl * 1_000_000)

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        return f"INSERT IGNORE INTO {table} ({columns}) VALUES ({values})"

    def upsert(self, table: str, columns: str, values: str, key: str, update: list[str]) -> str:
        sets = ", ".join(f"{column} = VALUES({column})" for column in update)
        return f"INSERT INTO {table} ({columns}) VALUES ({values}) ON DUPLICATE KEY UPDATE {sets}"

    def timeout_options(
        self, options: dict[str, Any], timeout: float, *, startup: bool = True
    ) -> dict[str, Any]:
        options = dict(options)
        seconds = max(1, math.ceil(timeout))  # the drivers take whole seconds, at least 1
        options.setdefault("connect_timeout", seconds)
        # libmysqlclient tries a timed-out read three times in all, so its effective bound
        # is three times the option; MariaDB Connector/C (client version 3.x) gives up after
        # one. Either way no less than 1 s per try.
        tries = 1 if _mariadb_client() else 3
        # A lease statement waiting on a row lock gives up on the server too, not only in
        # the client (InnoDB's default wait is 50 s), a second before the client would: the
        # server's "Lock wait timeout exceeded" says the row is busy (StoreBusy, waited out
        # by a blocking lock()), where a client's timeout could only say it did not answer.
        lock_wait = max(1, seconds - 1)
        read = max(1, math.ceil(timeout / tries), math.ceil((lock_wait + 1) / tries))
        options.setdefault("read_timeout", read)
        options.setdefault("write_timeout", seconds)
        # A transaction of a lease statement (MySQL's renewal locks the rows, then updates
        # them, then commits) whose client was cut off or frozen half-way must not keep the
        # rows locked until the server's TCP notices: MariaDB aborts a transaction idle for
        # idle_transaction_timeout (an executable comment: MySQL has no such variable and
        # skips it; there, see docs/safety.md).
        options.setdefault(
            "init_command",
            f"SET SESSION innodb_lock_wait_timeout = {lock_wait}"
            f" /*M!100300 , SESSION idle_transaction_timeout = {seconds} */",
        )
        return options

    def busy(self, exc: Exception) -> bool:
        # The lease row locked by its holder's fenced() (or another's statement) past
        # innodb_lock_wait_timeout, or a deadlock (InnoDB rolled the whole transaction
        # back: trying again is safe).
        return bool(exc.args) and exc.args[0] in CONTENDED

    def clock_seed(self) -> tuple[str, list[Any]]:
        # NOW(6) and UNIX_TIMESTAMP() both use the session time zone, which cancels out.
        return "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)", []

    def bound_transaction(
        self, cursor: Any, connection: Any, seconds: float, saved: dict[str, Any]
    ) -> None:
        # Session variables (there is no SET LOCAL): saved once, restored by
        # unbound_transaction(). MariaDB checks idle_transaction_timeout (and MySQL
        # wait_timeout) before reading each command, so a change applies to the open
        # transaction; these take whole seconds (max_statement_time takes fractions).
        if connection.mysql_is_mariadb:
            names = ["idle_transaction_timeout", "max_statement_time", "innodb_lock_wait_timeout"]
        else:
            names = ["wait_timeout", "innodb_lock_wait_timeout"]
        if not saved:
            cursor.execute("SELECT " + ", ".join(f"@@SESSION.{name}" for name in names))
            saved.update(zip(names, cursor.fetchone(), strict=True))
        whole = max(1, math.ceil(seconds))
        values = {name: whole for name in names}
        if "max_statement_time" in values:
            values["max_statement_time"] = round(seconds, 3)  # type: ignore[assignment]
        cursor.execute(
            "SET " + ", ".join(f"SESSION {name} = %s" for name in names),
            [values[name] for name in names],
        )

    def unbound_transaction(self, cursor: Any, saved: dict[str, Any]) -> None:
        if saved:
            cursor.execute(
                "SET " + ", ".join(f"SESSION {name} = %s" for name in saved), list(saved.values())
            )

    def renew_rows(
        self, cursor: Any, table: str, select: str, keys: list[Key], ttl: float
    ) -> list[Sequence[Any]]:
        """No ``UPDATE ... RETURNING``: lock the rows that meet the condition (by the
        server's clock, read in the same statement), then set them from that reading, in
        one transaction."""
        lock = "FOR UPDATE"
        if self.skips_locked(cursor):
            lock += " SKIP LOCKED"
        wrapper = cursor.db
        wrapper.set_autocommit(False)
        try:
            cursor.execute(
                f"SELECT {select}, {self.now()} FROM {table} "
                f"WHERE name IN ({', '.join(['%s'] * len(keys))}) "
                f"AND (name, holder, token) IN ({', '.join(['(%s, %s, %s)'] * len(keys))}) "
                f"AND expires_at > {self.now()} {lock}",
                [*(key[0] for key in keys), *(v for key in keys for v in key)],
            )
            locked = cursor.fetchall()
            rows: list[Sequence[Any]] = []
            if locked:
                now = locked[0][-1]
                expires = now + timedelta(microseconds=self.ttl_param(ttl))
                cursor.execute(
                    f"UPDATE {table} SET renewed_at = %s, expires_at = %s "
                    f"WHERE name IN ({', '.join(['%s'] * len(locked))})",
                    [now, expires, *(row[0] for row in locked)],
                )
                rows = [(*row[:6], now, expires, row[8]) for row in locked]
            wrapper.commit()
        except BaseException:
            with suppress(DjangoDBError):
                wrapper.rollback()
            raise
        finally:
            if wrapper.connection is not None:
                wrapper.set_autocommit(True)
        return rows


def _mariadb_client() -> bool:
    """Whether mysqlclient is built on MariaDB Connector/C (client version 3.x), whose
    read_timeout is not tried three times as libmysqlclient's (5.x, 8.x, 9.x) is."""
    try:
        from MySQLdb import _mysql
    except ImportError:  # pragma: no cover - another MySQL driver
        return False
    try:
        return int(_mysql.get_client_info().split(".")[0]) < 5
    except (AttributeError, ValueError):  # pragma: no cover
        return False
