"""The private network of a partition run: one namespace per candidate slot and one for the
store, each with an ``eth0`` plugged into the userspace switch (:mod:`.netswitch`), which
runs in a namespace of its own and cuts, loses or delays frames per direction.

Addresses ``10.213.0.0/24`` exist only on the ``eth0`` of these namespaces (the store is
``10.213.0.1``, slot *i* ``10.213.0.(10+i)``): the host's interfaces and routes are never
touched, and nothing outside these namespaces can reach them. The store's servers run in
the store's namespace and listen on its loopback too, where the harness reaches them from
a thread moved into that namespace (:meth:`Network.inside`).

``Network.close()`` (and, should the run die first, :func:`tests.support.netns.sweep` at the
next run, or the interpreter's exit) deletes the namespaces with everything in them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import netns

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.213.0"
STORE = "store"
#: Seconds the switch may take to start or to answer a change of its rules.
ANSWER = 20.0


class Network:
    def __init__(self, workdir: Path, slots: list[str]) -> None:
        self.workdir = workdir
        self.ports = [STORE, *slots]
        self.tag = uuid.uuid4().hex[:6]
        self.spaces: dict[str, netns.Namespace] = {}
        self.switch_ns: netns.Namespace | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.seq = 0
        self.rules: list[dict[str, Any]] = []

    def address(self, port: str) -> str:
        return f"{SUBNET}.{1 if port == STORE else 10 + self.ports.index(port)}"

    def start(self) -> None:
        netns.sweep()
        try:
            self.switch_ns = netns.Namespace("sw", self.tag)
            for port in self.ports:
                self.spaces[port] = netns.Namespace(port, self.tag)
            self.proc = subprocess.Popen(
                self.switch_ns.command(sys.executable, "-m", "tests.chaos.netswitch", *self.ports),
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(self.workdir / "netswitch.log", "a"),  # noqa: SIM115
            )  # fmt: skip
            if self._answer() != "ready":
                raise RuntimeError("the network switch did not start (netswitch.log)")
            for port, space in self.spaces.items():
                self.switch_ns.ip("link", "set", port, "netns", space.name)
                space.ip("link", "set", port, "name", "eth0")
                space.ip("addr", "add", f"{self.address(port)}/24", "dev", "eth0")
                space.ip("link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def _answer(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER)
        if not ready:
            raise RuntimeError(f"the network switch did not answer within {ANSWER:.0f} s")
        return self.proc.stdout.readline().strip()

    def command(self, port: str, argv: list[str]) -> list[str]:
        """``argv`` run in ``port``'s namespace."""
        return self.spaces[port].command(*argv)

    def inside(self, port: str = STORE) -> contextlib.AbstractContextManager[None]:
        """The calling thread in ``port``'s namespace for a ``with`` block."""
        return self.spaces[port].inside()

    def apply(self, rules: list[dict[str, Any]]) -> str:
        """Replace the switch's rules (see :mod:`.netswitch`); returns once they apply, with
        the switch's frame counts."""
        assert self.proc is not None and self.proc.stdin is not None
        self.seq += 1
        self.proc.stdin.write(json.dumps({"seq": self.seq, "rules": rules}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if not answer.startswith(f"ok {self.seq}"):
            raise RuntimeError(f"the network switch answered {answer!r}")
        self.rules = rules
        return answer.split(" ", 2)[-1]

    def heal(self) -> str:
        return self.apply([])

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            with contextlib.suppress(Exception):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for space in self.spaces.values():
            space.delete()
        if self.switch_ns is not None:
            self.switch_ns.delete()
        self.spaces.clear()


@contextlib.contextmanager
def started(workdir: Path, slots: list[str]) -> Iterator[Network]:
    network = Network(workdir, slots)
    network.start()
    try:
        yield network
    finally:
        network.close()
