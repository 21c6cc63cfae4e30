"""Private ZooKeeper servers of the tests: a standalone server a test may stop, kill, pause,
restart or wipe, and a three-node ensemble on one machine whose leader a test may kill.

The machine's ZooKeeper on 127.0.0.1:2181 is shared by every test run and is left alone.
These servers run Debian's jars (``zookeeper.jar``, whose manifest names its dependencies
under /usr/share/java) with ``java`` directly, each on free ports of its own with a data
directory under the test's ``tmp_path``, a short ``tickTime`` (sessions may be as short as
two ticks) and the four-letter words ``srvr``, ``mntr`` and ``stat``. A server counts as up
when ``srvr`` names its mode (standalone, leader or follower).

Use them as context managers (``with ZooKeeperEnsemble(tmp_path) as ensemble:``), so their
processes are killed when the test ends, failed or not; whatever is still running when the
interpreter exits is killed too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import pytest

from testproject.services import four_letter_word, zookeeper_mode
from tests.support import procfs
from tests.support.ports import free_ports
from tests.support.stores import REQUIRE_SERVICES, unavailable
from tests.support.waiting import wait_until

#: Debian's server jar; its manifest's Class-Path brings netty, jute, slf4j and the rest.
ZOOKEEPER_JAR = Path(os.environ.get("DJANGO_LEADER_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
#: A logger for slf4j, so that each server's log file says what it did (optional).
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
#: Netty's codecs, which the TLS client port (NettyServerCnxnFactory) needs and
#: zookeeper.jar's manifest does not name.
NETTY_JAR = Path("/usr/share/java/netty-codec.jar")

STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

#: A small heap and a quick JIT: these servers hold a few znodes and must start fast.
JVM_OPTIONS = [
    "-Xms16m",
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
]

#: Seconds a server (or an ensemble's election) may take: a JVM starts slowly on a busy box.
WAIT = 60.0

_RUNNING: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_RUNNING):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def missing() -> str | None:
    """Why no private ZooKeeper can run here, or None."""
    if shutil.which("java") is None:
        return "java is not installed (Debian: zookeeperd pulls it)"
    if not ZOOKEEPER_JAR.is_file():
        return f"{ZOOKEEPER_JAR} is missing (Debian: apt-get install zookeeperd)"
    return None


def require_zookeeper_jars() -> None:
    """Skip (or, with DJANGO_LEADER_REQUIRE_SERVICES=1, fail) unless a private server can
    run."""
    reason = missing()
    if reason is not None:
        unavailable(f"zookeeper: {reason}")


def new_root(hosts: str) -> str:
    """A new root on ``hosts``, initialized (a store never used: no lock-delay)."""
    from django_leader.backends.zookeeper import ZooKeeperBackend

    root = f"/faults-{uuid.uuid4().hex[:8]}"
    backend = ZooKeeperBackend(hosts=hosts, root=root)
    try:
        assert backend.initialize()
    finally:
        backend.shutdown()
    return root


class _Node:
    """One ZooKeeper JVM: its configuration file, data directory and log in ``workdir``."""

    def __init__(self, workdir: Path, main: str, config: dict[str, object], myid: int | None):
        self.workdir = workdir
        self.main = main
        self.myid = myid
        self.data_dir = workdir / "data"
        self.config_file = workdir / "zoo.cfg"
        self.log_file = workdir / "server.log"
        self.client_port = int(str(config["clientPort"]))
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        config = {**config, "dataDir": self.data_dir}
        self.config_file.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
        self._make_data_dir()

    def _make_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.myid is not None:
            (self.data_dir / "myid").write_text(f"{self.myid}\n")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the JVM (without waiting for it to serve)."""
        assert not self.running, "already running"
        classpath = [str(ZOOKEEPER_JAR)]
        if SLF4J_SIMPLE_JAR.is_file():
            classpath.append(str(SLF4J_SIMPLE_JAR))
        if NETTY_JAR.is_file():
            classpath.append(str(NETTY_JAR))
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "java",
                    *JVM_OPTIONS,
                    "-cp",
                    ":".join(classpath),
                    self.main,
                    str(self.config_file),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run is not its to receive
            )
        _RUNNING.add(self.proc)

    def signal(self, signum: int) -> None:
        """Send ``signum``; after SIGSTOP, wait until every thread of the JVM has stopped
        (kill(2) returns before a thread running on another core is stopped: a request
        sent at once could still be answered)."""
        assert self.proc is not None and self.running, "not running"
        self.proc.send_signal(signum)
        if signum == signal.SIGSTOP:
            wait_until(
                self.threads_stopped,
                timeout=WAIT,
                message=lambda: f"{self.workdir.name} did not stop",
            )

    def threads_stopped(self) -> bool:
        """Whether every thread of the process is stopped (state T in /proc)."""
        assert self.proc is not None
        states = [
            procfs.state(thread / "stat")
            for thread in Path(f"/proc/{self.proc.pid}/task").iterdir()
        ]
        live = [state for state in states if state != "gone"]  # a thread may have ended
        return bool(live) and all(state in ("T", "t") for state in live)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a paused server is woken to receive it), then SIGKILL after ``timeout``."""
        if not self.running:
            return
        assert self.proc is not None
        self.proc.terminate()
        self.proc.send_signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _RUNNING.discard(self.proc)

    def kill(self) -> None:
        """SIGKILL: a crash; nothing is flushed, sockets close."""
        if not self.running:
            return
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        _RUNNING.discard(self.proc)

    def wipe(self) -> None:
        """Delete the data directory (snapshots and transaction log): the server forgets."""
        assert not self.running, "stop the server before wiping its data"
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self._make_data_dir()

    def mode(self) -> str | None:
        """``standalone``, ``leader``, ``follower``, or None (down, paused, not serving)."""
        return zookeeper_mode("127.0.0.1", self.client_port)

    def srvr(self) -> str:
        """The server's whole answer to ``srvr`` (an OSError if it does not answer)."""
        return four_letter_word("127.0.0.1", self.client_port, "srvr")

    def describe(self) -> str:
        """State and the end of the log, for failure messages."""
        state = "running" if self.running else f"exited {self.proc and self.proc.returncode}"
        try:
            tail = self.log_file.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
        return f"{self.workdir.name} ({state}, mode {self.mode()}):\n  " + "\n  ".join(tail)


class _Started:
    """Started on ``with`` (and stopped if that fails half-way), every process killed on
    the way out, whatever happened."""

    def start_all(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _S) -> _S:
        try:
            self.start_all()
        except BaseException:  # __exit__ is not called when __enter__ fails
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


_S = TypeVar("_S", bound=_Started)


def skip_without_kazoo() -> None:
    """At a test module's import: skip it when kazoo is missing (in CI, with
    ``DJANGO_LEADER_REQUIRE_SERVICES=1``, fail instead: the dev extra has it)."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        if REQUIRE_SERVICES:
            raise
        pytest.skip("zookeeper: Python package 'kazoo' not installed", allow_module_level=True)


class ZooKeeperServer(_Started):
    """A standalone ZooKeeper on a free port of 127.0.0.1 with a data directory of its own.

    ``tick_ms`` is the server's tickTime: it grants sessions between 2 and
    ``max_session_ticks`` ticks (0.4 s to 60 s by default; a client that asks for more or
    less gets the bound).
    """

    def __init__(
        self,
        tmp_path: Path,
        tick_ms: int = 200,
        max_session_ticks: int = 300,
        tls: tuple[Path, Path] | None = None,
    ):
        require_zookeeper_jars()
        self.tick_ms = tick_ms
        self.port, self.secure_port = free_ports(2)
        secure: dict[str, object] = {}
        if tls is not None:
            # A TLS client port beside the plain one (Netty serves it): ``tls`` is the PEM
            # key and certificate of the server, in one file, and its certificate.
            keystore, certificate = tls
            secure = {
                "secureClientPort": self.secure_port,
                "secureClientPortAddress": "127.0.0.1",
                "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
                "ssl.keyStore.location": keystore,
                "ssl.keyStore.type": "PEM",
                "ssl.trustStore.location": certificate,
                "ssl.trustStore.type": "PEM",
                "ssl.clientAuth": "none",
            }
        self.node = _Node(
            tmp_path / f"zookeeper-{self.port}",
            STANDALONE_MAIN,
            {
                "tickTime": tick_ms,
                "clientPort": self.port,
                "clientPortAddress": "127.0.0.1",
                "maxClientCnxns": 0,
                "minSessionTimeout": 2 * tick_ms,
                "maxSessionTimeout": max_session_ticks * tick_ms,
                "4lw.commands.whitelist": "srvr,mntr,stat",
                "admin.enableServer": "false",
                # A killed server is a crashed process, not a crashed machine: what it wrote
                # is in the page cache (as the chaos PostgreSQL's fsync=off), and no write
                # waits for the disk of a busy test machine.
                "forceSync": "no",
                **secure,
            },
            myid=None,
        )

    @property
    def hosts(self) -> str:
        """The connection string, ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def secure_hosts(self) -> str:
        """The connection string of the TLS client port (with ``tls``)."""
        return f"127.0.0.1:{self.secure_port}"

    @property
    def data_dir(self) -> Path:
        return self.node.data_dir

    @property
    def running(self) -> bool:
        return self.node.running

    def start(self) -> None:
        """Start and wait until it serves (its data directory, if any, is loaded)."""
        self.node.start()
        self.wait_serving()

    def wait_serving(self) -> None:
        wait_until(
            lambda: self.node.running and self.node.mode() == "standalone",
            timeout=WAIT,
            message=lambda: f"ZooKeeper did not serve: {self.node.describe()}",
        )

    def stop(self) -> None:
        """SIGTERM, and wait for the process to end."""
        self.node.stop()

    def kill(self) -> None:
        """SIGKILL, and wait for the process to end."""
        self.node.kill()

    def pause(self) -> None:
        """SIGSTOP: the server freezes with its connections open (sessions expire only
        after it is resumed: it is the server that expires them)."""
        self.node.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.node.signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same port, keeping the data."""
        self.stop()
        self.start()

    def wipe(self) -> None:
        """Delete the data directory while stopped: started again, the server is empty."""
        self.node.wipe()

    def start_all(self) -> None:
        if not self.running:
            self.start()

    def close(self) -> None:
        """Kill the process if it runs; the data directory stays with ``tmp_path``."""
        self.node.kill()


class ZooKeeperEnsemble(_Started):
    """``size`` QuorumPeerMain processes on 127.0.0.1 forming one ensemble; nodes are
    numbered from 0 (``myid`` is the index + 1), each with a client, a quorum and an
    election port and a data directory of its own.

    ``tick_ms`` as for :class:`ZooKeeperServer`; a follower that does not hear from its
    leader for ``sync_ticks`` ticks (2 s by default) gives it up and an election starts.
    """

    def __init__(
        self,
        tmp_path: Path,
        size: int = 3,
        tick_ms: int = 200,
        max_session_ticks: int = 300,
        sync_ticks: int = 10,
    ):
        require_zookeeper_jars()
        self.tick_ms = tick_ms
        ports = free_ports(3 * size)
        self.client_ports = ports[:size]
        quorum_ports = ports[size : 2 * size]
        election_ports = ports[2 * size :]
        servers = {
            f"server.{i + 1}": f"127.0.0.1:{quorum_ports[i]}:{election_ports[i]}"
            for i in range(size)
        }
        self.nodes = [
            _Node(
                tmp_path / f"zookeeper-node{i}-{self.client_ports[i]}",
                QUORUM_MAIN,
                {
                    "tickTime": tick_ms,
                    "initLimit": 5 * sync_ticks,  # followers connect and sync to the leader
                    "syncLimit": sync_ticks,
                    "clientPort": self.client_ports[i],
                    "clientPortAddress": "127.0.0.1",
                    "maxClientCnxns": 0,
                    "minSessionTimeout": 2 * tick_ms,
                    "maxSessionTimeout": max_session_ticks * tick_ms,
                    "4lw.commands.whitelist": "srvr,mntr,stat",
                    "admin.enableServer": "false",
                    "forceSync": "no",  # as the standalone server's
                    **servers,
                },
                myid=i + 1,
            )
            for i in range(size)
        ]

    @property
    def hosts(self) -> str:
        """The connection string of every node: ``127.0.0.1:a,127.0.0.1:b,127.0.0.1:c``."""
        return ",".join(f"127.0.0.1:{port}" for port in self.client_ports)

    def node_hosts(self, index: int) -> str:
        """The connection string of node ``index`` alone."""
        return f"127.0.0.1:{self.client_ports[index]}"

    def modes(self) -> list[str | None]:
        """Each node's mode from ``srvr`` (None: down, paused or without a quorum)."""
        return [node.mode() for node in self.nodes]

    def running(self, index: int) -> bool:
        return self.nodes[index].running

    def start_all(self) -> None:
        """Start every node and wait for a quorum of all of them under one leader."""
        for node in self.nodes:
            if not node.running:
                node.start()
        self.wait_quorum()

    def start(self, index: int) -> None:
        """Start node ``index`` again (its data kept) and wait until it serves."""
        self.nodes[index].start()
        self.wait_quorum()

    def wait_quorum(self) -> int:
        """Wait until every running node serves, exactly one of them as leader; its index."""

        def settled() -> int | None:
            modes = self.modes()
            live = [i for i, node in enumerate(self.nodes) if node.running]
            if not all(modes[i] in ("leader", "follower") for i in live):
                return None
            leaders = [i for i in live if modes[i] == "leader"]
            # +1: index 0 is a leader too, and wait_until waits for a truthy value.
            return leaders[0] + 1 if len(leaders) == 1 else None

        return (
            wait_until(
                settled,
                timeout=WAIT,
                message=lambda: "no quorum:\n" + "\n".join(n.describe() for n in self.nodes),
            )
            - 1
        )

    def leader(self) -> int:
        """The index of the node whose ``srvr`` says ``Mode: leader``, once every running
        node serves (an election under way is waited for)."""
        return self.wait_quorum()

    def followers(self) -> list[int]:
        """The indexes of the running nodes that follow, once every running node serves."""
        leader = self.wait_quorum()
        return [i for i, node in enumerate(self.nodes) if node.running and i != leader]

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (no wait for the others to notice)."""
        self.nodes[index].kill()

    def stop(self, index: int) -> None:
        """SIGTERM node ``index`` and wait for it to end."""
        self.nodes[index].stop()

    def pause(self, index: int) -> None:
        """SIGSTOP node ``index``: its peers give it up after ``sync_ticks`` ticks."""
        self.nodes[index].signal(signal.SIGSTOP)

    def resume(self, index: int) -> None:
        self.nodes[index].signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        """Kill every node (the ensemble's data stays with ``tmp_path``)."""
        for node in self.nodes:
            node.kill()
