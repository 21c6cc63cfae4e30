"""One Lua script call on one Redis server, the lease operations' hot path.

redis-py's ``Script.__call__`` goes through the client's generic command machinery
(argument encoding one value at a time, response callbacks, retries, metrics): on this
machine it spent about 80 µs of CPU per call, more than the round trip, and a ``lock()``
makes two (docs/benchmarks.md). :func:`call_script` sends the same ``EVALSHA`` on a
connection of the same pool, packed at once, and reads the reply with the connection's
own parser: the same bytes on the wire, the same timeouts (the pool's sockets: see
``client.bounded``), the same errors (the connection disconnects itself on a socket
error, as it does under redis-py's own calls).

A client with one connection of its own (``single_connection_client``) goes through
redis-py as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def call_script(client: Any, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """``script`` (registered on ``client``) on ``keys`` with ``args``: its reply. A server
    that does not know the script (a restart, ``SCRIPT FLUSH``) is given it, and the call
    is sent again, as redis-py does."""
    from redis.exceptions import NoScriptError

    if getattr(client, "connection", None) is not None:
        return script(keys=list(keys), args=list(args), client=client)
    pool = client.connection_pool
    try:
        return _evalsha(pool, script.sha, keys, args)
    except NoScriptError:
        script.sha = client.script_load(script.script)
        return _evalsha(pool, script.sha, keys, args)


def _evalsha(pool: Any, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    with _checked_out(pool) as conn:
        conn.send_packed_command([pack(conn, ("EVALSHA", sha, len(keys), *keys, *args))])
        return conn.read_response()


def call_all(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``commands`` sent to ``client``'s server at once on one connection of its pool (a
    pipeline, no transaction): their replies in order, an error reply as its exception
    (``raise_on_error=False``). A socket error ends the call: the connection drops what
    is left (it disconnects itself)."""
    from redis.exceptions import ResponseError

    if getattr(client, "connection", None) is not None:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))
    replies: list[Any] = []
    with _checked_out(client.connection_pool) as conn:
        conn.send_packed_command([pack(conn, command) for command in commands])
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
    return replies


def pack(conn: Any, parts: Sequence[Any]) -> bytes:
    """``parts`` as one RESP command, encoded as redis-py's encoder of ``conn`` would."""
    encoder = conn.encoder
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, str):
            data = part.encode(encoder.encoding, encoder.encoding_errors)
        elif isinstance(part, bytes):
            data = part
        else:  # numbers (and what redis-py refuses, refused by it)
            data = encoder.encode(part)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@contextmanager
def _checked_out(pool: Any) -> Iterator[Any]:
    """A connection of ``pool``, given back whatever happens (one that failed has
    disconnected itself: it connects again when next used)."""
    conn = pool.get_connection() if _bare_get(pool) else pool.get_connection("EVALSHA")
    try:
        yield conn
    finally:
        pool.release(conn)


def _bare_get(pool: Any) -> bool:
    """Whether ``pool.get_connection`` takes no command name (redis-py 5.3 and later warn
    when given one; 4.x and 5.0 require it), found once per pool class."""
    found = _BARE_GET.get(type(pool))
    if found is None:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
        found = parameter is None or parameter.default is not inspect.Parameter.empty
        _BARE_GET[type(pool)] = found
    return found


_BARE_GET: dict[type, bool] = {}
