"""Self-signed certificates for the TLS tests (``openssl``)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.stores import REQUIRE_SERVICES


def certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: (key and certificate in one PEM file, the
    certificate alone)."""
    if shutil.which("openssl") is None:
        message = "openssl is not installed"
        pytest.fail(message) if REQUIRE_SERVICES else pytest.skip(message)
    key, cert = directory / f"{name}-key.pem", directory / f"{name}-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    both = directory / f"{name}-keystore.pem"
    both.write_text(key.read_text() + cert.read_text())
    return both, cert


def leases_work(backend: Any) -> None:
    """A lease taken, renewed, read and released through ``backend`` (over TLS)."""
    name = f"tls-{uuid.uuid4().hex[:8]}"
    lease, _ = backend.acquire(name, "alice", 5.0)
    assert lease is not None
    assert backend.renew(lease, 5.0) is not None
    assert backend.read(name).holder == "alice"
    assert backend.release(lease)
