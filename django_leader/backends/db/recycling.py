"""Django's own connections in a thread without a request cycle (the beat): one an
error left unusable is closed, so that the next call reconnects, as
``close_if_unusable_or_obsolete`` does between requests (a healthy one is kept)."""

from __future__ import annotations

from contextlib import suppress

from django.db import connections
from django.db.utils import Error as DjangoDBError


def close_if_unusable(alias: str) -> bool:
    """Close this thread's Django connection to ``alias`` if an error left it unusable;
    True if it did. A connection without errors since its last check is not even tested,
    and a working one is kept (unlike ``close_if_unusable_or_obsolete``, which also closes
    connections past ``CONN_MAX_AGE`` — 0 by default, so every time). Never inside a
    transaction: ``atomic`` deals with its own connection."""
    connection = connections[alias]
    if connection.connection is None or connection.in_atomic_block:
        return False
    if connection.get_autocommit() == connection.settings_dict["AUTOCOMMIT"]:
        if not connection.errors_occurred:
            return False
        if connection.is_usable():
            connection.errors_occurred = False
            return False
    with suppress(DjangoDBError):
        connection.close()
    connection.connection = None  # (close() keeps it if closing raised)
    return True


def close_unusable_connections() -> None:
    """:func:`close_if_unusable` for each connection this thread has opened."""
    for connection in connections.all(initialized_only=True):
        close_if_unusable(connection.alias)


def driver_error(alias: str) -> type[Exception]:
    """The DB-API ``Error`` of database ``alias``'s driver (psycopg, MySQLdb, sqlite3): what
    a driver call raises where Django does not wrap it (a cursor closed after a failure)."""
    error: type[Exception] = connections[alias].Database.Error
    return error


def interrupted(error: BaseException, alias: str) -> BaseException | None:
    """What the database error ``error`` hid, if anything: the exception that was on its
    way up when ``error`` was raised in the clean-up after it (a rollback, autocommit set
    back, on a connection left busy), unless that one is a database error too.

    A signal handler that raises (Celery beat's SystemExit, KeyboardInterrupt, RQ's
    StopRequested) may do so in the middle of a driver's call, a COMMIT included; Django's
    ``atomic()`` then sets autocommit back on a connection still busy with it, and that
    error replaces the stop request: retried, or turned into ``BackendUnavailable``, the
    stop was lost. ``alias``: the database ``error`` came from.
    """
    database_errors = (DjangoDBError, driver_error(alias))
    seen: set[int] = set()
    cause = error.__context__
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, database_errors):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None
