"""A private PgBouncer of the tests, in transaction pooling mode, in front of the tests'
PostgreSQL server, on a free loopback port of its own (Debian's ``pgbouncer``; as root it
runs as the user ``postgres``, since PgBouncer refuses to run as root)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.chaos.stores import _as_user, free_port


def unavailable() -> str | None:
    """Why a PgBouncer cannot run here, or None."""
    if shutil.which("pgbouncer") is None:
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    return None


class PgBouncer:
    """``pgbouncer`` with ``pool_mode = transaction`` forwarding every database to
    ``host``:``port``, with the pooler's default of refusing unknown startup parameters."""

    def __init__(self, host: str, port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        self._write(host, port)
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None

    def _write(self, host: str, port: int) -> None:
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
            "pool_mode = transaction\nunix_socket_dir =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            # After a failed login (a primary just killed) the pooler waits this long
            # before it tries the server again: 15 s by default, 15 s without a leader.
            "server_login_retry = 1\n"
            f"logfile = {self.dir}/pgbouncer.log\npidfile = {self.dir}/pgbouncer.pid\n"
        )

    def retarget(self, host: str, port: int) -> None:
        """Forward to ``host``:``port`` from now on (what a failover tool does after a
        promotion): the configuration rewritten and reloaded (SIGHUP)."""
        self._write(host, port)
        os.kill(self.pid(), signal.SIGHUP)

    def pid(self) -> int:
        return int((self.dir / "pgbouncer.pid").read_text())

    def crash(self) -> None:
        """SIGKILL: every client connection dropped at once."""
        os.kill(self.pid(), signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        (self.dir / "pgbouncer.pid").unlink(missing_ok=True)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*_as_user("postgres"), "pgbouncer", str(self.dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
        )  # fmt: skip
        give_up = time.monotonic() + 30
        while not (self.dir / "pgbouncer.pid").exists():
            if time.monotonic() > give_up or self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer did not start: {self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            pid = int((self.dir / "pgbouncer.pid").read_text())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
