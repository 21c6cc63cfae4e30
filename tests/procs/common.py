"""Bootstrap and I/O shared by the child processes.

The parent passes in the environment:

``DL_MP_STORE``
    ``database`` (leases in a database, :class:`DatabaseBackend`), ``cache`` (leases in
    Redis through a Django cache, :class:`CacheBackend`) or ``zookeeper`` (leases in
    ZooKeeper, :class:`ZooKeeperBackend`);
``DL_MP_ALIAS``
    the alias of that store: a database alias (``default``, ``postgresql``, ``mysql``), a
    cache alias (``redis``, ``django_redis``) or, for ZooKeeper, its connection string
    (``hosts``);
``DL_MP_ZOOKEEPER_ROOT``
    for ZooKeeper, the root the parent's backend uses;
``DL_MP_DB_ALIAS``
    the database the child writes rows to: the store itself for a database store, the
    history database (``DJANGO_LEADER["DATABASE"]``) for Redis and ZooKeeper; fenced
    writes go there too;
``DL_MP_DB_NAME``
    the ``NAME`` of the test database pytest-django created for that alias (for SQLite, the
    file's path), so that the child works on the very database the test reads;
``DJANGO_LEADER_TEST_DB_NAMES``
    the same for every database alias (applied by the settings), so that no child ever
    touches a database that is not this run's test database.

Every event is one JSON object per stdout line: ``{"ev": kind, "t": time.time(),
"mono": time.monotonic(), "clock": ..., "pid": ..., ...}``. Wall-clock stamps are comparable
between processes of this machine, and with the server times of a local database; ``clock``
is :func:`clock`, the lease clock (``CLOCK_BOOTTIME`` on Linux, one clock for every process
of the machine, which no one sets), comparable between processes too and never stepped.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_leader import Lease
    from django_leader.backends.base import Backend

# Re-entrant: a signal handler may emit while the main thread is inside emit().
_out = threading.RLock()


def setup_django() -> str:
    """Point Django at the parent's test databases and set it up; return the store's alias
    (a database alias, for ``DL_MP_STORE=cache`` a cache alias, for ``zookeeper`` the
    hosts)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django
    from django.conf import settings

    kind = store_kind()
    alias = os.environ["DL_MP_ALIAS"]
    configured = {"database": settings.DATABASES, "cache": settings.CACHES}.get(kind)
    if configured is not None and alias not in configured:
        emit("fatal", error=f"{kind} alias {alias!r} is not configured in this process")
        os._exit(3)
    database = db_alias()
    if database not in settings.DATABASES:
        emit("fatal", error=f"database alias {database!r} is not configured in this process")
        os._exit(3)
    # The alias exists here as in the parent; only its NAME differs: pytest-django gave the
    # parent a test database, and this process must use the same one.
    settings.DATABASES[database]["NAME"] = os.environ["DL_MP_DB_NAME"]
    django.setup()
    return alias


def store_kind() -> str:
    """``database``, ``cache`` or ``zookeeper``: where this child's leases live."""
    kind = os.environ.get("DL_MP_STORE", "database")
    if kind not in ("database", "cache", "zookeeper"):
        emit("fatal", error=f"unknown DL_MP_STORE {kind!r}")
        os._exit(3)
    return kind


def db_alias() -> str:
    """The database this child writes rows to (fenced writes; history of a cache store)."""
    return os.environ.get("DL_MP_DB_ALIAS", os.environ["DL_MP_ALIAS"])


def make_backend() -> Backend:
    """The backend of the store under test (after :func:`setup_django`)."""
    alias = os.environ["DL_MP_ALIAS"]
    kind = store_kind()
    backend: Backend
    if kind == "database":
        from django_leader.backends.db import DatabaseBackend

        return DatabaseBackend(alias)
    if kind == "cache":
        from django_leader.backends.cache import CacheBackend

        backend = CacheBackend(alias)
    else:
        from django_leader.backends.zookeeper import ZooKeeperBackend

        # The parent's ensemble and root; the session timeout is the settings' LEASE_TTL
        # (DJANGO_LEADER_TTL), as for any user of the backend.
        backend = ZooKeeperBackend(hosts=alias, root=os.environ["DL_MP_ZOOKEEPER_ROOT"])
    # Its history goes to the database whose test NAME this process was given.
    if backend.history_database != db_alias():
        emit(
            "fatal",
            error=f"history goes to {backend.history_database!r}, "
            f"not to DL_MP_DB_ALIAS {db_alias()!r}",
        )
        os._exit(3)
    return backend


def elector_options() -> dict[str, Any]:
    """The Elector options of a scheduler instance (``tests/support/scheduler_runs.py``):
    the lease ``DL_MP_LEASE``, the timing ``DL_MP_TTL``/``RENEW``/``RETRY``, the identity,
    the store, and ``elected``/``lost`` reported."""
    return {
        "name": os.environ["DL_MP_LEASE"],
        "ttl": float(os.environ["DL_MP_TTL"]),
        "renew_interval": float(os.environ["DL_MP_RENEW"]),
        "retry_interval": float(os.environ["DL_MP_RETRY"]),
        "identity": os.environ["DL_MP_IDENTITY"],
        "backend": make_backend(),
        "on_elected": lambda lease: emit("elected", token=lease.token),
        "on_lost": lambda lease: emit("lost", token=lease.token),
    }


def clock() -> float:
    """``django_leader.lease.clock()`` (importable before Django is set up)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def emit(ev: str, **fields: Any) -> None:
    """Report one event to the parent."""
    record = {
        "ev": ev,
        "t": time.time(),
        "mono": time.monotonic(),
        "clock": clock(),
        "pid": os.getpid(),
        **fields,
    }
    line = json.dumps(record, default=str)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def wall(instant: float) -> float:
    """The ``time.time()`` that corresponds to an instant of the lease clock
    (``django_leader.lease.clock()``, in which ``Lease.deadline`` is given)."""
    from django_leader.lease import clock

    return time.time() + (instant - clock())


def epoch(value: Any) -> float | None:
    return None if value is None else value.timestamp()


def lease_fields(lease: Lease) -> dict[str, Any]:
    """What the parent needs to know about a lease: server times as epoch seconds, and the
    local deadline (monotonic) converted to wall-clock time."""
    return {
        "name": lease.name,
        "holder": lease.holder,
        "token": lease.token,
        "previous_holder": lease.previous_holder,
        "acquired_at": epoch(lease.acquired_at),
        "renewed_at": epoch(lease.renewed_at),
        "expires_at": epoch(lease.expires_at),
        "deadline_wall": None if lease.deadline is None else wall(lease.deadline),
    }


def commands() -> Iterator[dict[str, Any]]:
    """The parent's commands, one JSON object per stdin line, until stdin closes.

    Call it from the main thread. It waits for stdin with ``select()`` on a signal wake-up
    pipe too: a Python signal handler runs only when the main thread runs Python code, and
    the kernel may deliver a signal (SIGTERM) to any thread of the process — one of the
    Elector's — leaving a main thread blocked in ``read()`` unaware of it for good."""
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([stdin, woken], [], [])
        if woken in ready:
            # A signal arrived: its handler runs now that this thread runs Python again.
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 512)
        if stdin not in ready:
            continue
        chunk = os.read(stdin, 65536)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
        if not chunk:  # closed
            if pending.strip():
                yield json.loads(pending)
            return


#: How long a freeze waits for the history writer's queue to empty first (seconds).
FREEZE_FLUSH_TIMEOUT = 10.0


class Freezer:
    """SIGSTOPs this process, once :attr:`armed`, from the store thread itself as the next
    renewal returns: no store call is in flight then. Stopped from another thread, the
    process could stop inside the store call that follows each renewal (the leader reads
    the candidates' registry), and a SQLite reader stopped mid-statement keeps every writer
    of the file out. :attr:`report` gives what ``freezing`` and ``resumed`` say."""

    def __init__(self, backend: Backend, quiet: threading.Lock | None = None) -> None:
        #: Held by the process's own store work (a fenced write) while it runs: the stop
        #: waits for it, so that no transaction of that work is open while stopped.
        self.quiet = quiet or threading.Lock()
        self.backend = backend
        self.armed = threading.Event()
        self.report: Callable[[], dict[str, Any]] = dict
        for method in ("renew", "renew_many"):
            setattr(backend, method, self._wrap(getattr(backend, method)))

    def _wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def renewing(*args: Any, **kwargs: Any) -> Any:
            try:
                return call(*args, **kwargs)
            finally:
                if self.armed.is_set():
                    self.armed.clear()
                    self._stop()

        return renewing

    def _stop(self) -> None:
        with self.quiet:
            # The history writer's thread too: stopped inside its INSERT into a SQLite
            # file (a Redis or ZooKeeper store's history), it kept every writer of that
            # file out, the new leader's fenced write included (make test, once).
            self.backend.flush_history(FREEZE_FLUSH_TIMEOUT)
            emit("freezing", **self.report())
            before = time.monotonic()
            # Directed at this thread, SIGSTOP stops it (and the whole process) before the
            # call returns; the renewal's answer is applied after SIGCONT.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        # First thing after SIGCONT: what the lease says now (its deadline alone).
        emit("resumed", stopped_for=time.monotonic() - before, **self.report())


def elector_state(elector: Any) -> Callable[[], dict[str, Any]]:
    """A :attr:`Freezer.report` for an Elector or AsyncElector: its lease's fields, and
    ``is_leader``, ``held`` and ``lost`` (on resuming from the store thread, before the
    renewal's answer is applied: what the local deadline alone says)."""

    def report() -> dict[str, Any]:
        lease = elector.lease
        fields = {} if lease is None else lease_fields(lease)
        held = lease is not None and lease.held
        lost = lease is not None and lease.lost.is_set()
        return {**fields, "is_leader": elector.is_leader, "held": held, "lost": lost}

    return report
