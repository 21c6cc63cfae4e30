"""Private redis-server processes of the tests and of the chaos run."""

from __future__ import annotations

import socket


def answers_ping(port: int) -> bool:
    """True if a Redis server on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False
