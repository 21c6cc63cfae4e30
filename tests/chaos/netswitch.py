"""The chaos run's network switch: ``python -m tests.chaos.netswitch PORT...``.

Standard library only; run inside the switch's network namespace (root: it opens
``/dev/net/tun``). It creates one TAP device per ``PORT`` (the names of the devices) and
prints ``ready``; whoever started it then moves each device into the namespace it serves
(:mod:`tests.chaos.network`). Each frame a namespace sends on its device is read here and
written to the device of the namespace it is for (by destination MAC address, learned from
the frames seen; a broadcast, a multicast or an unknown destination goes to every other
port): a learning Ethernet switch in userspace.

This kernel has neither ``netem`` nor ``tc`` drop actions, so the faults are made here,
per direction: the rules, a JSON line on stdin ``{"seq": N, "rules": [{"src": PORT or "*",
"dst": PORT or "*", "loss": 0..1, "delay": SECONDS}, ...]}``, replace the rules in force and
are answered ``ok N`` on stdout once they apply. A frame from ``src`` to ``dst`` is lost
with the greatest ``loss`` of the rules that match it, else held back by the greatest
``delay`` (frames of one direction keep their order). ``{"seq": N, "rules": []}`` heals
everything. The switch exits when stdin closes (its devices go with it).
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
BROADCAST = b"\xff" * 6


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Switch:
    def __init__(self, ports: list[str]) -> None:
        self.ports = ports
        self.fds = {name: open_tap(name) for name in ports}
        self.port_of_fd = {fd: name for name, fd in self.fds.items()}
        self.where: dict[bytes, str] = {}  # MAC -> port
        self.rules: list[dict[str, object]] = []
        self.held: list[tuple[float, int, str, bytes]] = []  # (due, seq, port, frame)
        self.last_due: dict[tuple[str, str], float] = {}
        self.seq = 0
        self.rng = random.Random()
        self.counts = {"forwarded": 0, "lost": 0, "delayed": 0}

    def policy(self, src: str, dst: str) -> tuple[float, float]:
        loss = delay = 0.0
        for rule in self.rules:
            if rule.get("src", "*") in ("*", src) and rule.get("dst", "*") in ("*", dst):
                loss = max(loss, float(rule.get("loss", 0.0)))  # type: ignore[arg-type]
                delay = max(delay, float(rule.get("delay", 0.0)))  # type: ignore[arg-type]
        return loss, delay

    def send(self, port: str, frame: bytes) -> None:
        try:
            os.write(self.fds[port], frame)
            self.counts["forwarded"] += 1
        except (BlockingIOError, OSError):  # a full queue, or a device that is down: lost
            self.counts["lost"] += 1

    def forward(self, src: str, frame: bytes) -> None:
        if len(frame) < 14:
            return
        dst_mac, src_mac = frame[:6], frame[6:12]
        if not src_mac[0] & 1:
            self.where[src_mac] = src
        known = self.where.get(dst_mac)
        if dst_mac == BROADCAST or dst_mac[0] & 1 or known is None:
            targets = [p for p in self.ports if p != src]
        elif known == src:
            return
        else:
            targets = [known]
        now = time.monotonic()
        for dst in targets:
            loss, delay = self.policy(src, dst) if self.rules else (0.0, 0.0)
            if loss and (loss >= 1.0 or self.rng.random() < loss):
                self.counts["lost"] += 1
                continue
            if delay <= 0.0 and not self.last_due.get((src, dst), 0.0) > now:
                self.send(dst, frame)
                continue
            due = max(now + delay, self.last_due.get((src, dst), 0.0))
            self.last_due[(src, dst)] = due
            self.seq += 1
            heapq.heappush(self.held, (due, self.seq, dst, frame))
            self.counts["delayed"] += 1

    def release_due(self) -> None:
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            _, _, port, frame = heapq.heappop(self.held)
            self.send(port, frame)

    def control(self, line: str) -> None:
        message = json.loads(line)
        self.rules = list(message.get("rules", []))
        print(f"ok {message.get('seq', 0)} {json.dumps(self.counts)}", flush=True)

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        buffered = b""
        print("ready", flush=True)
        while True:
            timeout = None
            if self.held:
                timeout = max(0.0, self.held[0][0] - time.monotonic())
            readable, _, _ = select.select([stdin, *self.port_of_fd], [], [], timeout)
            for fd in readable:
                if fd == stdin:
                    data = os.read(stdin, 65536)
                    if not data:
                        return
                    buffered += data
                    while b"\n" in buffered:
                        line, buffered = buffered.split(b"\n", 1)
                        if line.strip():
                            self.control(line.decode())
                    continue
                src = self.port_of_fd[fd]
                for _ in range(64):  # drain, a bounded burst per port
                    try:
                        frame = os.read(fd, 65536)
                    except BlockingIOError:
                        break
                    self.forward(src, frame)
            self.release_due()


def main() -> None:
    Switch(sys.argv[1:]).serve()


if __name__ == "__main__":
    main()
