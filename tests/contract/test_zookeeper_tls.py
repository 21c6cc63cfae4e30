"""The ZooKeeper backend over TLS (``DJANGO_LEADER["ZOOKEEPER"]["TLS"]``): a private
server with a TLS client port and a self-signed certificate (``openssl``). Leases work
through it; a client without TLS, or one that does not trust the server's certificate,
gets no session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_leader.conf import get_settings
from django_leader.exceptions import BackendUnavailable
from tests.support.stores import REQUIRE_SERVICES
from tests.support.tls import certificate
from tests.support.zookeeper_server import NETTY_JAR, ZooKeeperServer, require_zookeeper_jars

pytest.importorskip("kazoo")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[ZooKeeperServer, Path]]:
    """A private ZooKeeper with a TLS client port, and the certificate to trust."""
    require_zookeeper_jars()
    if not NETTY_JAR.is_file():
        message = f"no TLS client port without Netty's codecs ({NETTY_JAR}: libnetty-java)"
        pytest.fail(message) if REQUIRE_SERVICES else pytest.skip(message)
    keystore, cert = certificate(tmp_path, "server")
    with ZooKeeperServer(tmp_path, tls=(keystore, cert)) as server:
        yield server, cert


def configure(settings: Any, hosts: str, tls: Any) -> None:
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.zookeeper.ZooKeeperBackend",
        "ZOOKEEPER": {"HOSTS": hosts, "ROOT": "/tls", "CONNECT_TIMEOUT": 3, "TLS": tls},
    }


def test_leases_over_tls(settings: Any, tls_server: tuple[ZooKeeperServer, Path]) -> None:
    from django_leader.backends.zookeeper import ZooKeeperBackend

    server, cert = tls_server
    configure(settings, server.secure_hosts, {"CA": str(cert)})
    store = ZooKeeperBackend()
    try:
        store.initialize()
        lease, _ = store.acquire("over-tls", "alice", 5.0)
        assert lease is not None
        assert store.renew(lease, 5.0) is not None
        assert store.read("over-tls").holder == "alice"
        assert store.release(lease)
    finally:
        store.shutdown()


@pytest.mark.parametrize("trust", ["no-tls", "another-ca"])
def test_no_session_without_tls_or_with_an_untrusted_certificate(
    settings: Any, tls_server: tuple[ZooKeeperServer, Path], tmp_path: Path, trust: str
) -> None:
    from django_leader.backends.zookeeper import ZooKeeperBackend

    server, _ = tls_server
    _, stranger = certificate(tmp_path, "stranger")
    configure(settings, server.secure_hosts, None if trust == "no-tls" else {"CA": str(stranger)})
    store = ZooKeeperBackend()
    try:
        with pytest.raises(BackendUnavailable):
            store.acquire("over-tls", "mallory", 5.0)
    finally:
        store.shutdown()


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        ("yes", "must be None, True or a dict"),
        ({"CAFILE": "x"}, "unknown key(s) CAFILE"),
        ({"CA": "/nonexistent.pem"}, "readable PEM file"),
        ({"CERTFILE": __file__}, "CERTFILE and KEYFILE together"),
        ({"VERIFY": "no"}, "must be True or False"),
        ({"KEYFILE_PASSWORD": 1234}, "must be None or a str"),
    ],
)
def test_bad_tls_settings_are_refused(settings: Any, tls: Any, says: str) -> None:
    configure(settings, "127.0.0.1:2281", tls)
    with pytest.raises(ImproperlyConfigured, match=says.replace("(", r"\(").replace(")", r"\)")):
        get_settings()


def test_tls_true_uses_the_system_authorities(settings: Any) -> None:
    configure(settings, "127.0.0.1:2281", True)
    tls = get_settings().zookeeper.tls
    assert tls is not None and tls.kazoo_options()["use_ssl"] is True
    assert tls.ca is None and tls.verify and tls.check_hostname
