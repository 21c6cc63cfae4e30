"""Ports for the servers the tests start, chosen below the kernel's ephemeral port range.

A port picked by binding port 0 comes from that range, and is free again once the probe
closes: any client connection the suite makes meanwhile (it makes thousands, on five
workers) may be given it as its local port, and the server started a moment later then
fails to bind it (a standby that "could not start server" in a make test run). No client
connection is ever given a port below the range, so a port chosen there stays free until a
server of the suite binds it; it is drawn at random, and never twice in one process, so
that two workers or two servers of one test do not pick the same.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port drawn.
LOWEST = 10000
#: Where the kernel's ephemeral range begins if /proc does not say (Linux's default).
EPHEMERAL_DEFAULT = 32768

_given: set[int] = set()
_random = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_DEFAULT
    return low


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that nothing listens on or uses now, below the
    ephemeral range."""
    highest = _ephemeral_start() - 1
    if highest - LOWEST < 1000:  # a range that starts low: bind port 0, as before
        return _kernel_ports(count)
    chosen: list[int] = []
    while len(chosen) < count:
        port = _random.randrange(LOWEST, highest + 1)
        if port in _given or port in chosen:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    _given.update(chosen)
    return chosen


def free_port() -> int:
    """One port, as :func:`free_ports`."""
    return free_ports(1)[0]


def _kernel_ports(count: int) -> list[int]:
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            probes.append(probe)
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()
