"""The ensemble's clock: every time a lease decision rests on is a ZooKeeper write's
``mtime``, never this machine's clock. A write to the clock znode reads it; an estimate
(the latest write's ``mtime`` plus the time since, by the monotonic clock) answers the
calls it is sure of without a write."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from .ensemble import Ensemble
from .layout import to_time

#: How sure a clock estimate must be (seconds) to decide "not expired yet" without writing
#: the clock znode; closer calls read the ensemble's clock.
ESTIMATE_SLACK = 0.25
#: How long a clock estimate is trusted before the clock znode is written again.
ESTIMATE_AGE = 30.0


class EnsembleClock(Ensemble):
    """An :class:`~.ensemble.Ensemble` that reads the ensemble's clock: what the lease
    operations, the candidates and the store marker build on."""

    # -- the ensemble's clock ---------------------------------------------------------------
    def _seen(self, mtime: int) -> None:
        """A write's ``mtime``: the ensemble's clock when it was applied."""
        self._clock = (int(mtime), time.monotonic())

    def _clock_stat(self) -> Any:
        """A write to the clock znode: its stat (``mtime``: the ensemble's clock now;
        ``mzxid``: its epoch)."""
        from kazoo.exceptions import NoNodeError

        client = self.client
        path = f"{self.root}/clock"
        try:
            stat = self._wait(client.set_async(path, b""))
        except NoNodeError:
            self._ensure(client, path, anew=True)
            stat = self._wait(client.set_async(path, b""))
        self._seen(stat.mtime)
        return stat

    def _now_ms(self) -> int:
        """The ensemble's clock now: a write to the clock znode, whose ``mtime`` it is."""
        return int(self._clock_stat().mtime)

    def _read_only_now(self, floor: int) -> int:
        """The ensemble's clock as well as a process can tell without writing: the clock
        estimate whatever its age (else the clock znode's last ``mtime``, a time the
        ensemble has passed: never this machine's clock, which may be ahead and report a
        held lease free), never before ``floor`` (an ``mtime`` just read). For :meth:`read`
        alone: no lease decision rests on it."""
        if self._clock is None:
            stat = self._wait(self.client.exists_async(f"{self.root}/clock"))
            return max(floor, int(stat.mtime) if stat is not None else 0)
        at, seen = self._clock
        return max(floor, at + int((time.monotonic() - seen) * 1000))

    def now(self) -> datetime:
        return to_time(self._now_ms())

    def _estimate_ms(self) -> int | None:
        if self._clock is None:
            return None
        at, seen = self._clock
        age = time.monotonic() - seen
        if age > ESTIMATE_AGE:
            return None
        return at + int(age * 1000)

    def _passed(self, until_ms: int) -> tuple[bool, int]:
        """Has the ensemble's clock passed ``until_ms``? ``(passed, now_ms)``. A clock
        estimate (the last write's ``mtime`` plus the time since) answers "not yet" when
        it is sure by :data:`ESTIMATE_SLACK`; otherwise the clock znode is written. Only a
        reading of the ensemble's clock ever answers "passed"."""
        estimate = self._estimate_ms()
        if estimate is not None and estimate + ESTIMATE_SLACK * 1000 < until_ms:
            return False, estimate
        now = self._now_ms()
        return now >= until_ms, now
