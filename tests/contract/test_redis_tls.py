"""The Redis backend over TLS (``rediss://`` in the cache's ``LOCATION``): a private
``redis-server`` serving TLS only, with a self-signed certificate. Leases work through
Django's ``RedisCache`` and through django-redis, with the backend's own bounded pool (it
keeps the cache's TLS); a cache that does not trust the certificate, or speaks plain TCP
to the TLS port, gets ``BackendUnavailable``."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leader.exceptions import BackendUnavailable
from tests.support.ports import free_port
from tests.support.stores import REQUIRE_SERVICES
from tests.support.tls import certificate
from tests.support.waiting import wait_until

pytest.importorskip("redis")

CLIENTS = {
    "redis": "django.core.cache.backends.redis.RedisCache",
    "django_redis": "django_redis.cache.RedisCache",
}


def answers_over_tls(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"PING\r\n")
            return tls.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server on a free port that speaks TLS only; its port and certificate."""
    binary = shutil.which("redis-server")
    if binary is None:
        if REQUIRE_SERVICES:
            pytest.fail("required service missing: redis-server is not installed")
        pytest.skip("redis-server is not installed")
    keystore, cert = certificate(tmp_path, "redis")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(keystore),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(
            lambda: answers_over_tls(port, cert),
            timeout=15,
            message=lambda: f"redis-server did not serve TLS (exit {proc.poll()})",
        )
        yield port, cert
    finally:
        proc.kill()
        proc.wait()


def use(client: str, location: str) -> Any:
    from django.conf import settings

    return override_settings(
        CACHES={**settings.CACHES, "tls": {"BACKEND": CLIENTS[client], "LOCATION": location}},
        DJANGO_LEADER={
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.cache.CacheBackend",
            "CACHE": "tls",
            "LOCK_DELAY": 0,
        },
    )


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_leases_over_tls(tls_redis: tuple[int, Path], client: str, lease_name: str) -> None:
    if client == "django_redis":
        pytest.importorskip("django_redis")
    port, cert = tls_redis
    location = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}"
    with use(client, location):
        from django_leader.backends.cache import CacheBackend

        backend = CacheBackend("tls")
        try:
            lease = wait_until(
                lambda: backend.acquire(lease_name, "alice", 5.0)[0],
                timeout=15,
                message="no lease over TLS",
            )
            assert backend.renew(lease, 5.0) is not None
            assert backend.read(lease_name).holder == "alice"
            assert backend.release(lease)
        finally:
            backend.flush_history(10)
            backend.close()


@pytest.mark.parametrize("how", ["plain-tcp", "another-ca"])
def test_no_lease_without_tls_or_with_an_untrusted_certificate(
    tls_redis: tuple[int, Path], tmp_path: Path, how: str, lease_name: str
) -> None:
    port, _ = tls_redis
    _, stranger = certificate(tmp_path, "stranger")
    location = (
        f"redis://127.0.0.1:{port}/0"
        if how == "plain-tcp"
        else f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={stranger}"
    )
    with use("redis", location):
        from django_leader.backends.cache import CacheBackend

        backend = CacheBackend("tls")
        try:
            with pytest.raises(BackendUnavailable):
                backend.acquire(lease_name, "mallory", 5.0)
        finally:
            backend.close()
