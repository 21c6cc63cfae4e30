"""``django_leader.celery`` in one process: ``singleton_task`` run eagerly (``task.apply()``),
the beat's fenced slot records, and ``LeaderScheduler`` driven tick by tick, on every store.

The same behaviour with real ``celery worker`` and ``celery beat`` processes is in
``tests/processes/test_celery_processes.py``.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from celery import Celery
from celery.beat import PersistentScheduler, Scheduler, Service
from django.core.exceptions import ImproperlyConfigured

from django_leader import LeadershipLost, LeaseHeld, current_lease
from django_leader.backends.base import Backend
from django_leader.backends.slots import Slot, entry_key
from django_leader.celery import LeaderScheduler, singleton_task
from django_leader.celery.beat import wrapped_scheduler_class
from django_leader.celery.tasks import release_abandoned, singleton_spec, task_identity
from django_leader.conf import validate_identity
from django_leader.lease import LossReason, clock
from django_leader.term import resolve_backend
from testproject.celery import app as project_app  # noqa: F401
from tests.support.stores import store_settings, stores_db
from tests.support.waiting import wait_until

pytestmark = [stores_db]


@pytest.fixture
def store(backend: Any, settings: Any) -> Iterator[Any]:
    """Make ``backend``'s store the one of the settings (singleton_task and the beat use
    the settings' backend)."""
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, **store_settings(backend)}
    yield backend
    # singleton_task's locks use the settings' backend from this thread: close its
    # connection, or the test database cannot be dropped at the end of the session.
    resolve_backend(None).close()


def tag() -> str:
    return uuid.uuid4().hex[:10]


# -- tasks run eagerly --------------------------------------------------------------------
@singleton_task(key="unit-{name}", ttl=2)
def whoami(name: str) -> dict[str, Any]:
    lease = current_lease()
    assert lease is not None
    return {"name": lease.name, "token": lease.token, "holder": lease.holder, "held": lease.held}


@singleton_task(key="unit-{name}", on_locked="raise")
def raises_when_locked(name: str) -> str:
    return "ran"


@singleton_task(key="unit-{name}", on_locked="retry", max_retries=2, default_retry_delay=0)
def retries_when_locked(name: str) -> str:
    return "ran"


@singleton_task(key="unit-{name}")
def fails(name: str) -> None:
    raise RuntimeError("boom")


@singleton_task(key="unit-{name}", bind=True, max_retries=3)
def retries_itself(self: Any, name: str, tokens: list[int] | None = None) -> list[int]:
    lease = current_lease()
    assert lease is not None
    tokens = [*(tokens or []), lease.token]
    if self.request.retries < 2:
        raise self.retry(kwargs={"name": name, "tokens": tokens}, countdown=0)
    return tokens


@singleton_task(key="unit-{name}", ttl=1.2)
def loses_its_lease(name: str, intruder: str) -> dict[str, Any]:
    """Has its lock force-released and taken by ``intruder`` mid-task."""
    lease = current_lease()
    assert lease is not None
    backend = resolve_backend(None)
    backend.force_release(lease.name)
    noticed = lease.lost.wait(10)  # the next renewal is refused
    wait_until(  # once the term has ended
        lambda: backend.acquire(lease.name, intruder, 30)[0],
        timeout=10,
        message=f"{intruder} could not take the lease",
    )
    try:
        lease.check()
    except LeadershipLost as exc:
        raised = str(exc)
    else:
        raised = ""
    return {"noticed": noticed, "raised": raised, "held": lease.held}


@singleton_task(key=lambda account, **kwargs: f"unit-callable-{account}-{kwargs.get('part', 0)}")
def callable_key(account: int, part: int = 0) -> str | None:
    lease = current_lease()
    return lease.name if lease else None


@singleton_task
def bare(x: int) -> str | None:
    lease = current_lease()
    return lease.name if lease else None


def hold(backend: Any, name: str, holder: str = "someone-else") -> Any:
    lease, _ = backend.acquire(name, holder, 30)
    assert lease is not None
    return lease


def test_current_lease_inside_the_task_and_released_after(store: Any) -> None:
    name = tag()
    result = whoami.apply(kwargs={"name": name})
    assert result.successful(), result.traceback
    seen = result.get()
    assert seen["name"] == f"singleton:unit-{name}"
    assert seen["held"] is True
    assert seen["holder"].startswith(f"{result.id}@")  # the execution's own identity
    assert store.read(f"singleton:unit-{name}") is None  # released
    assert current_lease() is None
    # A second run gets a new lease with a greater token.
    again = whoami.apply(args=(name,)).get()
    assert again["token"] > seen["token"]


def test_skip_returns_none_and_leaves_the_holder_alone(store: Any) -> None:
    name = tag()
    held = hold(store, f"singleton:unit-{name}")
    result = whoami.apply(args=(name,))
    assert result.successful() and result.get() is None
    current = store.read(f"singleton:unit-{name}")
    assert current is not None and (current.holder, current.token) == (held.holder, held.token)


def test_raise_raises_lease_held(store: Any) -> None:
    name = tag()
    hold(store, f"singleton:unit-{name}")
    result = raises_when_locked.apply(args=(name,))
    assert result.failed()
    assert isinstance(result.result, LeaseHeld)
    assert "someone-else" in str(result.result)


def test_retry_retries_then_gives_up_with_lease_held(store: Any) -> None:
    name = tag()
    hold(store, f"singleton:unit-{name}")
    result = retries_when_locked.apply(args=(name,))
    # Eagerly, Celery runs the retries at once; after max_retries the LeaseHeld is raised.
    assert result.failed()
    assert isinstance(result.result, LeaseHeld)


def test_retry_runs_once_the_lock_is_free(store: Any) -> None:
    name = tag()
    held = hold(store, f"singleton:unit-{name}")
    releaser = threading.Timer(0.0, store.release, args=(held,))
    attempts: list[int] = []
    original = retries_when_locked.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        attempts.append(kwargs["countdown"])
        releaser.start()  # free the lock before the (eager) retry runs
        releaser.join()
        return original(*args, **kwargs)

    retries_when_locked.retry = retry
    try:
        result = retries_when_locked.apply(args=(name,))
    finally:
        del retries_when_locked.retry
    assert result.successful() and result.get() == "ran"
    assert len(attempts) == 1
    assert 0 <= attempts[0] <= 0.0  # default_retry_delay=0 (jitter is a factor)


def test_called_directly(store: Any) -> None:
    name = tag()
    assert whoami(name)["holder"].startswith("call@")  # no task id: still locked
    assert store.read(f"singleton:unit-{name}") is None
    hold(store, f"singleton:unit-{name}")
    assert whoami(name) is None  # skip
    with pytest.raises(LeaseHeld):
        retries_when_locked(name)  # no request to retry


def test_released_when_the_task_fails(store: Any) -> None:
    name = tag()
    result = fails.apply(args=(name,))
    assert result.failed() and isinstance(result.result, RuntimeError)
    assert store.read(f"singleton:unit-{name}") is None


def test_released_before_each_retry(store: Any) -> None:
    name = tag()
    result = retries_itself.apply(kwargs={"name": name})
    assert result.successful(), result.traceback
    tokens = result.get()
    # Three executions, each acquired the lock anew: the first two released it when they
    # raised Retry (or the retry would have been skipped as locked).
    assert len(tokens) == 3 and tokens == sorted(set(tokens))
    assert store.read(f"singleton:unit-{name}") is None


def test_lost_lease_is_visible_and_release_is_owner_checked(store: Any) -> None:
    name = tag()
    intruder = f"intruder-{name}"
    result = loses_its_lease.apply(args=(name, intruder))
    assert result.successful(), result.traceback
    seen = result.get()
    assert seen["noticed"] is True and seen["held"] is False
    assert "is lost" in seen["raised"]
    # The task's late release did not free the intruder's lock.
    current = store.read(f"singleton:unit-{name}")
    assert current is not None and current.holder == intruder


def test_key_callable_and_bare_decorator(store: Any) -> None:
    assert callable_key.apply(args=(7,), kwargs={"part": 2}).get() == "singleton:unit-callable-7-2"
    assert bare.apply(args=(1,)).get() == f"singleton:{bare.name}"
    assert store.read(f"singleton:{bare.name}") is None


def test_celery_still_checks_the_arguments() -> None:
    with pytest.raises(TypeError):
        whoami.apply_async(args=("a", "b", "c"))


# -- key formatting (no store) -------------------------------------------------------------
def test_key_formatting() -> None:
    def report(customer_id: int, kind: str = "daily", *rest: Any, **options: Any) -> None: ...

    def spec(key: Any, fun: Any = report, bind: bool = False) -> Any:
        from django_leader.celery.tasks import Singleton

        return Singleton(fun, key=key, ttl=None, on_locked="skip", bind=bind, retry_delay=None)

    assert spec("r-{customer_id}-{kind}").lock_name("t", (42,), {}) == "singleton:r-42-daily"
    assert spec("r-{customer_id}-{kind}").lock_name("t", (), {"customer_id": 1, "kind": "x"}) == (
        "singleton:r-1-x"
    )
    assert spec("r-{0}").lock_name("t", (5, "weekly"), {}) == "singleton:r-5"
    assert spec("r-{region}").lock_name("t", (5,), {"region": "eu"}) == "singleton:r-eu"
    assert spec(None).lock_name("proj.tasks.report", (1,), {}) == "singleton:proj.tasks.report"
    long_name = spec("{customer_id}").lock_name("t", ("x" * 500,), {})
    assert len(long_name) == 200 and "#" in long_name
    with pytest.raises(ValueError, match="not an argument"):
        spec("r-{nope}", fun=lambda a: None)
    with pytest.raises(ValueError, match="not"):
        spec("r-{}")
    with pytest.raises(ValueError, match="cannot be formatted"):
        spec("r-{1}").lock_name("t", (1,), {})
    with pytest.raises(ValueError, match="on_locked"):
        singleton_task(on_locked="wait")(report)
    with pytest.raises(ValueError, match="ttl"):
        singleton_task(ttl=0)(report)

    def bound(self: Any, account: int) -> None: ...

    assert spec("a-{account}", fun=bound, bind=True).lock_name("t", (3,), {}) == "singleton:a-3"


def test_keys_of_different_arguments_never_make_one_lock_name() -> None:
    """A format string's values are escaped where they could pass for the text between
    two fields, and the names live apart from every other lease (issue 27, item 3)."""

    def sync(a: str, b: str) -> None: ...

    def spec(key: Any) -> Any:
        from django_leader.celery.tasks import Singleton

        return Singleton(sync, key=key, ttl=None, on_locked="skip", bind=False, retry_delay=None)

    two = spec("sync-{a}-{b}")
    names = {two.lock_name("t", args, {}) for args in [("x-y", "z"), ("x", "y-z"), ("x%2Dy", "z")]}
    assert len(names) == 3, names
    assert two.lock_name("t", ("x-y", "z"), {}) == "singleton:sync-x%2Dy-z"
    assert two.lock_name("t", ("eu west", "2026"), {}) == "singleton:sync-eu west-2026"
    # One field: nothing to confuse it with, nothing escaped.
    assert spec("{a}").lock_name("t", ("report-2026-11", ""), {}) == "singleton:report-2026-11"
    # A task publisher choosing the argument cannot name another lease (the beat's).
    assert spec("{a}").lock_name("t", ("celery-beat:proj", ""), {}) != "celery-beat:proj"
    with pytest.raises(ValueError, match="between two fields"):
        spec("{a}{b}")


def test_task_identity_names_the_execution() -> None:
    identity = task_identity("abc")
    host_pid = identity.split("@", 1)[1]
    assert identity.startswith("abc@") and host_pid.endswith(f":{__import__('os').getpid()}")
    assert len(task_identity("x" * 400)) <= 255


def test_release_abandoned_frees_only_a_dead_executions_lock(store: Any) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = tag()
    task_id = str(uuid.uuid4())
    task = whoami
    assert singleton_spec(task) is not None
    holder = f"{task_id}@{socket.gethostname()}:{dead.pid}"
    store.acquire(f"singleton:unit-{name}", holder, 30)
    # Another execution's id: not released.
    thread = release_abandoned(task, str(uuid.uuid4()), (name,), {})
    assert thread is not None
    thread.join(10)
    assert store.read(f"singleton:unit-{name}") is not None
    thread = release_abandoned(task, task_id, (name,), {})
    assert thread is not None
    thread.join(10)
    assert store.read(f"singleton:unit-{name}") is None


def test_release_abandoned_leaves_another_hosts_lock_to_expire(store: Any) -> None:
    """The pid in the holder is another host's: whether a process with that number runs
    here says nothing about it (issue 10, defect 10)."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # no such process here...
    name = tag()
    task_id = str(uuid.uuid4())
    store.acquire(
        f"singleton:unit-{name}", f"{task_id}@another-{socket.gethostname()}:{dead.pid}", 30
    )
    thread = release_abandoned(whoami, task_id, (name,), {})
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    held = store.read(f"singleton:unit-{name}")  # ...but on the other host it may well run
    assert held is not None and held.holder.startswith(f"{task_id}@another-")


def test_a_redelivered_task_waits_out_its_own_abandoned_lease(store: Any) -> None:
    """A message redelivered after its worker died (acks_late) meets the lock of its own
    dead execution: it waits for that lease to end, then runs; it is not skipped
    (issue 10, defect 6)."""
    name = tag()
    task_id = str(uuid.uuid4())
    # The dead execution ran on another host: its lease (ttl 2 s) must run out.
    abandoned = hold(store, f"singleton:unit-{name}", f"{task_id}@another-host:4242")
    store.renew(abandoned, 2)
    started = time.monotonic()
    result = whoami.apply(args=(name,), task_id=task_id)
    assert result.successful(), result.traceback
    ran = result.get()
    assert ran is not None, "the redelivered task was skipped"
    assert ran["token"] > abandoned.token
    assert time.monotonic() - started < 2 + 10
    assert store.read(f"singleton:unit-{name}") is None
    # Another task's lock is not waited for: skipped as before.
    hold(store, f"singleton:unit-{name}", f"{uuid.uuid4()}@another-host:4242")
    assert whoami.apply(args=(name,), task_id=task_id).get() is None


def test_a_redelivered_task_frees_the_lock_of_its_dead_process_on_this_host(store: Any) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = tag()
    task_id = str(uuid.uuid4())
    hold(store, f"singleton:unit-{name}", f"{task_id}@{socket.gethostname()}:{dead.pid}")
    started = time.monotonic()
    result = retries_when_locked.apply(args=(name,), task_id=task_id)
    assert result.successful(), result.traceback
    assert result.get() == "ran"
    # Released at once (the process is gone), not after the lease's 30 s.
    assert time.monotonic() - started < 10
    assert store.read(f"singleton:unit-{name}") is None


# -- the slot records -----------------------------------------------------------------------
def test_slot_records_are_fenced_by_the_lease(store: Any) -> None:
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once

    name = f"beat-{tag()}"
    slots = store.slots()
    timing = resolve_timing(30)
    old, _ = acquire_once(store, name, "old-leader", timing)
    assert old is not None
    at = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    first = Slot("every-second", at, old.token, old.holder, "task-1")
    slots.claim(old, first)
    assert slots.confirm(old, first)
    loaded = slots.load(old)
    assert loaded["every-second"].at == at
    assert loaded["every-second"].sent is True and loaded["every-second"].token == old.token

    # The lease changes hands while the old holder still believes it holds it.
    assert store.release(old)
    new, _ = acquire_once(store, name, "new-leader", timing)
    assert new is not None and new.token > old.token
    assert old.held  # its local deadline has not passed: only the store can refuse it
    with pytest.raises(LeadershipLost):
        slots.claim(
            old, Slot("every-second", at + timedelta(seconds=1), old.token, old.holder, "task-2")
        )
    assert slots.load(new)["every-second"].task_id == "task-1"

    second = Slot("every-second", at + timedelta(seconds=1), new.token, new.holder, "task-3")
    slots.claim(new, second)
    assert not slots.confirm(old, first)  # no longer the record
    assert slots.load(new)["every-second"] == second  # not confirmed yet: sent=False


@pytest.fixture(params=["postgresql", "mysql"])
def server_db_store(request: pytest.FixtureRequest, settings: Any) -> Iterator[Any]:
    """A database backend on a server (SQLite and Redis have no connection to drop), made
    the settings' backend as ``store`` does."""
    from tests.support.stores import open_store

    for backend in open_store(request.param):
        conf = dict(settings.DJANGO_LEADER)
        conf.update(BACKEND="django_leader.backends.db.DatabaseBackend", DATABASE=backend.alias)
        settings.DJANGO_LEADER = conf
        yield backend
        resolve_backend(None).close()


def test_slot_records_survive_a_connection_the_database_closed(server_db_store: Any) -> None:
    """The beat's slot records use this thread's Django connection, which no request cycle
    recycles. The database ends it (pg_terminate_backend / KILL, as a restart, a failover or
    wait_timeout would) before each kind of call: each still succeeds, on a new connection;
    a healthy connection is kept (issue 10, defect 5)."""
    import os

    from django.db import connections

    from django_leader.backends.db import DatabaseBackend
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once
    from tests.celeryprocs import kill_connections

    store = server_db_store
    assert isinstance(store, DatabaseBackend)
    connection = connections[store.alias]
    slots = store.slots()
    lease, _ = acquire_once(store, f"beat-{tag()}", "the-leader", resolve_timing(30))
    assert lease is not None
    at = datetime.now(timezone.utc)
    first = Slot("entry", at, lease.token, lease.holder, "task-1")
    slots.claim(lease, first)
    healthy = connection.connection
    assert slots.load(lease)["entry"] == first
    assert slots.confirm(lease, first)
    assert connection.connection is healthy  # not closed, nor even tested

    def kill() -> None:
        assert kill_connections(connection.settings_dict, os.getpid())

    kill()
    second = Slot("entry", at + timedelta(seconds=1), lease.token, lease.holder, "task-2")
    slots.claim(lease, second)  # (a transaction: lease.fenced())
    kill()
    assert slots.confirm(lease, second)  # (autocommit)
    kill()
    assert slots.load(lease)["entry"].task_id == "task-2"
    kill()
    assert abs((slots.now() - datetime.now(timezone.utc)).total_seconds()) < 60
    assert connection.connection is not healthy


def test_entry_key_shortens_long_names() -> None:
    assert entry_key("short") == "short"
    long_key = entry_key("e" * 300)
    assert len(long_key) == 200 and long_key != entry_key("e" * 299 + "f")


# -- LeaderScheduler, in process --------------------------------------------------------------
def beat_app(entry: str, every: float = 1.0) -> Celery:
    app = Celery("unit-beat", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        beat_schedule={entry: {"task": "unit.noop", "schedule": every}},
        beat_leader_lease=f"beat-{tag()}",
        timezone="UTC",
    )
    return app


@pytest.fixture
def beats(store: Any, settings: Any, tmp_path: Path) -> Any:
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "LEASE_TTL": 30.0,
        "RENEW_INTERVAL": 10.0,
        "RETRY_INTERVAL": 0.1,
    }
    made: list[LeaderScheduler] = []

    def make(app: Celery, label: str) -> LeaderScheduler:
        scheduler = LeaderScheduler(app, schedule_filename=str(tmp_path / label))
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


class Sent:
    """Collects what the wrapped scheduler hands to Celery's apply_async."""

    def __init__(self) -> None:
        self.messages: list[Any] = []


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    collected = Sent()

    def apply_async(inner: Any, entry: Any, producer: Any = None, **kwargs: Any) -> Any:
        collected.messages.append(entry)
        return "sent"

    monkeypatch.setattr(PersistentScheduler, "apply_async", apply_async)
    return collected


def lead(scheduler: LeaderScheduler) -> Any:
    assert scheduler.elector is not None
    assert scheduler.elector.wait_for_leadership(10), "not elected"
    scheduler.tick()  # builds the wrapped scheduler
    assert scheduler._inner is not None
    return scheduler._inner


def test_a_lazy_scheduler_does_not_campaign(store: Any, tmp_path: Path) -> None:
    app = beat_app("e")
    lease_name = app.conf.beat_leader_lease
    service = Service(app, scheduler_cls=LeaderScheduler, schedule_filename=str(tmp_path / "s"))
    banner = service.get_scheduler(lazy=True)
    assert banner.elector is None
    assert lease_name in banner.info and "PersistentScheduler" in banner.info
    time.sleep(0.2)  # nothing comes: a campaign would have taken the free lease by then
    assert store.read(lease_name) is None


def test_wrapped_scheduler_class_is_validated(settings: Any) -> None:
    assert wrapped_scheduler_class() is PersistentScheduler
    assert wrapped_scheduler_class("celery.beat.Scheduler") is Scheduler
    with pytest.raises(ImproperlyConfigured, match="cannot be imported"):
        wrapped_scheduler_class("nowhere:Nothing")
    with pytest.raises(ImproperlyConfigured, match=r"not a celery\.beat\.Scheduler"):
        wrapped_scheduler_class("django_leader.Elector")
    with pytest.raises(ImproperlyConfigured, match="is a LeaderScheduler"):
        wrapped_scheduler_class("django_leader.celery:LeaderScheduler")


def test_leader_sends_with_slot_headers_and_records_the_slot(
    beats: Any, sent: Sent, store: Any
) -> None:
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    inner = lead(scheduler)
    entry = inner.schedule["every-second"]
    entry.last_run_at = app.now() - timedelta(seconds=5)
    inner.populate_heap()
    scheduler.tick()
    assert len(sent.messages) == 1
    message = sent.messages[0]
    headers = message.options["headers"]
    lease = scheduler.elector.lease
    assert headers["django_leader_token"] == lease.token
    assert headers["django_leader_holder"] == lease.holder
    assert headers["django_leader_entry"] == "every-second"
    assert message.options["task_id"]
    record = store.slots().load(lease)["every-second"]
    assert record.at.isoformat() == headers["django_leader_slot"]
    assert record.sent is True and record.task_id == message.options["task_id"]


def test_a_new_leader_continues_from_the_recorded_slots(beats: Any, sent: Sent, store: Any) -> None:
    app = beat_app("every-minute", every=60.0)
    first = beats(app, "a")
    inner = lead(first)
    inner.schedule["every-minute"].last_run_at = app.now() - timedelta(minutes=5)
    inner.populate_heap()
    first.tick()
    assert len(sent.messages) == 1
    recorded = sent.messages[0].options["headers"]["django_leader_slot"]
    first.close()  # hands over

    second = beats(app, "b")  # its own (empty) schedule file
    inner = lead(second)
    adopted = inner.schedule["every-minute"].last_run_at
    # The recorded slot, in this beat's clock (the same clock here, give or take the
    # round trip with which each beat measured its offset from the store's).
    assert abs((adopted - datetime.fromisoformat(recorded)).total_seconds()) < 1
    second.tick()
    assert len(sent.messages) == 1  # the slot was sent already: not again


def test_a_deposed_leader_that_does_not_know_it_sends_nothing(
    beats: Any, sent: Sent, store: Any
) -> None:
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    inner = lead(scheduler)
    elector = scheduler.elector
    assert elector is not None and elector.lease is not None
    # A copy of its lease that still believes it is held (as after a pause that the
    # renewer has not caught up with), while the store gives the lease to another beat.
    ghost = dataclasses.replace(elector.lease, lost=threading.Event(), deadline=clock() + 100)
    inner._dl_lease = ghost
    elector.stop(release=True)
    taken, _ = store.acquire(ghost.name, "the-next-leader", 30)
    assert taken is not None and ghost.held
    entry = inner.schedule["every-second"]
    entry.last_run_at = app.now() - timedelta(seconds=5)
    assert inner.apply_async(entry) is None
    assert sent.messages == []  # the fenced record was refused, so nothing was sent
    assert "every-second" not in store.slots().load(taken)


def test_a_follower_builds_nothing_and_waits_in_tick(beats: Any, sent: Sent, store: Any) -> None:
    app = beat_app("every-second")
    lease_name = app.conf.beat_leader_lease
    store.acquire(lease_name, "another-beat", 30)
    scheduler = beats(app, "a")
    started = time.monotonic()
    assert scheduler.tick() == 0.0
    assert 0.05 <= time.monotonic() - started < 5
    assert scheduler._inner is None and not scheduler.is_leader
    assert not (Path(scheduler._inner_kwargs["schedule_filename"])).exists()
    assert scheduler.schedule == {}
    assert sent.messages == []


def test_losing_the_lease_stops_sending_and_the_beat_campaigns_again(
    beats: Any, sent: Sent, store: Any
) -> None:
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    lead(scheduler)
    elector = scheduler.elector
    assert elector is not None
    first = elector.lease
    assert first is not None
    first._mark_lost(LossReason.REFUSED)  # as the renewer does when a renewal is refused
    elector._wake.set()
    scheduler.tick()
    assert scheduler._inner is None or scheduler._inner._dl_lease is not first
    # It campaigns again and, the lease being free once released, leads with a new token.
    assert elector.wait_for_leadership(10)
    scheduler.tick()
    assert scheduler._inner is not None
    assert scheduler._inner._dl_lease.token > first.token


def test_close_releases_the_lease(beats: Any, store: Any) -> None:
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    lead(scheduler)
    lease_name = app.conf.beat_leader_lease
    assert store.read(lease_name) is not None
    scheduler.close()
    assert store.read(lease_name) is None
    scheduler.close()  # idempotent


# -- system checks ---------------------------------------------------------------------------
class UnfencedBackend(Backend):  # a Backend that keeps no shared slot records
    pass


def beat_checks() -> list[str]:
    from django_leader.checks import check_celery_beat

    return [message.id for message in check_celery_beat()]


def test_checks_of_the_beat_configuration(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps

    installed = {"django_celery_beat": True}
    is_installed = apps.is_installed
    # (The stores_db mark limits the available apps to django_leader's own.)
    monkeypatch.setattr(apps, "is_installed", lambda name: installed.get(name, is_installed(name)))
    assert beat_checks() == []  # the test project's configuration
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "BEAT_SCHEDULER": "nowhere:Nothing"}
    assert beat_checks() == ["django_leader.W010"]
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BEAT_SCHEDULER": "django_leader.celery:LeaderScheduler",
    }
    assert beat_checks() == ["django_leader.W010"]

    pytest.importorskip("django_celery_beat")
    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BEAT_SCHEDULER": "django_celery_beat.schedulers:DatabaseScheduler",
    }
    installed["django_celery_beat"] = False
    assert beat_checks() == ["django_leader.W011"]
    installed["django_celery_beat"] = True
    # W015 while its database is SQLite with deferred transactions (the test project's
    # default on SQLite), none with IMMEDIATE ones or another database.
    default = settings.DATABASES["default"]
    on_sqlite = default["ENGINE"].endswith("sqlite3")
    assert beat_checks() == (["django_leader.W015"] if on_sqlite else [])
    from django.db import connections

    options = {**default.get("OPTIONS", {}), "transaction_mode": "IMMEDIATE"}
    monkeypatch.setitem(connections.settings["default"], "OPTIONS", options)
    assert beat_checks() == []

    settings.DJANGO_LEADER = {
        **settings.DJANGO_LEADER,
        "BACKEND": "tests.components.test_celery.UnfencedBackend",
    }
    assert beat_checks() == ["django_leader.W012"]
    settings.CELERY_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"
    assert beat_checks() == ["django_leader.W013"]


def test_close_called_mid_tick_finishes_after_the_tick(beats: Any, sent: Sent, store: Any) -> None:
    """Beat's SIGTERM handler calls close() wherever the main thread is; in the middle of a
    tick it only stops sending, and the close() beat makes after unwinding releases."""
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    inner = lead(scheduler)
    lease_name = app.conf.beat_leader_lease
    scheduler._busy = True  # as if interrupted inside tick()
    scheduler.close()
    assert store.read(lease_name) is not None  # nothing torn down under the tick's feet
    entry = inner.schedule["every-second"]
    entry.last_run_at = app.now() - timedelta(seconds=5)
    assert inner.apply_async(entry) is None and sent.messages == []  # but nothing is sent
    scheduler._busy = False
    scheduler.close()
    assert store.read(lease_name) is None


def test_a_sigterm_swallowed_under_a_tick_still_stops_the_beat(
    beats: Any, sent: Sent, store: Any
) -> None:
    """Beat's SIGTERM handler calls close() and raises SystemExit wherever the main thread
    is; inside a store call, kazoo's bare ``except:`` around its wake-up write swallowed that
    SystemExit (seen in make test: a ZooKeeper beat ignored SIGTERM and held its lease,
    sending nothing, until it was killed). The tick raises it again once it returns, and
    beat's own close() after that releases the lease."""
    app = beat_app("every-second")
    scheduler = beats(app, "a")
    inner = lead(scheduler)
    lease_name = app.conf.beat_leader_lease
    wrapped_tick = inner.tick

    def tick_through_a_swallowing_driver(*args: Any, **kwargs: Any) -> Any:
        try:
            scheduler.close()  # beat's handler: service.sync(), then raise SystemExit()
            raise SystemExit()
        except:  # noqa: E722 - as kazoo.client.KazooClient._call does
            pass
        return wrapped_tick(*args, **kwargs)

    inner.tick = tick_through_a_swallowing_driver
    with pytest.raises(SystemExit):
        scheduler.tick()
    assert store.read(lease_name) is not None  # released by the close() after unwinding
    scheduler.close()  # what beat's Service.start does on SystemExit
    assert store.read(lease_name) is None


@pytest.mark.parametrize("skew", [-3600, 3600], ids=["behind-1h", "ahead-1h"])
def test_slot_times_are_the_stores_a_skewed_beat_clock_does_not_shift_the_schedule(
    beats: Any, sent: Sent, store: Any, skew: int
) -> None:
    """A leader whose clock is an hour off records its slots in the store's time, and the
    next leader (right clock) continues the schedule as due: neither an hour of silence
    (ahead) nor a slot sent again (behind) (issue 10, defect 10)."""
    time_machine = pytest.importorskip("time_machine")
    app = beat_app("every-two-seconds", every=2.0)
    real = datetime.now(timezone.utc)
    first = beats(app, "a")
    with time_machine.travel(real + timedelta(seconds=skew), tick=True):
        inner = lead(first)
        inner.schedule["every-two-seconds"].last_run_at = app.now() - timedelta(minutes=5)
        inner.populate_heap()
        first.tick()
        assert len(sent.messages) == 1
        lease = first.elector.lease
        assert lease is not None
        record = store.slots().load(lease)["every-two-seconds"]
        first.close()  # hands over
    assert abs((record.at - real).total_seconds()) < 60, (record.at, real)
    assert sent.messages[0].options["headers"]["django_leader_slot"] == record.at.isoformat()

    second = beats(app, "b")
    inner = lead(second)
    adopted = inner.schedule["every-two-seconds"].last_run_at
    assert abs((adopted - record.at).total_seconds()) < 1

    def next_slot_sent() -> bool:  # the beat's loop, tick after tick
        if len(sent.messages) < 2:
            second.tick()
        return len(sent.messages) >= 2

    # Due again two seconds after the recorded slot, by this beat's (right) clock: sent once.
    wait_until(
        next_slot_sent,
        timeout=15,
        interval=0.1,
        message="the next leader does not send the next slot",
    )
    gap = datetime.fromisoformat(sent.messages[1].options["headers"]["django_leader_slot"])
    assert 2.0 <= (gap - record.at).total_seconds() < 10


def test_a_task_id_with_control_characters_is_escaped_in_its_holder() -> None:
    """Whoever publishes a Celery task chooses its id: it reaches the holder escaped."""
    holder = task_identity("id\n2026 INFO forged\x1b[2J")
    assert holder.startswith("id\\n2026 INFO forged\\x1b[2J@")
    assert validate_identity(holder) == holder
