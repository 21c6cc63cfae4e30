"""Network namespaces of the tests: private networks that exist only inside namespaces a
test creates, never on the host's interfaces.

A namespace is named ``dlchaos<pid>x<tag>-<role>``: ``<pid>`` is the process that made it, so
that :func:`sweep` can delete the namespaces of runs that died without cleaning up (and
only those: a live run's are left alone). Addresses are assigned only to interfaces inside
these namespaces; the root namespace gets no address, route or interface.

Every creator registers its namespaces for deletion at interpreter exit as well, so a run
that fails half-way leaves nothing behind; :func:`sweep` catches a run that was killed.

``Namespace.inside()`` moves the calling *thread* into the namespace (``setns``) for the
duration of a ``with`` block: a socket made there, or a process started there, belongs to
the namespace (a socket keeps its namespace for its life; a child inherits the thread's).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

#: Every namespace made here starts with this.
PREFIX = "dlchaos"
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"

_LIVE: set[str] = set()
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def namespaces() -> list[str]:
    """The names of the machine's named network namespaces."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def _creator(name: str) -> int | None:
    head = name[len(PREFIX) :].split("x", 1)[0]
    return int(head) if name.startswith(PREFIX) and head.isdigit() else None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep() -> list[str]:
    """Delete the namespaces (and kill the processes in them) that runs left behind whose
    process is gone; the names deleted."""
    removed = []
    for name in namespaces():
        pid = _creator(name)
        if pid is None or _alive(pid):
            continue
        _delete(name)
        removed.append(name)
    return removed


def _delete(name: str) -> None:
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _ip("netns", "delete", name, check=False)
    _LIVE.discard(name)


@atexit.register
def _delete_leftovers() -> None:
    for name in list(_LIVE):
        _delete(name)


_REASON: list[str | None] = []


def unavailable() -> str | None:
    """Why no namespaces (with TAP devices) can be made here, or None. Tried once."""
    if _REASON:
        return _REASON[0]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "network namespaces need root (ip netns add)"
    elif shutil.which("ip") is None:
        reason = "the ip command (iproute2) is not installed"
    elif not os.path.exists("/dev/net/tun"):
        reason = "/dev/net/tun is missing (no TAP devices)"
    else:
        try:
            probe = Namespace("probe")
            probe.delete()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            reason = f"ip netns add failed: {exc}"
    _REASON.append(reason)
    return reason


class Namespace:
    """A network namespace of this process's, with its loopback up."""

    def __init__(self, role: str, tag: str | None = None) -> None:
        tag = tag or uuid.uuid4().hex[:6]
        self.name = f"{PREFIX}{os.getpid()}x{tag}-{role}"
        _ip("netns", "add", self.name)
        _LIVE.add(self.name)
        try:
            self.ip("link", "set", "lo", "up")
        except BaseException:
            self.delete()
            raise

    def ip(self, *args: str) -> str:
        """``ip -n NAME ARGS``: its output."""
        return _ip("-n", self.name, *args).stdout

    def command(self, *argv: str) -> list[str]:
        """``argv`` as run inside the namespace (``ip netns exec``, which execs: the process
        keeps the pid ``Popen`` reports)."""
        return ["ip", "netns", "exec", self.name, *argv]

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """The calling thread in this namespace for the block (sockets made and processes
        started there belong to it), back where it was afterwards."""
        here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"{NETNS_DIR}/{self.name}", os.O_RDONLY)
        try:
            if _libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.name}")
            try:
                yield
            finally:
                if _libc.setns(here, CLONE_NEWNET) != 0:  # pragma: no cover - cannot fail
                    raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(here)
            os.close(there)

    def delete(self) -> None:
        """Kill what runs in it and delete it."""
        _delete(self.name)
