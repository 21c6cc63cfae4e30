"""The SQL that differs between database vendors: what a dialect answers.

A :class:`Dialect` is chosen once per database (``dialects.dialect_for``); the store asks
it, never the vendor's name. Each vendor's answers are in a module of its own
(``postgresql.py``, ``mysql.py``, ``sqlite.py``). Here too: :func:`aware` (a datetime the
database returned, in UTC) and :class:`StoreNow`, the server's clock as a Django query
expression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)

#: Leases renewed by one statement of ``renew_many`` where a dialect bounds it
#: (MySQL/MariaDB, SQLite; PostgreSQL renews any number in one).
BATCH = 1000

#: A lease's key in a batch renewal: (name, holder, token).
Key = tuple[str, str, int]


class Dialect:
    """The SQL fragments and capabilities that differ between vendors."""

    #: ``UPDATE ... RETURNING``.
    returning = True
    #: A write and its history event (or its wake-up) in one statement, committed on its
    #: own (a data-modifying ``WITH``).
    writes_in_one_statement = False
    #: The SQL expression that sends a wake-up on the channel given as its one parameter,
    #: at commit; None: the database cannot push (candidates poll).
    notify: str | None = None
    #: Row locks (``SELECT ... FOR UPDATE``); False: a write locks the whole database.
    locks_rows = True
    #: SQL naming the server a connection talks to, which a failover or a restore changes
    #: (see ``failover.py``); None: not known, failovers go unnoticed.
    server_identity: str | None = None
    #: SQL answering (standbys streaming from this server, whether a commit waits for
    #: one); None: the dialect cannot tell.
    replication: str | None = None

    def now(self) -> str:
        raise NotImplementedError

    def expiry(self) -> str:
        """SQL for *server now + ttl*; takes one parameter, see :meth:`ttl_param`."""
        raise NotImplementedError

    def ttl_param(self, ttl: float) -> Any:
        raise NotImplementedError

    def read_time(self, column: str) -> str:
        """SQL that reads time ``column`` (or expression) as :func:`aware` takes it: as it
        is (naive UTC), or as whole microseconds since the epoch, an integer, where the
        driver would give it in the session's time zone (PostgreSQL: Django's connection
        is in ``TIME_ZONE`` when ``USE_TZ = False``) or parse it slowly."""
        return column

    def read_now(self) -> str:
        """The server's clock in a select list, read as :meth:`read_time` reads a time
        (give the answer to :func:`aware`)."""
        return self.read_time(self.now())

    def time_param(self, connection: Any, value: datetime) -> Any:
        """An aware time as a parameter of a statement on ``connection``, as the columns
        hold times: naive UTC (whatever ``USE_TZ``: Django refuses aware times where it
        is False)."""
        naive = value.astimezone(dt_timezone.utc).replace(tzinfo=None)
        return connection.ops.adapt_datetimefield_value(naive)

    def insert_ignore(self, table: str, columns: str, values: str) -> str:
        raise NotImplementedError

    def upsert(self, table: str, columns: str, values: str, key: str, update: list[str]) -> str:
        """``INSERT``, or on a conflict on the unique ``key`` columns, set the ``update``
        columns to the values that were to be inserted."""
        sets = ", ".join(f"{column} = excluded.{column}" for column in update)
        return (
            f"INSERT INTO {table} ({columns}) VALUES ({values}) "
            f"ON CONFLICT ({key}) DO UPDATE SET {sets}"
        )

    def timeout_options(
        self, options: dict[str, Any], timeout: float, *, startup: bool = True
    ) -> dict[str, Any]:
        """The driver ``options`` of a private connection, bounded by ``timeout`` seconds;
        ``startup``: with the session settings sent at connect (False: behind a pooler,
        which refuses or drops them)."""
        return options

    def clock_seed(self) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the server's clock in microseconds since the epoch:
        the first token of a name when there is no history to continue from."""
        raise NotImplementedError

    def bound_transaction(
        self, cursor: Any, connection: Any, seconds: float, saved: dict[str, Any]
    ) -> None:
        """Have the server end the open transaction of ``connection`` (a Django connection;
        ``cursor``: a DB-API cursor of it), killing the session if it must, should it still
        run a statement, or sit idle, ``seconds`` from now (see :meth:`DatabaseBackend.fenced`).
        ``saved`` is kept across the calls for one transaction: what must be restored after
        it (see :meth:`unbound_transaction`)."""

    def unbound_transaction(self, cursor: Any, saved: dict[str, Any]) -> None:
        """Restore what :meth:`bound_transaction` saved."""

    def startup_refused(self, exc: Exception) -> bool:
        """Whether ``exc`` (at connect) says the server, a pooler, refused the session
        settings of :meth:`timeout_options`."""
        return False

    def session_bounded(self, wrapper: Any, seconds: float) -> bool:
        """Whether the session of ``wrapper`` (connected) has the bounds
        :meth:`timeout_options` asked for (False: a pooler dropped them)."""
        return True

    def watch_commit(self, raw: Any) -> Callable[[], str | None]:
        """Listen on ``raw`` (a DB-API connection) for a commit the server made on the
        primary alone, its wait for a synchronous standby cancelled; the function returned
        tells, after the commit, what the server said (None: nothing of the kind)."""
        return lambda: None

    def cancel_later(self, raw: Any, seconds: float) -> Callable[[], None]:
        """Have what ``raw`` runs cancelled from the client ``seconds`` from now (a commit
        waiting for a synchronous standby, which the server's timeouts do not end); the
        function returned calls it off. The default: nothing."""
        return lambda: None

    def bounded_call(self, wrapper: Any, seconds: float) -> AbstractContextManager[None]:
        """Bound, from the client, the statements the ``with`` block runs on ``wrapper``'s
        connection (already connected) where the server's own timeouts do not reach; raise
        :class:`~django_leader.exceptions.BackendUnavailable` after the block if the
        server reported a write that does not count. The default: nothing."""
        return nullcontext()

    def busy_hint(self, connection: Any) -> str:
        """What to add to the message of a failed lease statement while the caller's own
        Django ``connection`` is as it is (SQLite: this thread's transaction holds the
        database's one write lock)."""
        return ""

    def busy(self, exc: Exception) -> bool:
        """Whether ``exc`` says another connection's write kept the database busy past the
        statement's bound (contention: worth another try), not that it failed."""
        return False

    def missing_file(self, name: str) -> bool:
        """Whether database ``name`` does not exist yet and connecting would create it
        (SQLite's file)."""
        return False

    def batch_size(self, connection: Any) -> int | None:
        """Leases renewed by one statement on ``connection`` (a Django connection); None:
        any number."""
        return BATCH

    def skips_locked(self, cursor: Any) -> bool:
        """Whether a locking read on ``cursor``'s database passes over locked rows."""
        return self.locks_rows and bool(cursor.db.features.has_select_for_update_skip_locked)

    def among(self, values: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL that follows a column to test it is one of ``values``, and its parameters."""
        return f"IN ({', '.join(['%s'] * len(values))})", list(values)

    def renew_rows(
        self, cursor: Any, table: str, select: str, keys: list[Key], ttl: float
    ) -> list[Sequence[Any]]:
        """Renew the unexpired leases ``keys`` of ``table`` (quoted) in one statement (or
        one transaction) by the server's clock, passing over locked rows where the
        database can; their rows as ``select`` gives them."""
        raise NotImplementedError


def aware(value: Any) -> datetime | None:
    """A datetime the database returned, made aware (UTC): MySQL and SQLite columns hold
    naive UTC, SQLite may give a string."""
    if value is None:
        return None
    if isinstance(value, int):  # microseconds since the epoch (see Dialect.read_time)
        return _EPOCH + timedelta(microseconds=value)
    if isinstance(value, str):
        value = parse_datetime(value)
        if value is None:
            return None
    if value.tzinfo is None:  # MySQL and SQLite columns hold naive UTC
        value = value.replace(tzinfo=dt_timezone.utc)
    return value


class StoreNow(Now):
    """The database server's clock as the database backend reads it, as a Django query
    expression (``DatabaseBackend.now_expression()``).

    MySQL's ``CURRENT_TIMESTAMP`` follows the session time zone, while lease columns hold
    naive UTC: use ``UTC_TIMESTAMP(6)`` there.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)
