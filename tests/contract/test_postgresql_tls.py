"""The database backend over TLS: a private PostgreSQL whose ``pg_hba.conf`` accepts
TLS connections only (``hostssl``; ``hostnossl`` rejected), with a self-signed
certificate. The backend's private connections take ``sslmode`` from the database's
``OPTIONS`` as Django's do: with ``require`` leases work, with ``disable`` the server
refuses them and the backend reports the store unavailable."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_leader.exceptions import BackendUnavailable
from tests.chaos.stores import server_dir
from tests.support.pg_topology import Cluster, unavailable
from tests.support.stores import allow_database, require_postgresql, stores_db
from tests.support.tls import certificate, leases_work

pytestmark = [stores_db]

#: The alias of the TLS server's database, one per test (the backend keeps what it learnt
#: of an alias for the life of the process, as Django's settings do not change).
ALIASES: list[str] = []


def hand_to_postgres(path: Path, mode: int) -> None:
    path.chmod(mode)
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)


@pytest.fixture
def tls_postgres(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    require_postgresql(unavailable())
    base = server_dir("pgtls", "postgres")
    cluster = Cluster(base, "primary")
    try:
        cluster.pg("initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust",
                   "-E", "UTF8", "--no-sync")  # fmt: skip
        keystore, cert = certificate(tmp_path, "postgres")
        shutil.copy(keystore, cluster.data / "server.key")
        shutil.copy(cert, cluster.data / "server.crt")
        hand_to_postgres(cluster.data / "server.key", 0o600)
        hand_to_postgres(cluster.data / "server.crt", 0o644)
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write("fsync = off\nssl = on\n")
        (cluster.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostnossl all all 127.0.0.1/32 reject\n"
        )
        cluster.start()
        cluster.query("CREATE DATABASE leases")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "django_leader", "--verbosity", "0"],
            cwd=Path(__file__).resolve().parents[2],
            env={
                **os.environ,
                "DATABASE_URL": f"postgres://postgres@127.0.0.1:{cluster.port}/leases",
                "PGSSLMODE": "require",
                "DJANGO_LEADER_EXTRA_DATABASES": "0",
                "DJANGO_SETTINGS_MODULE": "testproject.settings",
            },
            check=True, timeout=120,
        )  # fmt: skip
        yield cluster
    finally:
        for alias in ALIASES:
            if alias in connections.settings:
                connections[alias].close()
                del connections.settings[alias]
        cluster.kill()
        shutil.rmtree(base, ignore_errors=True)


def configure(
    cluster: Cluster, settings: Any, monkeypatch: pytest.MonkeyPatch, sslmode: str
) -> Any:
    from django_leader.backends.db import DatabaseBackend

    alias = f"pgtls_{uuid.uuid4().hex[:8]}"
    ALIASES.append(alias)
    connections.settings[alias] = {
        **connections.settings["postgresql"],
        "HOST": "127.0.0.1",
        "PORT": str(cluster.port),
        "NAME": "leases",
        "USER": "postgres",
        "PASSWORD": "",
        "OPTIONS": {"sslmode": sslmode, "connect_timeout": 2},
    }
    allow_database(monkeypatch, alias)
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "django_leader.backends.db.DatabaseBackend",
        "DATABASE": alias,
    }
    return DatabaseBackend(alias)


def test_leases_over_tls(
    tls_postgres: Cluster, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = configure(tls_postgres, settings, monkeypatch, "require")
    leases_work(backend)
    # Every connection to the lease database is encrypted (the server accepts no other).
    clients = tls_postgres.query(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        "WHERE a.datname = 'leases'"
    )
    assert clients and all(ssl for (ssl,) in clients), clients


def test_without_tls_the_server_refuses_and_the_store_is_unavailable(
    tls_postgres: Cluster, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = configure(tls_postgres, settings, monkeypatch, "disable")
    with pytest.raises(BackendUnavailable, match=r"no encryption|pg_hba"):
        backend.acquire(f"tls-{uuid.uuid4().hex[:8]}", "mallory", 5.0)
