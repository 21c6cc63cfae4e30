"""The toy backend of docs/howto/write-a-backend.md passes the shipped contract: proof
that a backend written from that page alone keeps the lease rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from django_leader.backends.base import Backend
from django_leader.testing.contract import BackendContract
from tests.support.toy_backend import FileBackend

ROOT = Path(__file__).resolve().parents[2]


class TestFileBackend(BackendContract):
    #: Each call rewrites the whole JSON file: thousands of acquisitions would take minutes.
    large_batch = 100

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        self.path = str(tmp_path / "leases.json")

    def make_backend(self) -> Backend:
        return FileBackend(self.path)


def test_the_toy_is_the_code_of_the_page() -> None:
    page = (ROOT / "docs" / "howto" / "write-a-backend.md").read_text()
    steps = re.findall(r"```python\n(.*?)```", page, re.S)[:4]  # steps 1 to 4
    assert (ROOT / "tests" / "support" / "toy_backend.py").read_text() == "\n".join(steps)


def test_two_processes_share_the_file(tmp_path: Path) -> None:
    """The point of a file: a second process (here a second backend object on the same
    path, with its own file handles) sees the first one's lease and its token."""
    path = str(tmp_path / "leases.json")
    first, second = FileBackend(path), FileBackend(path)
    lease, _ = first.acquire("report", "alice", 30)
    assert lease is not None
    refused: Any = second.acquire("report", "bob", 30)
    assert refused[0] is None and refused[1].holder == "alice"
    assert second.release(lease) is True
    taken, _ = second.acquire("report", "bob", 30)
    assert taken is not None and taken.token == lease.token + 1
