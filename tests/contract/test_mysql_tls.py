"""The database backend over TLS on MariaDB: a private ``mariadbd`` with a self-signed
certificate and ``require-secure-transport`` (an unencrypted TCP connection is refused).
The backend's private connections take the ``ssl`` options from the database's
``OPTIONS`` as Django's do: with them, leases work and every connection of the lease
database is encrypted; without them the server refuses and the backend reports the store
unavailable."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from django_leader.exceptions import BackendUnavailable
from tests.chaos.stores import MariaDBStore
from tests.support.stores import allow_database, stores_db, unavailable
from tests.support.tls import certificate, leases_work

pytestmark = [stores_db]

#: The aliases made by the running test.
ALIASES: list[str] = []


@pytest.fixture(scope="module")
def tls_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBStore]:
    problem = MariaDBStore.unavailable()
    if problem is not None:
        unavailable(problem)
    keys = tmp_path_factory.mktemp("mariadb-tls")
    store = MariaDBStore(keys, ttl=3.0)
    keystore, cert = certificate(keys, "mariadb")
    # mariadbd runs as 'mysql': its key and certificate go in its own directory.
    key, crt = store.base / "server-key.pem", store.base / "server-cert.pem"
    shutil.copy(keystore, key)
    shutil.copy(cert, crt)
    if os.geteuid() == 0:
        shutil.chown(key, "mysql")
        shutil.chown(crt, "mysql")
    key.chmod(0o600)
    store.options = (f"--ssl-key={key}", f"--ssl-cert={crt}", "--require-secure-transport=ON")
    store.cert = cert  # type: ignore[attr-defined]
    try:
        store.start()
        yield store
    finally:
        store.stop()
        shutil.rmtree(store.base, ignore_errors=True)


@pytest.fixture(autouse=True)
def forget_aliases() -> Iterator[None]:
    """Each test's database alias goes with it (the test case's teardown visits every
    alias it knows, and one configured without TLS cannot connect)."""
    yield
    while ALIASES:
        alias = ALIASES.pop()
        if alias in connections.settings:
            connections[alias].close()
            del connections.settings[alias]


def accepted(store: MariaDBStore) -> int:
    """TLS handshakes the server has accepted so far (this probe's included)."""
    db = store.connect()
    try:
        cursor = db.cursor()
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'")
        return int(cursor.fetchone()[1])
    finally:
        db.close()


def configure(
    store: MariaDBStore, settings: Any, monkeypatch: pytest.MonkeyPatch, ssl: dict[str, Any]
) -> Any:
    from django_leader.backends.db import DatabaseBackend

    alias = f"mytls_{uuid.uuid4().hex[:8]}"
    ALIASES.append(alias)
    connections.settings[alias] = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.mysql",
        "HOST": "127.0.0.1",
        "PORT": str(store.port),
        "NAME": "chaos",
        "USER": "root",
        "PASSWORD": "",
        "OPTIONS": {**ssl, "connect_timeout": 2},
    }
    allow_database(monkeypatch, alias)
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.db.DatabaseBackend",
        "DATABASE": alias,
    }
    return DatabaseBackend(alias), alias


def test_leases_over_tls(
    tls_mariadb: MariaDBStore, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = accepted(tls_mariadb)
    ssl = {"ssl": {"ca": str(tls_mariadb.cert)}}  # type: ignore[attr-defined]
    backend, alias = configure(tls_mariadb, settings, monkeypatch, ssl)
    call_command("migrate", "django_leader", database=alias, verbosity=0)
    leases_work(backend)
    # The server refuses any unencrypted connection (require-secure-transport), and counts
    # the TLS handshakes: migrate's connection and the backend's own, besides the probes'.
    assert accepted(tls_mariadb) - before >= 2 + 1


def test_without_tls_the_server_refuses_and_the_store_is_unavailable(
    tls_mariadb: MariaDBStore, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, _ = configure(tls_mariadb, settings, monkeypatch, {"ssl_mode": "DISABLED"})
    with pytest.raises(BackendUnavailable, match=r"(?i)access denied|secure transport"):
        backend.acquire(f"tls-{uuid.uuid4().hex[:8]}", "mallory", 5.0)


def test_a_certificate_the_client_does_not_trust_is_refused(
    tls_mariadb: MariaDBStore,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, other = certificate(tmp_path, "other")
    ssl = {"ssl": {"ca": str(other)}, "ssl_mode": "VERIFY_CA"}
    backend, _ = configure(tls_mariadb, settings, monkeypatch, ssl)
    with pytest.raises(BackendUnavailable, match=r"(?i)certificate|ssl|tls"):
        backend.acquire(f"tls-{uuid.uuid4().hex[:8]}", "mallory", 5.0)
