"""A replicated Redis of the tests and of the chaos run: a primary, replicas and Sentinels,
each a private ``redis-server`` on a free loopback port in a work directory, keeping nothing
on disk. Never the machine's shared Redis.

Faults: :meth:`SentinelTopology.kill_primary` (SIGKILL, then the Sentinels promote a
replica), :meth:`freeze` / :meth:`thaw` (SIGSTOP/SIGCONT: a primary frozen past the
Sentinels' ``down-after`` comes back still believing it is the primary, the split brain of
a failover), :meth:`switchover` (``SENTINEL FAILOVER``), and :meth:`restart` of a killed
node as a replica of the current primary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

#: Milliseconds without an answer after which a Sentinel deems the primary down.
DOWN_AFTER_MS = 1000
#: Seconds a topology may take to start, or a failover to complete.
TIMEOUT = 60.0


def unavailable() -> str | None:
    """Why a topology cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the Python package 'redis' is not installed"
    return None


def _wait(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    give_up = time.monotonic() + timeout
    while True:
        try:
            found = condition()
        except Exception:
            found = None
        if found:
            return found
        if time.monotonic() > give_up:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)


class Node:
    """One ``redis-server`` (a data node or a Sentinel) on its own port."""

    def __init__(self, workdir: Path, role: str, args: list[str]) -> None:
        self.port = free_port()
        self.role = role
        self.dir = workdir / f"{role}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, args: list[str] | None = None) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, *(args if args is not None else self.args)],
            cwd=self.dir,
            stdout=open(self.dir / "server.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        _wait(self.answers, f"{self.role} on port {self.port}")

    def client(self, timeout: float = 2.0) -> Any:
        import redis

        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def answers(self) -> bool:
        try:
            return bool(self.client(0.5).ping())
        except Exception:
            return False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)  # a frozen process dies too
                self.proc.kill()
            self.proc.wait()


def _data_args(port: int, replica_of: int | None) -> list[str]:
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0"]  # fmt: skip
    if replica_of is not None:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    return args


class SentinelTopology:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority)."""

    def __init__(self, workdir: Path, replicas: int = 2, sentinels: int = 3) -> None:
        self.workdir = workdir
        self.nodes = [Node(workdir, "redis", []) for _ in range(1 + replicas)]
        self.sentinels = [Node(workdir, "sentinel", []) for _ in range(sentinels)]
        self.quorum = sentinels // 2 + 1
        #: The name the Sentinels monitor the primary by: one of this topology's own (a
        #: client library may keep its pools by service name).
        self.service = f"leases{self.nodes[0].port}"

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        primary = self.nodes[0]
        primary.args = _data_args(primary.port, None)
        primary.start()
        for node in self.nodes[1:]:
            node.args = _data_args(node.port, primary.port)
            node.start()
        _wait(lambda: self.replicas_of(primary) == len(self.nodes) - 1, "replicas in sync")
        for sentinel in self.sentinels:
            conf = sentinel.dir / "sentinel.conf"
            conf.write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\nprotected-mode no\n"
                f"dir {sentinel.dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {primary.port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.service} 4000\n"
                f"sentinel parallel-syncs {self.service} 2\n"
            )
            sentinel.args = [str(conf), "--sentinel"]
            sentinel.start()
        _wait(self._sentinels_agree, "sentinels know the topology")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            node.kill()

    # -- what it looks like -------------------------------------------------------------------
    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    def primary_port(self) -> int:
        """The primary the Sentinels name now."""
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            try:
                _host, port = sentinel.client(1.0).sentinel_get_master_addr_by_name(self.service)
                return int(port)
            except Exception:
                continue
        raise RuntimeError("no sentinel answers")

    def node(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def primary(self) -> Node:
        return self.node(self.primary_port())

    @staticmethod
    def replicas_of(node: Node) -> int:
        info = node.client().info("replication")
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return sum(1 for replica in online if replica.get("state") == "online")

    def _sentinels_agree(self) -> bool:
        expected = len(self.nodes) - 1
        for sentinel in self.sentinels:
            master = sentinel.client().sentinel_master(self.service)
            if int(master.get("num-slaves", 0)) < expected:
                return False
            if int(master.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                return False
        return True

    def settled(self) -> bool:
        """Every live Sentinel names one primary, deems it up and runs no failover of it.
        (A primary promoted just now may be deemed down by another Sentinel whose PING it
        was slow to answer, which then fails it over again: with a 1 s down-after on a
        loaded machine, a second failover followed one second after the first.)"""
        named = set()
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            state = sentinel.client(1.0).sentinel_master(self.service)
            flags = set(str(state.get("flags", "")).split(","))
            if flags & {"failover_in_progress", "s_down", "o_down", "promoted"}:
                return False
            named.add(int(state["port"]))
        return len(named) == 1

    def await_settled(self, timeout: float = TIMEOUT) -> None:
        _wait(self.settled, "the Sentinels settled on one primary", timeout)

    # -- faults -------------------------------------------------------------------------------
    def await_failover(self, old: int, timeout: float = TIMEOUT) -> int:
        """Wait until the Sentinels name a primary other than ``old`` that answers as one:
        its port."""

        def promoted() -> int | None:
            port = self.primary_port()
            if port == old:
                return None
            role = self.node(port).client(0.5).info("replication").get("role")
            return port if role == "master" else None

        return int(_wait(promoted, "failover", timeout))

    def await_replicas(self, port: int, count: int, timeout: float = TIMEOUT) -> None:
        """Wait until the primary on ``port`` has ``count`` replicas online (the Sentinels
        point the others at it one after the other after a failover)."""
        _wait(lambda: self.replicas_of(self.node(port)) >= count, "replicas online", timeout)

    def kill_primary(self) -> tuple[Node, int]:
        """SIGKILL the primary, wait for the failover: (the killed node, the new primary's
        port)."""
        old = self.primary()
        old.kill()
        return old, self.await_failover(old.port)

    def freeze(self, node: Node) -> None:
        node.signal(signal.SIGSTOP)

    def thaw(self, node: Node) -> None:
        node.signal(signal.SIGCONT)

    def switchover(self) -> int:
        """``SENTINEL FAILOVER``: a replica promoted while the primary is well; the new
        primary's port."""
        old = self.primary_port()

        def asked() -> bool:
            # Refused (INPROG) while the last failover is still settling.
            return bool(self.sentinels[0].client().sentinel_failover(self.service))

        _wait(asked, "a switchover accepted")
        return self.await_failover(old)

    def restart(self, node: Node) -> None:
        """Start a killed node again, as a replica of the current primary (what an operator
        or an orchestrator does); the Sentinels then count it among the replicas."""
        node.args = _data_args(node.port, self.primary_port())
        node.start()

    def pause_sentinels(self) -> None:
        for sentinel in self.sentinels:
            sentinel.signal(signal.SIGSTOP)

    def resume_sentinels(self) -> None:
        for sentinel in self.sentinels:
            sentinel.signal(signal.SIGCONT)


def running(topology: Any, reason: str | None) -> Iterator[Any]:
    """``topology`` started, for a fixture to yield, and stopped after; the test skipped
    (in CI: failed) with ``reason`` instead when it cannot run here."""
    import pytest

    from tests.support.stores import REQUIRE_SERVICES

    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(f"required service missing: {reason}")
        pytest.skip(reason)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


def first_grant(store: Any, name: str, holder: str, ttl: float) -> tuple[Any, float]:
    """``name`` acquired by ``holder`` as soon as the store lets anyone (a Redis just
    started keeps its lock-delay): the lease, and when its acquisition was sent."""
    from tests.support.waiting import wait_until

    def attempt() -> tuple[Any, float] | None:
        sent = time.monotonic()
        lease, _ = store.acquire(name, holder, ttl)
        return None if lease is None else (lease, sent)

    return wait_until(attempt, timeout=TIMEOUT, message=f"{holder} never got {name}")


def handed_on(store: Any, name: str, held: Any, believed_until: float, ttl: float) -> Any:
    """bob's lease of ``name`` after a failover, taken as soon as the store lets him (while
    waiting, only ``held``'s holder may show as holding it), checked to come after that
    holder's deadline (``believed_until``, ``time.monotonic()``) with a greater token."""
    from tests.support.stores import answered
    from tests.support.waiting import wait_until

    def granted() -> Any:
        lease, current = answered(store.acquire, name, "bob", ttl, timeout=TIMEOUT)
        assert lease is not None or current is None or current.holder == held.holder, current
        return lease

    taken = wait_until(granted, timeout=TIMEOUT, message="bob never got the lease")
    assert time.monotonic() >= believed_until, "bob got the lease before its holder's deadline"
    assert taken.token > held.token, (held, taken)
    return taken


def given_back_while_frozen(
    topology: Any, nodes: list[Any], store: Any, name: str, ttl: float
) -> None:
    """With ``nodes`` (the replicas that could confirm ``name``'s writes) frozen, the
    primary grants ``name`` to alice but ``WAIT`` times out: the acquisition fails with a
    clear error and the lease is released at once, not left to keep others out. Once
    thawed, alice gets it."""
    import pytest

    from django_leader import BackendUnavailable
    from tests.support.waiting import wait_until

    for node in nodes:
        topology.freeze(node)
    try:
        with pytest.raises(BackendUnavailable, match="reached 0 of the 1 replicas"):
            store.acquire(name, "alice", ttl)
        assert store.read(name) is None
    finally:
        for node in nodes:
            topology.thaw(node)
    lease = wait_until(lambda: store.acquire(name, "alice", ttl)[0], timeout=TIMEOUT)
    assert lease.holder == "alice"
