"""Reading a ZooKeeper lease writes nothing (the health views promise it): not the clock
znode, not a record, not the root, even from a process whose client is new."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.stores import forget_zookeeper_root, require_zookeeper, zookeeper_backend


@pytest.fixture
def root() -> Iterator[str]:
    path = f"/dl-reads-{uuid.uuid4().hex[:12]}"
    yield path
    forget_zookeeper_root(path)


def tree(client: Any, path: str) -> dict[str, tuple[int, int, int]]:
    """Every znode under ``path`` with what a write to it or under it changes."""
    _, stat = client.get(path)
    found = {path: (stat.mzxid, stat.version, stat.cversion)}
    for child in client.get_children(path):
        found.update(tree(client, f"{path}/{child}"))
    return found


def test_reading_a_lease_from_a_new_client_writes_nothing(root: str) -> None:
    """A process that only reads (a health probe): no ``initialize()``, a new client."""
    pytest.importorskip("kazoo")
    from django_leader.backends.zookeeper import ZooKeeperBackend

    writer = zookeeper_backend(root=root)
    reader = zookeeper_backend(root=root)
    try:
        lease, _ = writer.acquire("held", "alice", 30)
        assert lease is not None
        writer.release(writer.acquire("released", "bob", 30)[0])
        before = tree(writer.client, root)
        fresh = ZooKeeperBackend(hosts=require_zookeeper()["HOSTS"], root=root)
        try:
            assert fresh.read("held").holder == "alice"
            assert fresh.read("released") is None and fresh.read("never-used") is None
            assert "held" in fresh.names()
        finally:
            fresh.shutdown()
        assert reader.read("held").holder == "alice"
        assert tree(writer.client, root) == before
    finally:
        reader.shutdown()
        writer.shutdown()
