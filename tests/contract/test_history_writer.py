"""The history writer of the stores that are not the database (Redis, ZooKeeper), against
each real history database: a burst of events is written in a few transactions, in order.

One commit per event let the writer fall behind: 2,500 leases taken on Redis in a test left
history still being written after the test's 10 s ``flush_history``, and the writer then
raced pytest-django's flush of the SQLite test database ("database is locked", CI of
stop 36)."""

from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_leader.backends import history
from django_leader.backends.db import DatabaseBackend
from django_leader.lease import EventKind, Lease
from django_leader.models import LeaseEvent
from tests.support.counting import round_trips
from tests.support.stores import stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

BURST = 1000


@pytest.fixture(autouse=True)
def idle_close(monkeypatch: Any) -> None:
    """The writers of these tests let their connections go 0.2 s after their last event
    (not 10 s): none is left open when the test databases are dropped."""
    monkeypatch.setattr(history, "IDLE_CLOSE", 0.2)


def _lease(name: str, token: int) -> Lease:
    now = datetime.datetime.now(datetime.timezone.utc)
    return Lease(name, f"holder-{token % 3}", token, now, now, now, 1)


@pytest.fixture
def transactions(monkeypatch: Any) -> list[bool]:
    """Every transaction (or autocommitted call) the history database is asked for: its
    ``atomic`` argument."""
    opened: list[bool] = []
    cursor = DatabaseBackend._cursor

    def counted(self: DatabaseBackend, atomic: bool) -> Any:
        opened.append(atomic)
        return cursor(self, atomic)

    monkeypatch.setattr(DatabaseBackend, "_cursor", counted)
    return opened


@pytest.fixture
def inserts() -> Iterator[list[str]]:
    """Every statement that inserts history rows, meanwhile, in any thread."""
    with round_trips() as trips:
        yield trips  # filtered by the test: what else the writer sent is not counted


def history_inserts(trips: list[str]) -> list[str]:
    return [sql for sql in trips if sql.startswith("INSERT INTO") and "leaseevent" in sql]


def test_a_burst_of_events_is_written_in_a_few_transactions_in_order(
    db_alias: str, transactions: list[bool], inserts: list[str]
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    writer = history.HistoryWriter(db_alias)
    for token in range(1, BURST + 1):
        writer.record(EventKind.ACQUIRED, _lease(name, token), None)
    assert writer.flush(60), "the burst was not written within 60 s"
    # 100 rows per statement (EVENTS_PER_INSERT): a statement per row was 1,000.
    found = history_inserts(inserts)
    assert BURST / 100 <= len(found) <= 2 * BURST / 100, len(found)
    rows = list(LeaseEvent.objects.using(db_alias).filter(name=name).order_by("id"))
    assert [row.token for row in rows] == list(range(1, BURST + 1))
    assert [row.holder for row in rows[:4]] == ["holder-1", "holder-2", "holder-0", "holder-1"]
    # Batches of up to WRITE_BATCH (200) events: 5 or 6 transactions (the thread may take
    # the first event alone). One commit per event was 1,000.
    assert len(transactions) <= 10, len(transactions)


def test_events_recorded_one_at_a_time_are_written_together(
    db_alias: str, transactions: list[bool]
) -> None:
    """A lock taken and released in a loop records an event every few hundred µs. The
    writer woke for each and wrote one or two per transaction, competing with the lock's
    thread for the interpreter (``with lock(): pass`` on Redis took twice as long with the
    history on). It now waits LINGER (50 ms) after an event for those that follow."""
    name = f"paced-{uuid.uuid4().hex[:8]}"
    writer = history.HistoryWriter(db_alias)
    writer.record(EventKind.ACQUIRED, _lease(name, 0), None)
    assert writer.flush(30)  # the thread is up and connected
    transactions.clear()
    started = time.monotonic()
    for token in range(1, 101):
        writer.record(EventKind.ACQUIRED, _lease(name, token), None)
        time.sleep(0.001)
    took = time.monotonic() - started
    assert writer.flush(30)
    rows = LeaseEvent.objects.using(db_alias).filter(name=name).order_by("id")
    assert list(rows.values_list("token", flat=True)) == list(range(101))
    # At most one transaction per 50 ms (LINGER) while they came, and one more at each end.
    assert len(transactions) <= took / 0.05 + 2, (len(transactions), took)


def test_a_batch_that_cannot_be_written_is_dropped_with_one_warning(
    db_alias: str, caplog: Any, monkeypatch: Any
) -> None:
    name = f"dropped-{uuid.uuid4().hex[:8]}"
    writer = history.HistoryWriter(db_alias)
    failing = [True]
    write_events = DatabaseBackend.write_events

    def write_or_fail(self: DatabaseBackend, events: Any) -> None:
        if failing[0]:
            failing[0] = False
            raise RuntimeError("history database said no")
        write_events(self, events)

    monkeypatch.setattr(DatabaseBackend, "write_events", write_or_fail)
    monkeypatch.setattr(writer, "_ensure_thread", lambda: None)  # queue the burst first
    for token in range(1, 11):
        writer.record(EventKind.ACQUIRED, _lease(name, token), None)
    with caplog.at_level(logging.WARNING, logger="django_leader"):
        history.HistoryWriter._ensure_thread(writer)  # the ten are queued: one batch
        assert writer.flush(30)
    warned = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"acquired event of {name!r} and 9 more" in warned[0]
    assert "history database said no" in warned[0]
    # The writer goes on: the next event is written.
    writer.record(EventKind.RELEASED, _lease(name, 11), None)
    assert writer.flush(30)
    assert list(
        LeaseEvent.objects.using(db_alias).filter(name=name).values_list("kind", "token")
    ) == [("released", 11)]


def test_an_idle_writer_lets_its_connection_go_and_reconnects_for_the_next_event(
    db_alias: str, monkeypatch: Any
) -> None:
    name = f"idle-{uuid.uuid4().hex[:8]}"
    closed: list[threading.Thread] = []  # the threads that closed a connection
    close = DatabaseBackend.close

    def noted(self: DatabaseBackend) -> None:
        closed.append(threading.current_thread())
        close(self)

    monkeypatch.setattr(DatabaseBackend, "close", noted)
    writer = history.HistoryWriter(db_alias)
    writer.record(EventKind.ACQUIRED, _lease(name, 1), None)
    assert writer.flush(30)
    wait_until(
        lambda: writer._thread in closed, timeout=10, message="the idle writer kept its connection"
    )
    writer.record(EventKind.RELEASED, _lease(name, 1), None)
    assert writer.flush(30)
    assert list(
        LeaseEvent.objects.using(db_alias)
        .filter(name=name)
        .order_by("id")
        .values_list("kind", flat=True)
    ) == ["acquired", "released"]
