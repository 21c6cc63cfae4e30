"""A real Redis restart without persistence: a private ``redis-server`` is killed and
started again on the same port, so the store forgets every lease and token counter.

The shared Redis of the other tests is left alone: restarting it would pull the leases and
the Celery broker from under anything else using it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leader import BackendUnavailable, Elector
from tests.conftest import REQUIRE_SERVICES, answered, history, stores_db

pytestmark = stores_db

CLIENTS = {
    "redis": "django.core.cache.backends.redis.RedisCache",
    "django_redis": "django_redis.cache.RedisCache",
}
WAIT = 15.0


class RedisServer:
    """``redis-server`` on a free port, keeping nothing on disk, as the machine's Redis."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            reason = "redis-server is not installed"
            if REQUIRE_SERVICES:
                pytest.fail(f"required service missing: {reason}")
            pytest.skip(reason)
        self.binary = binary
        self.workdir = workdir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        give_up = time.monotonic() + WAIT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert time.monotonic() < give_up, "redis-server did not start"
            time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL: what a crash or an OOM kill does; nothing is saved."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.crash()


@pytest.fixture(params=list(CLIENTS))
def restartable(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Any
) -> Iterator[tuple[RedisServer, Any]]:
    """A private Redis server and a CacheBackend on it (through each cache client)."""
    pytest.importorskip("redis")
    if request.param == "django_redis":
        pytest.importorskip("django_redis")
    server = RedisServer(tmp_path)
    server.start()
    caches = {
        **settings.CACHES,
        "restartable": {
            "BACKEND": CLIENTS[request.param],
            "LOCATION": f"redis://127.0.0.1:{server.port}/0",
        },
    }
    conf = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.cache.CacheBackend",
        "CACHE": "restartable",
    }
    with override_settings(CACHES=caches, DJANGO_LEADER=conf):
        from django_leader.backends.cache import CacheBackend

        backend = CacheBackend("restartable")
        try:
            yield server, backend
        finally:
            backend.flush_history(10)
            server.stop()


def test_token_grows_across_a_real_restart(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    server, backend = restartable
    first, _ = backend.acquire(lease_name, "alice", 30)
    assert first is not None

    server.crash()
    with pytest.raises(BackendUnavailable):
        backend.renew(first, 30)  # Redis is down: a clear error, bounded in time
    server.start()

    assert answered(backend.read, lease_name, timeout=WAIT) is None  # Redis forgot it
    assert answered(backend.renew, first, 30, timeout=WAIT) is None  # so the renewal fails
    second, _ = backend.acquire(lease_name, "bob", 30)
    assert second is not None
    assert second.token > first.token
    assert backend.release(first) is False  # a late release of the old term changes nothing
    assert backend.read(lease_name).holder == "bob"
    kinds = [(event[0], event[1], event[3]) for event in history(backend, lease_name)]
    assert kinds == [("acquired", "alice", first.token), ("acquired", "bob", second.token)]


def test_elector_steps_down_and_a_new_term_has_a_greater_token(
    restartable: tuple[RedisServer, Any], lease_name: str
) -> None:
    server, backend = restartable
    timing = {"ttl": 2.0, "renew_interval": 0.5, "retry_interval": 0.2}
    leader = Elector(lease_name, identity="before", backend=backend, **timing)
    leader.start()
    try:
        assert leader.wait_for_leadership(WAIT)
        lease = leader.lease
        assert lease is not None
        server.crash()
        # Unreachable store: the leader steps down at its local deadline, at the latest.
        assert lease.lost.wait(timing["ttl"] + 1.0)
        assert not leader.is_leader
        server.start()
        # It campaigns on and wins a new term, whose token is greater than the one the
        # restarted Redis forgot.
        assert leader.wait_for_leadership(WAIT)
        assert leader.lease is not None and leader.lease.token > lease.token
    finally:
        leader.stop(timeout=WAIT)
