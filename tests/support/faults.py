"""A real backend with faults injected on demand (for tests of the election loop)."""

from __future__ import annotations

import threading
from typing import Any

from django_leader.backends.base import Backend
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import Lease


class FaultyBackend(Backend):
    """Delegates to a real backend; renewals can be made to hang, fail, or answer late."""

    def __init__(self, real: Backend) -> None:
        self.real = real
        self.hang_renew = threading.Event()  # set: renew blocks until `unblock` is set
        self.unblock = threading.Event()
        self.hung_renew_returned = threading.Event()  # set once a renewal that hung returns
        self.fail_renew = 0  # number of renewals to fail with BackendUnavailable
        self.renew_started = threading.Event()
        self.renew_calls = 0

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        return self.real.acquire(name, holder, ttl)

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        self.renew_calls += 1
        self.renew_started.set()
        if self.fail_renew > 0:
            self.fail_renew -= 1
            raise BackendUnavailable("injected failure")
        if not self.hang_renew.is_set() or self.unblock.is_set():
            return self.real.renew(lease, ttl)
        self.unblock.wait(60)
        try:
            return self.real.renew(lease, ttl)
        finally:
            self.hung_renew_returned.set()

    def release(self, lease: Lease) -> bool:
        return self.real.release(lease)

    def read(self, name: str) -> Lease | None:
        return self.real.read(name)

    def names(self) -> list[str]:
        return self.real.names()

    def force_release(self, name: str, **kwargs: Any) -> Lease | None:
        return self.real.force_release(name, **kwargs)

    def record(self, kind: str, lease: Lease, detail: str = "") -> None:
        self.real.record(kind, lease, detail)

    def fenced(self, lease: Lease, using: str | None = None) -> Any:
        return self.real.fenced(lease, using)

    def close(self) -> None:
        self.real.close()
