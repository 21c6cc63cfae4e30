"""No store call of lock() or of the Elector is unbounded (docs/api.md, "Bounded store calls").

A store whose connection freezes (a PostgreSQL backend process stopped with SIGSTOP, a TCP
peer that accepts and never answers: libpq has no read timeout) must not hang lock() nor
the Elector, and the next call must not queue behind the hung one. The faults are real: a
TCP proxy made by the test stops forwarding (the store itself answers every other
connection), or the test SIGSTOPs the PostgreSQL server process of one of its own
connections (never the whole shared server).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created

from django_leader import BackendUnavailable, Elector, LeaseHeld, lock
from django_leader.backends.base import Backend
from django_leader.backends.db import DatabaseBackend
from tests.support.stores import history, require, stores_db
from tests.support.waiting import in_thread, wait_until

pytestmark = stores_db

WAIT = 10.0  # generous bound for anything that should happen "soon"
TTL = 1.5


class FreezingProxy:
    """A TCP proxy to a real server that can stop answering, as a frozen server does.

    ``freeze_existing()``: the connections made so far stop forwarding (their sockets stay
    open: the client's kernel sees the data acknowledged, and no answer ever comes), while
    new connections still reach the server. ``freeze()``: the same, and new connections are
    accepted but never answered.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._pairs: list[tuple[threading.Event, socket.socket]] = []  # (frozen, waker)
        self._frozen_new = False
        self._pending: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="freezing-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    client.close()
                    return
                self._sockets.append(client)
                if self._frozen_new:
                    self._pending.append(client)  # accepted, not answered (yet)
                    continue
                self._forward(client)

    def _forward(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream, timeout=WAIT)
        upstream.settimeout(None)
        wake_r, wake_w = socket.socketpair()
        self._sockets += [upstream, wake_r, wake_w]
        frozen = threading.Event()
        self._pairs.append((frozen, wake_w))
        threading.Thread(
            target=self._pump, args=(client, upstream, wake_r, frozen), daemon=True
        ).start()

    def answer_new(self) -> None:
        """New connections reach the server again, those accepted meanwhile included
        (what they sent waited in their socket)."""
        with self._lock:
            self._frozen_new = False
            pending, self._pending = self._pending, []
            for client in pending:
                self._forward(client)

    @staticmethod
    def _pump(
        a: socket.socket, b: socket.socket, wake: socket.socket, frozen: threading.Event
    ) -> None:
        peer = {a: b, b: a}
        with contextlib.suppress(OSError, ValueError):
            while not frozen.is_set():
                ready, _, _ = select.select([a, b, wake], [], [])
                if frozen.is_set() or wake in ready:
                    return  # stop forwarding; the sockets stay open
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)

    def freeze_existing(self) -> None:
        with self._lock:
            for frozen, wake in self._pairs:
                frozen.set()
                with contextlib.suppress(OSError):
                    wake.send(b"x")

    def freeze(self) -> None:
        with self._lock:
            self._frozen_new = True
        self.freeze_existing()

    def close(self) -> None:
        """Close every socket: what hangs on them fails at once."""
        self.freeze()
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self.listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class ProxiedBackend(DatabaseBackend):
    """A DatabaseBackend on ``alias`` whose connections go through a :class:`FreezingProxy`."""

    def __init__(self, alias: str, port: int, timeout: float | None = None) -> None:
        super().__init__(alias, timeout=timeout)
        self.port = port

    def _connection(self) -> Any:
        wrapper = super()._connection()
        if wrapper.connection is None:  # not connected yet: connect through the proxy
            wrapper.settings_dict.update(HOST="127.0.0.1", PORT=str(self.port))
        return wrapper


def proxied_database(alias: str) -> Iterator[tuple[ProxiedBackend, FreezingProxy]]:
    require(alias)
    settings_dict = connections[alias].settings_dict
    proxy = FreezingProxy(settings_dict["HOST"] or "127.0.0.1", int(settings_dict["PORT"]))
    try:
        yield ProxiedBackend(alias, proxy.port), proxy
    finally:
        proxy.close()


@pytest.fixture(params=["postgresql", "mysql"])
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[ProxiedBackend, FreezingProxy]]:
    """A database backend whose connections go through a FreezingProxy."""
    yield from proxied_database(request.param)


@pytest.fixture(params=["postgresql", "mysql", "redis"])
def proxied_store(
    request: pytest.FixtureRequest, settings: Any
) -> Iterator[tuple[Backend, FreezingProxy]]:
    """A backend of each store through a FreezingProxy (Redis: a cache alias on its port)."""
    if request.param != "redis":
        yield from proxied_database(request.param)
        return
    from django_leader.backends.cache import CacheBackend

    proxy = proxied_redis(settings)
    try:
        yield CacheBackend("frozen-redis"), proxy
    finally:
        proxy.close()


def proxied_redis(settings: Any) -> FreezingProxy:
    """A FreezingProxy in front of the test Redis, and the cache alias ``frozen-redis``
    on it (in ``settings``, pytest-django's fixture)."""
    require("redis", kind="cache")
    real = settings.CACHES["redis"]
    host, port = real["LOCATION"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = FreezingProxy(host, int(port))
    settings.CACHES = {
        **settings.CACHES,
        "frozen-redis": {
            **real,
            "LOCATION": f"redis://127.0.0.1:{proxy.port}/9",
            "KEY_PREFIX": "django_leader_test_frozen",
        },
    }
    return proxy


def renewed(lease: Any) -> Callable[[], bool]:
    first = lease.expires_at
    return lambda: lease.expires_at != first or lease.lost.is_set()


def test_lock_does_not_hang_on_a_frozen_server(
    proxied_store: tuple[Backend, FreezingProxy], lease_name: str
) -> None:
    store, proxy = proxied_store

    def scenario() -> Any:
        with lock(lease_name, ttl=2, backend=store):
            pass  # the store answered: connections are open
        proxy.freeze()
        with lock(f"{lease_name}-2", ttl=2, blocking=False, backend=store):
            return "entered"

    thread, outcome = in_thread(scenario)
    thread.join(WAIT)
    assert not thread.is_alive(), "lock() hung on a frozen server"
    assert len(outcome) == 1 and isinstance(outcome[0], (BackendUnavailable, LeaseHeld)), outcome


def test_redis_lock_calls_in_its_own_thread_bounded_by_the_driver(
    settings: Any, lease_name: str
) -> None:
    """A Redis backend whose driver bounds every call (its socket timeouts, 0.3 s here)
    runs a lock's acquire and release in the lock's own thread, with no hand-off to the
    session's store thread (issue 30: two hand-offs per lock() cost more than the round
    trips). Frozen, the server makes lock() fail within the driver's bound all the same."""
    from django_leader.backends.cache import CacheBackend

    proxy = proxied_redis(settings)
    store = CacheBackend("frozen-redis", timeout=0.3)
    assert store.driver_bound == pytest.approx(0.9)
    threads: list[str] = []
    acquire, release = store.acquire, store.release

    def noted(call: Callable[..., Any]) -> Callable[..., Any]:
        def made(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            return call(*args)

        return made

    store.acquire, store.release = noted(acquire), noted(release)  # type: ignore[method-assign]
    try:
        with lock(lease_name, ttl=15, backend=store) as lease:
            assert lease.held
        assert threads == [threading.current_thread().name] * 2, threads
        proxy.freeze()
        started = time.monotonic()
        with (
            pytest.raises(BackendUnavailable),
            lock(lease_name, ttl=15, blocking=False, backend=store),
        ):
            pass
        # The driver's bound (a pool wait, a connect, the answer: 3 x 0.3 s), and slack
        # for a loaded machine; the lock's own bound would be 13.5 s.
        assert time.monotonic() - started < 0.9 + 2.0
    finally:
        proxy.close()
        store.close()


def test_acquisition_given_up_then_answered_late_is_handed_back(
    proxied: tuple[ProxiedBackend, FreezingProxy], lease_name: str
) -> None:
    """lock() gives up on an acquisition the store has not answered; when the store
    answers after all (and grants it), the lease is released at once, not held."""
    _, proxy = proxied
    # The store's own timeouts (connect, statement) far longer than lock()'s bound.
    slow = ProxiedBackend(proxied[0].alias, proxy.port, timeout=60)
    direct = DatabaseBackend(proxied[0].alias)
    other, _ = direct.acquire(lease_name, "other", 60)
    assert other is not None
    proxy.freeze()

    def attempt() -> Any:
        with lock(lease_name, ttl=2, blocking=False, identity="late", backend=slow):
            return "entered"

    thread, outcome = in_thread(attempt)
    thread.join(WAIT)
    assert not thread.is_alive(), "lock() hung on a frozen server"
    assert len(outcome) == 1 and isinstance(outcome[0], BackendUnavailable), outcome
    assert direct.release(other)
    proxy.answer_new()  # the attempt reaches the store now, and wins the free lease

    def kinds() -> list[tuple[str, str]]:
        return [event[:2] for event in history(direct, lease_name)]

    handed_back = [("acquired", "other"), ("released", "other")]
    handed_back += [("acquired", "late"), ("released", "late")]
    wait_until(lambda: kinds() == handed_back, timeout=WAIT, message=kinds)
    assert direct.read(lease_name) is None
    direct.close()


def test_lock_exit_does_not_hang_after_its_connection_froze(
    proxied_store: tuple[Backend, FreezingProxy], lease_name: str
) -> None:
    """The connections in use freeze (new ones still work): the lease is lost at its
    deadline, the block's exit returns, and the next lock() is served on a new connection."""
    store, proxy = proxied_store

    def scenario() -> Any:
        with lock(lease_name, ttl=TTL, backend=store) as lease:
            wait_until(renewed(lease), timeout=WAIT, message="no renewal")
            proxy.freeze_existing()
            assert lease.lost.wait(WAIT), "lease not lost although its renewals hang"
        with lock(lease_name, ttl=TTL, timeout=WAIT, backend=store) as again:
            return again.token > lease.token

    thread, outcome = in_thread(scenario)
    thread.join(3 * WAIT)
    assert not thread.is_alive(), "lock() hung on a frozen connection"
    assert outcome == [True]


def test_elector_is_elected_again_while_its_old_connection_stays_frozen(
    proxied_store: tuple[Backend, FreezingProxy], lease_name: str
) -> None:
    store, proxy = proxied_store
    elector = Elector(lease_name, backend=store, ttl=TTL, renew_interval=0.3, retry_interval=0.1)
    elector.start()
    try:
        assert elector.wait_for_leadership(WAIT)
        first = elector.lease
        assert first is not None
        wait_until(renewed(first), timeout=WAIT, message="no renewal")
        # Renewals hang on the frozen connection. Should another call have been running
        # on it (the campaign's registry reads), the session moved the renewals to a new
        # connection — as it must — and they succeed there: freeze that one too.
        give_up = time.monotonic() + WAIT
        while not first.lost.is_set() and time.monotonic() < give_up:
            proxy.freeze_existing()
            first.lost.wait(TTL)
        assert first.lost.is_set(), "leadership not lost although renewals hang"
        # The campaign must not queue behind the hung renewal: it runs on a new
        # connection, and wins once the store expired the old lease.
        wait_until(
            lambda: elector.lease is not None, timeout=3 * WAIT, message="never elected again"
        )
        assert elector.lease is not None and elector.lease.token > first.token
    finally:
        stopped, _ = in_thread(lambda: elector.stop(timeout=WAIT))
        stopped.join(2 * WAIT)
    assert not stopped.is_alive(), "Elector.stop() hung"


@contextlib.contextmanager
def pg_pids_of_threads(marker: str) -> Iterator[list[int]]:
    """The server process ids of the PostgreSQL connections opened meanwhile by threads whose
    name contains ``marker`` and by the sessions' I/O threads (this test's own
    connections, nobody else's: the sessions of earlier tests are closed)."""
    pids: list[int] = []

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        name = threading.current_thread().name
        ours = marker in name or name.startswith("leader-io:session#")
        if connection.vendor == "postgresql" and ours:
            pids.append(connection.connection.info.backend_pid)

    connection_created.connect(created)
    try:
        yield pids
    finally:
        connection_created.disconnect(created)


def test_lock_survives_a_frozen_postgresql_backend_process(lease_name: str) -> None:
    """SIGSTOP of the server processes of this lock's connections (not the server)."""
    require("postgresql")
    store = DatabaseBackend("postgresql")
    stopped: list[int] = []
    with pg_pids_of_threads(lease_name) as pids:

        def scenario() -> Any:
            with lock(lease_name, ttl=TTL, backend=store) as lease:
                wait_until(renewed(lease), timeout=WAIT, message="no renewal")
                assert pids, "no connection seen"
                for pid in list(pids):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                lease.lost.wait(WAIT)  # lost when its connection is the frozen one
            with lock(lease_name, ttl=TTL, timeout=WAIT, backend=store) as again:
                return again.token > lease.token

        try:
            thread, outcome = in_thread(scenario, name=f"test:{lease_name}")
            thread.join(3 * WAIT)
            assert not thread.is_alive(), "lock() hung on a frozen PostgreSQL backend"
            assert outcome == [True]
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            thread.join(WAIT)
    assert stopped


def test_elector_survives_a_frozen_postgresql_backend_process(lease_name: str) -> None:
    require("postgresql")
    store = DatabaseBackend("postgresql")
    stopped: list[int] = []
    with pg_pids_of_threads(lease_name) as pids:
        elector = Elector(
            lease_name, backend=store, ttl=TTL, renew_interval=0.3, retry_interval=0.1
        )
        elector.start()
        try:
            assert elector.wait_for_leadership(WAIT)
            first = elector.lease
            assert first is not None
            wait_until(renewed(first), timeout=WAIT, message="no renewal")
            assert pids
            # Freeze every connection the elector has, also one it opens meanwhile: a call
            # that hangs on a frozen one is left behind, and the session may move its
            # renewals to a new connection, where they rightly succeed (seen under the full
            # suite's load). Once they hang too, the lease is lost at its deadline.
            give_up = time.monotonic() + 3 * WAIT
            while not first.lost.wait(0.1):
                assert time.monotonic() < give_up, "the lease was never lost"
                for pid in set(pids) - set(stopped):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            wait_until(
                lambda: elector.lease is not None, timeout=3 * WAIT, message="never elected again"
            )
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            elector.stop(timeout=WAIT)
    assert stopped


# -- get_backend() keeps a bounded number of backends (defect 10) ---------------------------
def test_distinct_short_ttls_share_few_backends() -> None:
    locks = [lock("bounded-cache", ttl=0.5 + i / 1000) for i in range(1000)]
    backends = {id(each.backend) for each in locks}
    assert len(backends) <= 12, f"{len(backends)} backends for 1000 ttls"
    # Each still bounds its store calls below its own deadline (docs/api.md).
    for each in locks[::97]:
        assert each.backend.timeout <= each.timing.call_timeout  # type: ignore[attr-defined]
