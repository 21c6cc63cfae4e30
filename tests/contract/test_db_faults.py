"""Database faults around leases (issue 10): a holder frozen inside ``lease.fenced()``, a
Django connection dropped by the server, a lease row deleted by hand, a server that never
answers.

Faults are real: the holder is another process stopped with SIGSTOP, connections are killed
on the server (``pg_terminate_backend``, MariaDB's ``KILL``; only this test's own), rows are
deleted with SQL, and the silent server is a listening socket that never answers.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connections

from django_leader import BackendUnavailable, LeadershipLost
from django_leader.backends.db import FENCE_FLOOR, DatabaseBackend
from django_leader.lease import Lease, clock
from django_leader.models import LeaseEvent
from tests.support import procfs
from tests.support.stores import DATABASE_STORES, require, stores_db
from tests.support.waiting import wait_until

pytestmark = stores_db

ROOT = Path(__file__).resolve().parents[2]
SERVER_DATABASES = ["postgresql", "mysql"]
TTL = 3.0
RETRY = 0.2
#: Starting a child (Python + Django) and hearing from it; any other wait for it.
STARTUP = 30.0
PATIENCE = 10.0


@pytest.fixture(params=SERVER_DATABASES)
def server_alias(request: pytest.FixtureRequest) -> str:
    alias = DATABASE_STORES[request.param]
    require(alias)
    return alias


def held(backend: DatabaseBackend, name: str, holder: str, ttl: float = TTL) -> Lease:
    """Acquire ``name`` and give the lease the local deadline an Elector would."""
    sent = clock()
    lease, _ = backend.acquire(name, holder, ttl)
    assert lease is not None
    lease.deadline = sent + ttl * 0.8
    lease._fence = backend.fenced  # held: what a term attaches (django_leader.term)
    return lease


# -- A: a holder frozen inside fenced() ------------------------------------------------------

FROZEN_HOLDER = r"""
import os, signal
from tests.procs.common import db_alias, emit, make_backend, setup_django
setup_django()
from django_leader.lease import clock
from testproject.demoapp.models import FencedWrite
backend = make_backend()
ttl = float(os.environ["DL_MP_TTL"])
sent = clock()
lease, _ = backend.acquire(os.environ["DL_MP_LEASE"], "frozen", ttl)
assert lease is not None
lease.deadline = sent + ttl * 0.8
lease._fence = backend.fenced
try:
    with lease.fenced():
        FencedWrite.objects.using(db_alias()).create(writer="frozen", token=lease.token)
        emit("freezing", token=lease.token)
        os.kill(os.getpid(), signal.SIGSTOP)
        emit("resumed")
    emit("outcome", result="committed")
except BaseException as exc:
    emit("outcome", result=f"{type(exc).__name__}: {exc}")
"""


class Holder:
    """The frozen holder process and its reports."""

    def __init__(self, alias: str, name: str, tmp_path: Path) -> None:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="testproject.settings",
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            PYTHONUNBUFFERED="1",
            DL_MP_STORE="database",
            DL_MP_ALIAS=alias,
            DL_MP_DB_ALIAS=alias,
            DL_MP_DB_NAME=str(connections[alias].settings_dict["NAME"]),
            DJANGO_LEADER_TEST_DB_NAMES=json.dumps(
                {a: str(connections[a].settings_dict["NAME"]) for a in connections.settings}
            ),
            DL_MP_LEASE=name,
            DL_MP_TTL=str(TTL),
        )
        self.stderr_path = tmp_path / "holder.stderr"
        with self.stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", FROZEN_HOLDER],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put({"ev": "eof"})

    def wait_for(self, ev: str, timeout: float) -> dict[str, Any]:
        give_up = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, give_up - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {ev!r} from the holder; stderr:\n{self.stderr()}"
                ) from None
            if event["ev"] == ev:
                return event
            assert event["ev"] != "eof", f"holder ended before {ev!r}; stderr:\n{self.stderr()}"

    def stopped(self) -> bool:
        return procfs.state(f"/proc/{self.proc.pid}/stat") == "T"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=PATIENCE)


@pytest.fixture
def frozen_holder(server_alias: str, lease_name: str, tmp_path: Path) -> Iterator[Holder]:
    holder = Holder(server_alias, lease_name, tmp_path)
    try:
        yield holder
    finally:
        holder.kill()


def test_holder_frozen_inside_fenced_does_not_block_takeover(
    server_alias: str, lease_name: str, frozen_holder: Holder
) -> None:
    from testproject.demoapp.models import FencedWrite

    freezing = frozen_holder.wait_for("freezing", STARTUP)
    wait_until(
        frozen_holder.stopped, timeout=PATIENCE, interval=0.01, message="the holder did not stop"
    )

    # The holder sits stopped in its open transaction, the lease row locked. The server
    # must end that transaction by the end of the lease; then the follower takes over.
    follower = DatabaseBackend(server_alias, timeout=1.0)
    bound = TTL + RETRY + FENCE_FLOOR + 5.0
    errors: list[str] = []

    def taken_over() -> Lease | None:
        try:
            return follower.acquire(lease_name, "follower", TTL)[0]
        except BackendUnavailable as exc:
            errors.append(str(exc))
            return None

    try:
        lease = wait_until(
            taken_over,
            timeout=bound,
            interval=RETRY,
            message=lambda: (
                f"no takeover of a holder frozen inside fenced(); last errors: {errors[-2:]}"
            ),
        )
        assert lease.token == freezing["token"] + 1
    finally:
        follower.close()

    # Resumed, the frozen holder's transaction is gone: its write never commits.
    os.kill(frozen_holder.proc.pid, signal.SIGCONT)
    outcome = frozen_holder.wait_for("outcome", PATIENCE)
    assert outcome["result"] != "committed"
    assert not FencedWrite.objects.using(server_alias).filter(writer="frozen").exists()


def test_a_lease_transaction_whose_client_went_silent_is_aborted_by_the_server(
    server_alias: str, lease_name: str
) -> None:
    """A holder's lease statement is a transaction on its private connection (MySQL's
    renewal: lock the rows, update them, commit); a holder cut off half-way (a partition,
    a frozen process) keeps the row locked until the server ends that transaction. The
    server must, within about the call timeout: here the holder's connection locks the row
    and then says nothing, as a cut-off client would. On MariaDB the row stayed locked (for
    ``wait_timeout``, 8 hours): the chaos run of 27 November saw no leader for 6.85 s after
    a partition of the leader, every candidate's acquisition failing with "Lock wait
    timeout exceeded", until TCP carried the cut-off client's FIN after the heal."""
    holder = DatabaseBackend(server_alias, timeout=0.5)
    taker = DatabaseBackend(server_alias, timeout=0.5)
    lease, _ = holder.acquire(lease_name, "holder", 1.0)
    assert lease is not None
    locked, done = threading.Event(), threading.Event()

    def go_silent() -> None:
        wrapper = holder._private.get()
        try:
            wrapper.set_autocommit(False)
            with wrapper.cursor() as cursor:
                cursor.execute(
                    "SELECT token FROM django_leader_lease WHERE name = %s FOR UPDATE",
                    [lease_name],
                )
                locked.set()
                done.wait(PATIENCE + 5)  # a client cut off: nothing more is sent
        finally:
            holder.close()

    silent = threading.Thread(target=go_silent)
    silent.start()
    try:
        assert locked.wait(PATIENCE)
        locked_at = time.monotonic()
        taken = None
        while taken is None and time.monotonic() - locked_at < PATIENCE:
            with suppress(BackendUnavailable):  # the row still locked: "Lock wait timeout"
                taken, _ = taker.acquire(lease_name, "taker", 1.0)
            if taken is None:
                time.sleep(RETRY)
        assert taken is not None, f"the row stayed locked for {PATIENCE}s"
        # The lease (ttl 1 s) expired first; then the server's bound on the idle
        # transaction: MariaDB's idle_transaction_timeout (1 s here), PostgreSQL's
        # idle_in_transaction_session_timeout (4 x 0.5 s).
        print(f"taken {time.monotonic() - locked_at:.2f}s after the holder went silent")
    finally:
        done.set()
        silent.join(PATIENCE + 10)
        taker.close()


def test_slow_holder_past_its_deadline_does_not_commit(db_alias: str, lease_name: str) -> None:
    """A holder whose local deadline passes inside fenced() (slow, not frozen) is refused
    at the end of the block: its writes are rolled back (the only bound SQLite has)."""
    from testproject.demoapp.models import FencedWrite

    backend = DatabaseBackend(db_alias)
    try:
        lease = held(backend, lease_name, "slow")
        with pytest.raises(LeadershipLost), lease.fenced():
            FencedWrite.objects.using(db_alias).create(writer="slow", token=lease.token)
            lease.deadline = clock()  # as if the work had taken the whole lease
        assert not FencedWrite.objects.using(db_alias).filter(writer="slow").exists()
    finally:
        backend.close()


def test_fenced_holds_off_a_takeover_only_within_the_lease(db_alias: str, lease_name: str) -> None:
    """While a fenced transaction is open within the lease nobody can take the lease (the
    row is locked); once the block outlives the lease, it commits nothing."""
    from testproject.demoapp.models import FencedWrite

    backend = DatabaseBackend(db_alias)
    outcome: list[Any] = []

    def take() -> None:
        other = DatabaseBackend(db_alias)
        try:
            outcome.append(other.acquire(lease_name, "bob", 30)[0])
        except BackendUnavailable as exc:
            outcome.append(exc)
        finally:
            other.close()

    thief = threading.Thread(target=take)
    try:
        lease = held(backend, lease_name, "alice", ttl=TTL)
        with pytest.raises(LeadershipLost), lease.fenced():
            FencedWrite.objects.using(db_alias).create(writer="alice", token=lease.token)
            thief.start()
            thief.join(0.5)
            # Blocked behind our row lock, failed, or refused: never taken while we write.
            assert thief.is_alive() or not isinstance(outcome[0], Lease)
            # The work takes longer than the lease.
            wait_until(lambda: not lease.held, timeout=PATIENCE, message="still held")
        assert not FencedWrite.objects.using(db_alias).filter(writer="alice").exists()
    finally:
        thief.join(PATIENCE)
        backend.close()


# -- B: the caller's connection dropped by the server ----------------------------------------


def kill_django_connection(backend: DatabaseBackend) -> None:
    """Kill, on the server, this thread's Django connection of the backend's alias (and
    only it), from the backend's private connection."""
    connection = connections[backend.alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
        victim = int(cursor.fetchone()[0])
    with backend._cursor(atomic=False) as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [victim])
            assert cursor.fetchone()[0] is True
        else:
            cursor.execute(f"KILL {victim}")


def test_fenced_recovers_after_the_server_drops_the_connection(
    server_alias: str, lease_name: str
) -> None:
    """The first fenced() after the drop fails (nothing tells the client before it uses the
    dead socket; nothing was committed); the next one reconnects and succeeds."""
    from testproject.demoapp.models import FencedWrite

    backend = DatabaseBackend(server_alias)
    try:
        lease = held(backend, lease_name, "me", ttl=30.0)
        with lease.fenced():
            FencedWrite.objects.using(server_alias).create(writer="me", token=lease.token)
        kill_django_connection(backend)

        with pytest.raises(DatabaseError), lease.fenced():  # the driver's error, wrapped
            FencedWrite.objects.using(server_alias).create(writer="lost", token=lease.token)
        for _ in range(3):  # once more: a connection that stays dead fails every time
            with lease.fenced():
                FencedWrite.objects.using(server_alias).create(writer="me", token=lease.token)
        rows = FencedWrite.objects.using(server_alias).values_list("writer", flat=True)
        assert sorted(rows) == ["me"] * 4
    finally:
        backend.close()


# -- C: a lease row deleted by hand ----------------------------------------------------------


def delete_row(alias: str, name: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("DELETE FROM django_leader_lease WHERE name = %s", [name])


def test_deleted_row_is_held_by_nobody_for_the_lock_delay(
    db_alias: str, lease_name: str, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "LOCK_DELAY": 1.0}
    backend = DatabaseBackend(db_alias)
    try:
        first = held(backend, lease_name, "first", ttl=1.0)
        delete_row(db_alias, lease_name)

        # "first" may still believe it leads: nobody may take the lease for the lock-delay.
        with caplog.at_level("WARNING", logger="django_leader"):
            assert backend.acquire(lease_name, "second", 1.0) == (None, None)
            assert backend.acquire(lease_name, "third", 1.0) == (None, None)
        warnings = [r for r in caplog.records if "lock-delay" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert backend.read(lease_name) is None

        second = wait_until(
            lambda: backend.acquire(lease_name, "second", 1.0)[0],
            timeout=1.0 + 10.0,
            message="never acquired after the lock-delay",
        )
        assert second.token == first.token + 1
        # The lock-delay was served: the term began after first's whole ttl.
        assert first.acquired_at is not None and second.acquired_at is not None
        assert (second.acquired_at - first.acquired_at).total_seconds() >= 1.0
    finally:
        backend.close()


def test_deleted_row_of_a_released_lease_is_free_at_once(
    db_alias: str, lease_name: str, settings: Any
) -> None:
    # The last term ended in release(): nobody can still believe it leads, no lock-delay.
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "LOCK_DELAY": 300.0}
    backend = DatabaseBackend(db_alias)
    try:
        first = held(backend, lease_name, "first", ttl=TTL)
        assert backend.release(first)
        delete_row(db_alias, lease_name)
        second, current = backend.acquire(lease_name, "second", TTL)
        assert second is not None and current == second
        assert second.token == first.token + 1
        kinds = list(
            LeaseEvent.objects.using(db_alias)
            .filter(name=lease_name)
            .order_by("token", "id")
            .values_list("kind", "token")
        )
        assert kinds == [
            ("acquired", first.token),
            ("released", first.token),
            ("acquired", second.token),
        ]

        # A force-released term is different: its holder may not know yet.
        assert backend.force_release(lease_name, actor="ops") is not None
        delete_row(db_alias, lease_name)
        assert backend.acquire(lease_name, "third", TTL) == (None, None)
    finally:
        backend.close()


def test_tokens_do_not_restart_without_history(
    db_alias: str, lease_name: str, settings: Any
) -> None:
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "HISTORY": False}
    backend = DatabaseBackend(db_alias)
    try:
        first, _ = backend.acquire(lease_name, "first", TTL)
        assert first is not None
        assert backend.release(first)
        delete_row(db_alias, lease_name)
        second, _ = backend.acquire(lease_name, "second", TTL)
        assert second is not None
        assert second.token > first.token
        # Seeded from the server clock in microseconds: a token issued after 2020.
        assert first.token > 1_577_836_800 * 10**6
    finally:
        backend.close()


# -- D: a server that never answers ----------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) but never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_silent_server_is_unavailable_within_bound(
    server_alias: str, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeout = 1.0
    backend = DatabaseBackend(server_alias, timeout=timeout)
    settings_dict = connections[server_alias].settings_dict
    monkeypatch.setitem(settings_dict, "HOST", "127.0.0.1")
    monkeypatch.setitem(settings_dict, "PORT", str(silent_port))
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            backend.read(f"silent-{uuid.uuid4().hex[:6]}")
        elapsed = time.monotonic() - started
        # The drivers' floors (libpq's connect_timeout: 2 s), with room to spare.
        assert elapsed < 2.0 + 3.0, elapsed
    finally:
        backend.close()
