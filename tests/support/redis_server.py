"""Private redis-server processes of the tests and of the chaos run."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.stores import REQUIRE_SERVICES
from tests.support.waiting import wait_until

#: Seconds a private server has to start.
WAIT = 15.0


def answers_ping(port: int) -> bool:
    """True if a Redis server on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


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
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, dbfilename: str = "dump.rdb") -> None:
        """Start; with the snapshot ``dbfilename`` in the work directory loaded, if any."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--dbfilename", dbfilename],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self.answers, timeout=WAIT, message="redis-server did not start")

    def answers(self) -> bool:
        """True if the server answers PING."""
        return answers_ping(self.port)

    def crash(self) -> None:
        """SIGKILL: what a crash or an OOM kill does; nothing is saved."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.crash()
