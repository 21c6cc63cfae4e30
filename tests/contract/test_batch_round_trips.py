"""What one ``renew_many`` of thousands of leases costs the store, counted in round trips:
a handful on PostgreSQL and Redis, whatever the number of leases (issue 14: one renewal
loop for every lease a process holds); and a lease of the batch whose row is locked holds
up none of the others."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_leader.lease import Lease
from tests.support.stores import CACHE_STORES, open_store, stores_db

pytestmark = stores_db

#: Leases in the batch: more than one statement or script of a chunked store takes.
LEASES = 2500
#: Round trips a batch may cost: one on each store when every lease is renewed; one more
#: on PostgreSQL when some are refused (it asks which of them were locked).
MOST = 3


def acquired(backend: Any, name: str) -> list[Lease]:
    leases = [backend.acquire(f"{name}-{i:05d}", "alice", 30)[0] for i in range(LEASES)]
    assert None not in leases
    return leases


@pytest.fixture
def postgresql() -> Iterator[Any]:
    yield from open_store("postgresql")


@pytest.fixture(params=list(CACHE_STORES))
def redis_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_store(request.param)


def test_postgresql_renews_a_batch_in_one_statement(postgresql: Any, lease_name: str) -> None:
    leases = acquired(postgresql, lease_name)
    stale = Lease(lease_name + "-00001", "alice", leases[1].token + 1, None, None, None, 0)
    wrapper = postgresql._connection()  # this thread's private connection
    statements: list[str] = []

    def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        statements.append(sql)
        return execute(sql, *args)

    with wrapper.execute_wrapper(count):
        renewed = postgresql.renew_many(leases, 30)
        assert len(statements) == 1, statements  # in autocommit: no BEGIN, no COMMIT
        assert wrapper.get_autocommit()
        assert None not in renewed
        statements.clear()
        # One lease refused: it still costs one statement more, not one per lease.
        refused = postgresql.renew_many([*leases, stale], 30)
        assert refused[-1] is None and None not in refused[:-1]
        assert len(statements) <= MOST, statements


def test_redis_renews_a_batch_in_one_round_trip(
    redis_store: Any, lease_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    leases = acquired(redis_store, lease_name)
    pool = redis_store.client.connection_pool
    ours: set[int] = set()
    sent: list[int] = []
    get_connection = pool.get_connection
    send = redis.connection.AbstractConnection.send_packed_command

    def counted_get_connection(*args: Any, **kwargs: Any) -> Any:
        connection = get_connection(*args, **kwargs)
        ours.add(id(connection))
        return connection

    def counted_send(connection: Any, *args: Any, **kwargs: Any) -> Any:
        if id(connection) in ours:
            sent.append(id(connection))
        return send(connection, *args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted_get_connection)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted_send)
    renewed = redis_store.renew_many(leases, 30)
    assert None not in renewed
    assert len(sent) == 1, sent
    # A server that forgot the script (SCRIPT FLUSH, a restart): loaded again, once.
    sent.clear()
    redis_store._renew_many.sha = "0" * 40  # a script the server does not know
    renewed = redis_store.renew_many(leases, 30)
    assert None not in renewed
    assert len(sent) <= MOST, sent


def test_redis_refuses_a_batch_reply_that_answers_for_other_leases(
    redis_store: Any, lease_name: str
) -> None:
    """The renewal script answers a batch as one string of records, one line per lease:
    a reply with one line too few or too many is an unavailable store, never a lease
    matched to another's record."""
    from django_leader.exceptions import BackendUnavailable

    leases = [redis_store.acquire(f"{lease_name}-{i}", "alice", 30)[0] for i in range(3)]
    chunk = [(lease.name, lease.holder, lease.token) for lease in leases]
    record = "1700000000000000\t1\t0"
    reply = ["1700000000000000", "1700000030000000", "\n".join([record] * 3), []]
    assert [le.name for le in redis_store._renewals(chunk, reply)] == [n for n, _, _ in chunk]
    for lines in (2, 4):
        bad = [*reply[:2], "\n".join([record] * lines), []]
        with pytest.raises(BackendUnavailable, match=f"answered {lines} leases of 3"):
            redis_store._renewals(chunk, bad)
