"""Issue 28, item 3: the first lock on a ZooKeeper ``ROOT`` never used for leases waited
out the whole lock-delay (16.9 s measured), as a wiped one must: without the store marker,
the store cannot tell new from forgotten. ``manage.py leader init`` (and the ``migrate``
that creates django-leader's tables) marks a new root; a root wiped afterwards still waits."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from tests.support.stores import forget_zookeeper_root, require_zookeeper
from tests.support.waiting import wait_until

#: A ttl, so a lock-delay, far longer than the test: only the marker lets a grant through.
LONG_TTL = 120.0
TTL = 2.0


@pytest.fixture
def new_root(settings: Any) -> Iterator[str]:
    pytest.importorskip("kazoo")
    conf = require_zookeeper()
    root = f"/dl-new-{uuid.uuid4().hex[:12]}"
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.zookeeper.ZooKeeperBackend",
        "ZOOKEEPER": {"HOSTS": conf["HOSTS"], "ROOT": root},
        "LOCK_DELAY": 0,  # the lock-delay is the acquirer's ttl
    }
    yield root
    forget_zookeeper_root(root)


def init() -> str:
    out = StringIO()
    call_command("leader", "init", stdout=out)
    return out.getvalue().strip()


def test_a_new_root_marked_by_leader_init_is_used_at_once_and_a_wiped_one_still_waits(
    new_root: str,
) -> None:
    from django_leader.backends import get_backend

    backend: Any = get_backend()
    try:
        assert init() == "wrote the store marker: the first lock will not wait"
        assert init() == "the store marker was there already: nothing to do"
        held, _ = backend.acquire("job", "alice", LONG_TTL)
        assert held is not None
        assert backend.release(held)

        backend.client.delete(new_root, recursive=True)  # wiped: the marker went too
        assert backend.acquire("job", "bob", TTL) == (None, None)  # the lock-delay

        def taken() -> Any:
            return backend.acquire("job", "bob", TTL)[0]

        after = wait_until(taken, timeout=TTL + 10, message="never free after the wipe")
        assert after.token > held.token
    finally:
        backend.shutdown()


def test_without_the_marker_a_new_root_waits_and_says_how_to_skip_that(
    new_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    from django_leader.backends import get_backend

    backend = get_backend()
    try:
        assert backend.acquire("job", "alice", LONG_TTL) == (None, None)
        assert "never used for leases" in caplog.text
        assert "manage.py leader init" in caplog.text
    finally:
        backend.shutdown()
