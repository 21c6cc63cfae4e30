"""A network cut in the middle of a statement inside ``lease.fenced()`` (rule 6).

The server ends a fenced transaction once its lease is over, but a client cut off from it
never hears so: it once waited as long as TCP retransmits (14 s and more, issue 24). Now the
connection's socket gives up once the lease's time is over
(``backends/db/socket_bound.py``), and the statement fails with the driver's error.

Real servers, real cut: a private PostgreSQL (or MariaDB) and the holder
(tests/procs/fence_cut.py) each run in a network namespace of the test's own, joined by a
veth pair; the test takes the link down while the statement runs, for ``CUT`` seconds.
Needs root (``ip netns``): skipped otherwise, with the reason (a failure in CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos.stores import MariaDBStore, PostgreSQLStore, free_port
from tests.support.stores import unavailable

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
#: The holder's lease time.
TTL = 3.0
#: How long the network stays cut: far longer than the lease, shorter than TCP's own
#: give-up (minutes). A statement that ends while the network is still cut was ended by the
#: client's bound.
CUT = 40.0


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Net:
    """Two network namespaces of the test's own joined by a veth pair: the server's
    (address :data:`SERVER`) and the client's (:data:`CLIENT`); ``cut()`` takes the link
    down. The addresses exist only inside these namespaces."""

    server: str
    client: str

    def cut(self) -> None:
        ip("-n", self.client, "link", "set", "veth0", "down")

    def heal(self) -> None:
        ip("-n", self.client, "link", "set", "veth0", "up")


SERVER = "10.213.77.1"
CLIENT = "10.213.77.2"


@pytest.fixture
def net() -> Iterator[Net]:
    if shutil.which("ip") is None:
        unavailable("network namespaces: the `ip` command is not installed")
    tag = uuid.uuid4().hex[:8]
    net = Net(server=f"dlcut-s-{tag}", client=f"dlcut-c-{tag}")
    made: list[str] = []
    try:
        for ns in (net.server, net.client):
            try:
                ip("netns", "add", ns)
            except (subprocess.CalledProcessError, OSError) as exc:
                detail = (getattr(exc, "stderr", b"") or b"").decode().strip()
                unavailable(f"network namespaces: `ip netns add` failed ({detail or exc})")
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        # Made inside the client's namespace, one end moved to the server's: nothing of it
        # is ever in the host's own namespace.
        ip("-n", net.client, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
        ip("-n", net.client, "link", "set", "veth1", "netns", net.server)
        for ns, dev, address in ((net.client, "veth0", CLIENT), (net.server, "veth1", SERVER)):
            ip("-n", ns, "addr", "add", f"{address}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        yield net
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)


def start_server(kind: str, ns: str, base: Path) -> tuple[str, list[str]]:
    """Start a private server of ``kind`` inside ``ns`` on :data:`SERVER`; its URL, and how
    to stop it."""
    port = free_port()  # free in the namespace too: it has no other listener
    enter = ["ip", "netns", "exec", ns]
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if kind == "postgresql":
        problem = PostgreSQLStore.unavailable()
        if problem:
            unavailable(problem)
        bindir = PostgreSQLStore.bindir()
        data = base / "data"
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        initdb = [f"{bindir}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust"]
        subprocess.run([*as_user, *initdb, "--no-sync"], check=True, capture_output=True, cwd="/")
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {CLIENT}/32 trust\n")
        options = f"-p {port} -k {base} -c listen_addresses={SERVER} -c fsync=off"
        subprocess.run([*enter, *as_user, f"{bindir}/pg_ctl", "-D", str(data), "-o", options,
                        "-l", str(base / "server.log"), "-w", "-t", "60", "start"],
                       check=True, capture_output=True, cwd="/")  # fmt: skip
        stop = [*as_user, f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"]
        return f"postgres://postgres@{SERVER}:{port}/postgres", stop
    problem = MariaDBStore.unavailable()
    if problem:
        unavailable(problem)
    data = base / "data"
    user = ["--user=mysql"] if os.geteuid() == 0 else []
    if os.geteuid() == 0:
        shutil.chown(base, "mysql", "mysql")
    subprocess.run(["mariadb-install-db", "--no-defaults", *user, f"--datadir={data}",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, capture_output=True, cwd="/")  # fmt: skip
    binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    subprocess.Popen([*enter, binary, "--no-defaults", *user, f"--datadir={data}",
                      f"--port={port}", f"--bind-address={SERVER}", f"--socket={base}/s.sock",
                      f"--pid-file={base}/mysqld.pid", "--skip-grant-tables", "--skip-log-bin",
                      "--innodb-buffer-pool-size=32M", f"--log-error={base}/error.log"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    stop = ["sh", "-c", f"kill -9 $(cat {base}/mysqld.pid) 2>/dev/null"]
    return f"mysql://root@{SERVER}:{port}/mysql", stop


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_a_cut_statement_inside_fenced_ends_with_the_lease(kind: str, net: Net) -> None:
    base = Path(tempfile.mkdtemp(prefix="dlcut-"))
    base.chmod(0o755)
    stop: list[str] = []
    child = None
    try:
        url, stop = start_server(kind, net.server, base)
        env = {**os.environ, "DATABASE_URL": url, "FENCE_CUT_TTL": str(TTL),
               "DJANGO_LEADER_EXTRA_DATABASES": "0"}  # fmt: skip
        child = subprocess.Popen(
            ["ip", "netns", "exec", net.client, sys.executable, "-m", "tests.procs.fence_cut"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first, f"the holder ended before fenced(): {child.stderr.read()[-2000:]}"
        assert json.loads(first)["ev"] == "in"
        net.cut()
        try:
            out, _ = child.communicate(timeout=CUT)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
            pytest.fail(
                f"fenced()'s statement still waited {CUT:g} s after the network was cut, "
                f"the lease's time being {TTL:g} s"
            )
        ended = json.loads(out.strip().splitlines()[-1])
        # It failed (the server could not answer), and by the lease's end plus the
        # keepalive probe's second, with a margin for a loaded machine.
        print("fenced() under a cut:", ended)
        assert ended["error"], ended
        assert ended["after"] < ended["time_left"] + 10, ended
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        if stop:
            subprocess.run(["ip", "netns", "exec", net.server, *stop], capture_output=True,
                           timeout=60)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)
