"""The ZooKeeper backend's settings and system checks: ``ZOOKEEPER`` validated key by key,
E005 without the ensemble, and the database-tagged check that reaches it (W017 when it
does not answer)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_leader.checks import check_settings, check_zookeeper
from django_leader.conf import get_settings
from tests.support.waiting import wait_until
from tests.support.zookeeper_server import ZooKeeperServer, require_zookeeper_jars

ZK = "django_leader.backends.zookeeper.ZooKeeperBackend"


def configure(settings: Any, **leader: Any) -> None:
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "BACKEND": ZK, **leader}


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


@pytest.mark.parametrize(
    ("zookeeper", "says"),
    [
        ("127.0.0.1:2181", "must be a dict"),
        ({"HOST": "x"}, "unknown key(s) HOST"),
        ({"HOSTS": ""}, "HOSTS'] must be a non-empty"),
        ({"ROOT": "relative"}, "absolute znode path"),
        ({"ROOT": "/"}, "absolute znode path"),
        ({"ROOT": "/a/"}, "absolute znode path"),
        ({"ROOT": "/zookeeper"}, "absolute znode path"),
        ({"SESSION_TIMEOUT": 0}, "SESSION_TIMEOUT'] must be None or a number"),
        ({"CONNECT_TIMEOUT": "3"}, "CONNECT_TIMEOUT'] must be None or a number"),
        ({"AUTH": [("digest",)]}, "(scheme, credential) pairs"),
        ({"ACL": "world"}, "must be None (open), 'creator'"),
        ({"ACL": ["world:anyone:rwx"]}, "perms from 'rwcda'"),
        ({"ACL": "creator"}, "needs AUTH"),
    ],
)
def test_bad_zookeeper_settings_are_refused_naming_the_key(
    settings: Any, zookeeper: Any, says: str
) -> None:
    configure(settings, ZOOKEEPER=zookeeper)
    with pytest.raises(ImproperlyConfigured) as error:
        get_settings()
    assert says in str(error.value)
    assert ids(check_settings()) == ["django_leader.E001"]


def test_good_zookeeper_settings_are_read(settings: Any) -> None:
    configure(
        settings,
        ZOOKEEPER={
            "HOSTS": ["10.0.0.1:2181", "10.0.0.2:2181"],
            "ROOT": "/apps/reports",
            "SESSION_TIMEOUT": 20,
            "AUTH": [("digest", "app:secret")],
            "ACL": ["digest:app:hash:rwcda", "world:anyone:r"],
        },
    )
    zk = get_settings().zookeeper
    assert zk is not None
    assert zk.hosts == "10.0.0.1:2181,10.0.0.2:2181"
    assert (zk.root, zk.session_timeout, zk.auth) == (
        "/apps/reports",
        20.0,
        (("digest", "app:secret"),),
    )
    assert zk.acl == ("digest:app:hash:rwcda", "world:anyone:r")


def test_e005_needs_kazoo(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    configure(settings)
    assert check_settings() == []
    monkeypatch.setitem(sys.modules, "kazoo", None)  # import kazoo -> ImportError
    assert ids(check_settings()) == ["django_leader.E005"]


def test_w017_an_ensemble_that_does_not_answer(settings: Any) -> None:
    # Nothing listens on port 1: the check gives up after CONNECT_TIMEOUT.
    configure(settings, ZOOKEEPER={"HOSTS": "127.0.0.1:1", "CONNECT_TIMEOUT": 0.5})
    started = time.monotonic()
    messages = check_zookeeper(databases=["default"])
    assert ids(messages) == ["django_leader.W017"]
    assert time.monotonic() - started < 5
    # Not a database check run: nothing is reached at all.
    assert check_zookeeper(databases=None) == []


@pytest.fixture
def short_sessions(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A private server that grants sessions of at most 2 s (tick 200 ms x 10)."""
    require_zookeeper_jars()
    with ZooKeeperServer(tmp_path, tick_ms=200, max_session_ticks=10) as server:
        yield server


def test_a_lease_longer_than_the_granted_session_is_persistent_and_expires_by_its_ttl(
    settings: Any, short_sessions: ZooKeeperServer
) -> None:
    """The ensemble grants sessions of at most 2 s: a 1 s lease is ephemeral (the session's
    end frees it, never before its holder's deadline), a 5 s lease is a persistent znode,
    freed by its expiry alone; a renewal never makes an ephemeral lease outlive its
    session."""
    from django_leader.backends.zookeeper import ZooKeeperBackend
    from django_leader.exceptions import NotSupportedError

    configure(settings, LEASE_TTL=5, RENEW_INTERVAL=1)
    store = ZooKeeperBackend(hosts=short_sessions.hosts, root="/sessions")
    store.initialize()
    other = ZooKeeperBackend(hosts=short_sessions.hosts, root="/sessions")
    try:
        short, _ = store.acquire("short", "alice", 1.0)
        long, _ = store.acquire("long", "alice", 5.0)
        assert short is not None and long is not None
        _, short_stat = store.client.get(store._lease_path("short"))
        _, long_stat = store.client.get(store._lease_path("long"))
        assert short_stat.ephemeralOwner == store.client.client_id[0]
        assert long_stat.ephemeralOwner == 0
        with pytest.raises(NotSupportedError, match="frees the lease"):
            store.renew(short, 5.0)
        assert store.renew(long, 5.0) is not None
        # The holder's session ends (a crash): the ephemeral lease goes with it at once,
        # the persistent one stays until its ttl runs out.
        store.shutdown()
        assert other.read("short") is None
        assert other.read("long") is not None
        wait_until(lambda: other.acquire("long", "bob", 5.0)[0], timeout=10)
    finally:
        store.shutdown()
        other.shutdown()
