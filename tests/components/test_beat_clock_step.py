"""``LeaderScheduler``'s slot records when the beat's wall clock steps during its term
(time-machine, in this process: the stores' clocks do not move). The beat, its helpers
and fixtures are ``tests/components/test_celery.py``'s.

When the wrapped scheduler sends is Celery's business, on the wall clock; what is ours is
the slot time recorded for the next leader: it stays in the store's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

pytest.importorskip("celery")

from tests.components import test_celery
from tests.components.test_celery import Sent, beat_app, lead
from tests.support.stores import open_store, stores_db

pytestmark = [stores_db]

# test_celery's fixtures, by their names (a test asks for them with getfixturevalue).
beats = test_celery.beats
sent = test_celery.sent
store = test_celery.store


@pytest.fixture(params=["sqlite", "postgresql", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """(test_celery's ``store`` uses this one here: a database and Redis are enough.)"""
    yield from open_store(request.param)


@pytest.mark.usefixtures("beats", "sent", "store")
@pytest.mark.parametrize("jump", [3600, -3600], ids=["ahead-1h", "behind-1h"])
def test_a_step_of_the_beats_wall_clock_in_its_term_does_not_shift_the_recorded_slot(
    request: pytest.FixtureRequest, jump: int
) -> None:
    """The beat leads with its clock right, then its wall clock steps an hour: the slot it
    sends next is recorded at the store's time, not an hour off (issue 24, defect 4: the
    offset measured when the term began made the record an hour off, so the next leader
    sent nothing for that entry for an hour, or sent again at once)."""
    time_machine = pytest.importorskip("time_machine")
    messages: Sent = request.getfixturevalue("sent")
    backend = request.getfixturevalue("store")
    app = beat_app("every-two-seconds", every=2.0)
    beat = request.getfixturevalue("beats")(app, "a")
    inner = lead(beat)  # the term begins with the wall clock right
    with time_machine.travel(datetime.now(timezone.utc) + timedelta(seconds=jump), tick=True):
        entry = inner.schedule["every-two-seconds"]
        entry.last_run_at = app.now() - timedelta(minutes=5)
        inner.populate_heap()
        beat.tick()
        assert len(messages.messages) == 1
        lease = beat.elector.lease
        assert lease is not None
        record = backend.slots().load(lease)["every-two-seconds"]
    store_now = backend.slots().now()
    assert abs((record.at - store_now).total_seconds()) < 60, (record.at, store_now)
    assert messages.messages[0].options["headers"]["django_leader_slot"] == record.at.isoformat()
