"""A client-side bound on a database connection for the time of one fenced transaction.

The server ends a fenced transaction that runs past its lease (``statement_timeout``,
``max_statement_time``, …), but a client whose network is cut never hears of it: a
statement already sent waits for a reply that cannot come, as long as TCP retransmits
(minutes). :class:`SocketBound` sets the kernel's bounds on the connection's own socket
for the transaction — keepalive probes every second, and ``TCP_USER_TIMEOUT``, the time
sent data or probes may go unanswered before the kernel drops the connection — then puts
back what the socket had, so the caller's other queries on that connection are not
touched. The driver then fails the statement with its "connection timed out" error.

PostgreSQL's drivers (psycopg 3, psycopg2) and mysqlclient give the socket with
``fileno()``; a connection that has none (SQLite, another driver) or is not TCP (a Unix
socket: nothing on it can be cut) is left as it is. Linux only (``TCP_USER_TIMEOUT``);
elsewhere this does nothing.
"""

from __future__ import annotations

import math
import os
import socket
from contextlib import suppress
from typing import Any

#: The kernel options set, and the level each is at.
_OPTIONS: dict[str, int] = {
    "SO_KEEPALIVE": socket.SOL_SOCKET,
    "TCP_KEEPIDLE": socket.IPPROTO_TCP,
    "TCP_KEEPINTVL": socket.IPPROTO_TCP,
    "TCP_KEEPCNT": socket.IPPROTO_TCP,
    "TCP_USER_TIMEOUT": socket.IPPROTO_TCP,
}
#: Seconds of silence before the first keepalive probe, and between probes.
PROBE = 1


def _socket_of(raw_connection: Any) -> socket.socket | None:
    """A duplicate of the TCP socket under a DB-API connection, or None."""
    if not hasattr(socket, "TCP_USER_TIMEOUT") or not hasattr(socket, "TCP_KEEPIDLE"):
        return None
    try:
        fd = raw_connection.fileno()
    except Exception:  # no fileno(), or a closed connection
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.close()
        return None
    return sock


class SocketBound:
    """The kernel's bounds on one connection's socket, set by :meth:`set` and put back by
    :meth:`restore` (each a no-op where there is no TCP socket to bound)."""

    def __init__(self, raw_connection: Any) -> None:
        self._sock = _socket_of(raw_connection)
        self._saved: dict[str, int] = {}
        if self._sock is not None:
            try:
                for name, level in _OPTIONS.items():
                    self._saved[name] = self._sock.getsockopt(level, getattr(socket, name))
            except OSError:
                self._close()

    def set(self, seconds: float) -> None:
        """Have the kernel drop the connection once sent data or a keepalive probe has gone
        unanswered for ``seconds`` (at least one probe interval)."""
        if self._sock is None:
            return
        ms = max(1000 * PROBE, math.ceil(seconds * 1000))
        values = {
            "SO_KEEPALIVE": 1,
            "TCP_KEEPIDLE": PROBE,
            "TCP_KEEPINTVL": PROBE,
            "TCP_KEEPCNT": max(1, math.ceil(seconds / PROBE)),
            "TCP_USER_TIMEOUT": ms,
        }
        with suppress(OSError):
            for name, value in values.items():
                self._sock.setsockopt(_OPTIONS[name], getattr(socket, name), value)

    def restore(self) -> None:
        """Put back what the socket had (if the connection is still open), and let go."""
        if self._sock is None:
            return
        with suppress(OSError):
            for name, value in self._saved.items():
                self._sock.setsockopt(_OPTIONS[name], getattr(socket, name), value)
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the duplicate only: the driver's socket stays open
            self._sock = None
