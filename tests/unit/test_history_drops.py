"""The history queue of the non-database stores, full: one warning per interval, with a
count, instead of one per event (a churn of names through Redis wrote 74,004 lines)."""

from __future__ import annotations

import logging
from typing import Any

from django_leader.backends import history
from django_leader.lease import Lease


def test_dropped_events_are_warned_of_once_per_interval_with_a_count(
    caplog: Any, monkeypatch: Any
) -> None:
    writer = history.HistoryWriter("default", maxsize=1)
    monkeypatch.setattr(writer, "_ensure_thread", lambda: None)  # nothing drains the queue
    lease = Lease("churn", "alice", 1, None, None, None, 1)
    with caplog.at_level(logging.WARNING, logger="django_leader"):
        for _ in range(1001):  # the first fills the queue, 1,000 are dropped
            writer.record("acquired", lease, None)
        warned = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
        assert warned == [
            "history queue full, dropping acquired event of 'churn' (history is best effort)"
        ]
        writer._drop_logged -= history.DROP_LOG_INTERVAL  # the interval has passed
        writer.record("released", lease, None)
    warned = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(warned) == 2
    assert "dropping released event of 'churn' and 999 more since the last" in warned[1]
