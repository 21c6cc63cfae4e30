"""A Redis Cluster of the tests and of the chaos run: three masters, each with one replica,
every node a private ``redis-server`` on a free loopback port in a work directory, keeping
nothing on disk but its ``nodes.conf``. Never the machine's shared Redis.

Faults, each on the master serving a given key's slot: :meth:`ClusterTopology.kill` (SIGKILL;
its replica is promoted after ``cluster-node-timeout``, then the killed node is started
again and rejoins as the new master's replica), :meth:`freeze` / :meth:`thaw` (a master
frozen until its replica took over comes back believing, for a moment, that it still
serves the slot), :meth:`manual_failover` (``CLUSTER FAILOVER`` on the replica: no write
lost), and :meth:`freeze` of the replica before the master is killed (the worst case: the
promoted replica misses the master's last writes).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support.redis_topology import TIMEOUT, Node, _wait, free_port

#: Milliseconds without an answer after which the cluster deems a node failed.
NODE_TIMEOUT_MS = 1000


def unavailable() -> str | None:
    """Why a cluster cannot run here, or None."""
    from tests.support.redis_topology import unavailable as missing

    reason = missing()
    if reason is None and shutil.which("redis-cli") is None:
        reason = "redis-cli is not installed (it creates the cluster)"
    return reason


def _node_args(node: Node) -> list[str]:
    port, bus = node.port, node.bus_port  # type: ignore[attr-defined]
    return ["--port", str(port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--protected-mode", "no",
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica cut off for longer than usual still takes over (the lag faults).
            "--cluster-replica-validity-factor", "0",
            "--cluster-require-full-coverage", "no",
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]  # fmt: skip


class ClusterTopology:
    """``masters`` masters with ``replicas`` replicas each (hash slots spread evenly by
    ``redis-cli --cluster create``)."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 1) -> None:
        self.workdir = workdir
        self.nodes = [Node(workdir, "cluster", []) for _ in range(masters * (1 + replicas))]
        self.replicas = replicas
        # Each node's cluster bus on a port of its own (by default port + 10000, which may
        # be taken, or past 65535), none of them another node's port.
        taken = {node.port for node in self.nodes}
        for node in self.nodes:
            while (bus := free_port()) in taken:
                continue
            taken.add(bus)
            node.bus_port = bus  # type: ignore[attr-defined]

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes:
            node.args = _node_args(node)
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{node.port}" for node in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=TIMEOUT,
        )  # fmt: skip
        self.await_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    @property
    def startup_nodes(self) -> list[str]:
        """``host:port`` of every node, as a client is given them."""
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    # -- what it looks like -------------------------------------------------------------------
    def layout(self) -> dict[int, dict[str, Any]]:
        """Per node port that answers: its role, its master's port (replicas) and its slot
        ranges (masters), as ``CLUSTER NODES`` of a live node tells."""
        for node in self.nodes:
            if not node.alive:
                continue
            try:
                rows = node.client(1.0).execute_command("CLUSTER NODES")  # parsed by redis-py
            except Exception:
                continue
            ids = {row["node_id"]: int(address.rsplit(":", 1)[1])
                   for address, row in rows.items()}  # fmt: skip
            found: dict[int, dict[str, Any]] = {}
            for address, row in rows.items():
                flags = row["flags"].split(",")
                found[int(address.rsplit(":", 1)[1])] = {
                    "role": "master" if "master" in flags else "replica",
                    "failed": "fail" in flags or "fail?" in flags,
                    "master": ids.get(row["master_id"]),
                    "slots": [(int(low), int(high)) for low, high in row["slots"]],
                }
            return found
        raise RuntimeError("no cluster node answers")

    def node(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def master_of(self, key: str) -> Node:
        """The master serving ``key``'s hash slot now (as that master itself says)."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())

        def serving() -> Node | None:
            for port, info in self.layout().items():
                if info["role"] != "master" or info["failed"] or not self.node(port).alive:
                    continue
                if any(low <= slot <= high for low, high in info["slots"]):
                    return self.node(port)
            return None

        return _wait(serving, f"the master of slot {slot}")

    def replica_of(self, master: Node) -> Node:
        def found() -> Node | None:
            for port, info in self.layout().items():
                if info["master"] == master.port and not info["failed"]:
                    return self.node(port)
            return None

        return _wait(found, f"a replica of {master.port}")

    def healthy(self) -> bool:
        """Every node answers, says ``cluster_state:ok``, and every master has its
        replicas in sync."""
        for node in self.nodes:
            if node.client(1.0).execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                return False
        layout = self.layout()
        for port, info in layout.items():
            if info["failed"]:
                return False
            if info["role"] == "master" and info["slots"]:
                replication = self.node(port).client(1.0).info("replication")
                online = [v for k, v in replication.items()
                          if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]  # fmt: skip
                if len(online) < self.replicas:
                    return False
        return True

    def await_healthy(self, timeout: float = TIMEOUT) -> None:
        _wait(self.healthy, "the cluster healthy, every replica in sync", timeout)

    # -- faults -------------------------------------------------------------------------------
    def await_promoted(self, old: Node, key: str, timeout: float = TIMEOUT) -> Node:
        """Wait until a master other than ``old`` serves ``key``'s slot: that master."""

        def promoted() -> Node | None:
            master = self.master_of(key)
            return master if master is not old else None

        return _wait(promoted, "a replica promoted", timeout)

    def kill(self, node: Node) -> None:
        node.kill()

    def restart(self, node: Node) -> None:
        """Start a killed node again: its ``nodes.conf`` makes it rejoin, as a replica of
        whichever node took its slots."""
        node.start(_node_args(node))

    def freeze(self, node: Node) -> None:
        node.signal(19)  # SIGSTOP

    def thaw(self, node: Node) -> None:
        node.signal(18)  # SIGCONT

    def manual_failover(self, master: Node, key: str) -> Node:
        """``CLUSTER FAILOVER`` on ``master``'s replica (the master stops writes until the
        replica has caught up): the new master."""
        replica = self.replica_of(master)

        def asked() -> bool:
            return bool(replica.client(1.0).execute_command("CLUSTER FAILOVER"))

        _wait(asked, "a manual failover accepted")
        return self.await_promoted(master, key)
