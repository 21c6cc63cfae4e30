"""The private ZooKeeper servers of tests/support/zookeeper_server.py do what the ZooKeeper
backend's fault tests will rely on, checked with kazoo alone (no django_leader code): an
ensemble elects a leader, stays writable without a follower, elects a new leader when its
leader is killed and keeps what was written; a standalone server keeps its data across a
restart and a crash, forgets it when wiped, and does not answer while paused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_until
from tests.support.zookeeper_server import ZooKeeperEnsemble, ZooKeeperServer, skip_without_kazoo

skip_without_kazoo()
from kazoo.client import KazooClient  # noqa: E402
from kazoo.exceptions import ConnectionLoss, SessionExpiredError  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.topology]

WAIT = 30.0
PATH = "/harness/znode"


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    with ZooKeeperEnsemble(tmp_path) as started:
        yield started


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path) as started:
        yield started


@pytest.fixture
def client_of() -> Iterator[Any]:
    """``client_of(hosts)``: a started kazoo client, stopped and closed after the test."""
    clients = []

    def connect(hosts: str) -> Any:
        # kazoo's default reconnection backs off up to 60 s between tries: a few refused
        # connections while a server restarts would make it late by seconds.
        client = KazooClient(
            hosts=hosts,
            timeout=10.0,
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5},
        )
        client.start(timeout=WAIT)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.stop()
        client.close()


def written(client: Any, value: bytes) -> bool:
    """Write ``value`` to PATH; False while the client has no server that can commit it
    (it reconnects on its own after the server it used died)."""
    try:
        if client.exists(PATH) is None:
            client.create(PATH, value, makepath=True)
        else:
            client.set(PATH, value)
    except (ConnectionLoss, SessionExpiredError):
        return False
    return True


def read(client: Any) -> bytes | None:
    try:
        return bytes(client.get(PATH)[0])
    except (ConnectionLoss, SessionExpiredError):
        return None


def test_an_ensemble_survives_a_follower_and_then_its_leader(
    ensemble: ZooKeeperEnsemble, client_of: Any
) -> None:
    leader = ensemble.leader()
    assert sorted(map(str, ensemble.modes())) == ["follower", "follower", "leader"]
    assert ensemble.modes()[leader] == "leader"
    client = client_of(ensemble.hosts)
    assert written(client, b"first")

    follower = ensemble.followers()[0]
    ensemble.kill(follower)
    assert ensemble.leader() == leader
    wait_until(lambda: written(client, b"second"), timeout=WAIT, message="no write without")
    assert ensemble.modes()[follower] is None

    ensemble.start(follower)
    assert ensemble.modes()[follower] == "follower"
    ensemble.kill(leader)
    new_leader = ensemble.leader()
    assert new_leader != leader
    assert sorted(map(str, ensemble.modes())) == ["None", "follower", "leader"]
    # What was committed before the leader died is on the new leader, and it commits.
    assert wait_until(lambda: read(client), timeout=WAIT, message="no read") == b"second"
    wait_until(lambda: written(client, b"third"), timeout=WAIT, message="no write after")
    # Each surviving node, asked alone, has the last write.
    for index in (new_leader, follower):
        assert read(client_of(ensemble.node_hosts(index))) == b"third"


def test_a_standalone_server_keeps_its_data_until_wiped(
    server: ZooKeeperServer, client_of: Any
) -> None:
    client = client_of(server.hosts)
    assert written(client, b"kept")

    server.restart()
    assert wait_until(lambda: read(client), timeout=WAIT, message="no read after restart") == (
        b"kept"
    )
    server.kill()
    assert not server.running
    server.start()
    assert wait_until(lambda: read(client), timeout=WAIT, message="no read after kill") == b"kept"

    server.pause()
    # A frozen server accepts TCP connections (the kernel does) but answers nothing.
    assert server.node.mode() is None
    server.resume()
    wait_until(lambda: server.node.mode() == "standalone", timeout=WAIT, message="not back")

    server.stop()
    server.wipe()
    server.start()
    fresh = client_of(server.hosts)
    assert fresh.exists(PATH) is None
