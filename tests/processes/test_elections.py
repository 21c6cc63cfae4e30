"""Elections between real OS processes on real stores, with real faults: the acceptance of
the election modes (fifo, priority), of the candidate registry's heartbeats, of the store's
and wake-ups (the Elector's watchdog between processes: test_elector_watchdog.py).

Each candidate is ``tests/procs/candidate.py`` (an Elector in a process of its own, driven
through ``tests/support/cluster.py``); with ``DL_MP_DEFER=1`` it loads, then campaigns only
when told, so that processes started together join the queue in the order a test needs.
Every process stamps its reports with ``clock`` (``CLOCK_BOOTTIME``: one clock for every
process of the machine), so the reports of two processes can be put in order. Every time
asserted is a bound from the contract (docs/, the elections issue) plus a margin for a
process to report on a loaded machine, not a benchmark.

The herd tests run their Electors as threads of this process (hundreds of them), each with
a store connection of its own, to count what one hand-over costs the store. On ZooKeeper,
the tests that restart the server or need long sessions run a server of their own
(tests/support/zookeeper_server.py).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_leader import Elector
from django_leader.backends.base import Backend, Watch
from django_leader.backends.cache import CacheBackend
from django_leader.backends.db import DatabaseBackend
from django_leader.backends.zookeeper import ZooKeeperBackend
from django_leader.lease import LossReason, clock
from tests.support.cluster import (
    PATIENCE,
    STARTUP,
    Child,
    Cluster,
    Event,
    assert_no_overlap,
    matches,
    open_cluster,
    open_store,
    report,
    wait_renewals,
)
from tests.support.counting import Call, CallLog, CountingBackend
from tests.support.stores import zookeeper_backend
from tests.support.waiting import wait_until
from tests.support.zookeeper_server import ZooKeeperServer

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]

TTL = 2.0
RENEW = 0.5
RETRY = 0.25
#: What a process may take on a loaded machine to act on what it saw and report it.
MARGIN = 1.0
#: How long a waiting candidate's registration outlives its last heartbeat (the Elector
#: announces itself with ``max(ttl, 3 * retry_interval)``, see ``Elector._announce``).
CANDIDACY_TTL = max(TTL, 3 * RETRY)

EVERY_STORE = ["sqlite", "postgresql", "mysql", "redis", "zookeeper"]
#: A ZooKeeper server of the test's own (tests/support/zookeeper_server.py), for the tests
#: that restart it or need sessions longer than the machine's server grants.
PRIVATE_ZOOKEEPER = "zookeeper-private"


@pytest.fixture(params=EVERY_STORE)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The parent's own view of the store (each test narrows the stores it runs on)."""
    yield from open_any_store(request, tmp_path)


def open_any_store(
    request: pytest.FixtureRequest, tmp_path: Path, **zookeeper: Any
) -> Iterator[Backend]:
    """``open_store(request.param)``; for :data:`PRIVATE_ZOOKEEPER`, a private ZooKeeper
    server (kept in ``request.node.zookeeper_server`` for the test) and a backend on it
    (``zookeeper``: more ZooKeeperBackend arguments)."""
    if request.param != PRIVATE_ZOOKEEPER:
        yield from open_store(request.param)
        return
    # Sessions of up to 120 s: the herd's candidacies (announced for 3 x HERD_RETRY) need
    # 90 s.
    with ZooKeeperServer(tmp_path, max_session_ticks=600) as server:
        request.node.zookeeper_server = server
        yield from open_store("zookeeper", hosts=server.hosts, **zookeeper)


@pytest.fixture
def cluster(store: Backend, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(store, tmp_path)


def on(*stores: str) -> pytest.MarkDecorator:
    """Run the test on these stores only."""
    return pytest.mark.parametrize("store", stores, indirect=True)


# -- helpers --------------------------------------------------------------------------------
def queue(store: Backend, cluster: Cluster) -> list[str]:
    """The identities of the live candidates in the store's registry, in join order."""
    return [candidate.identity for candidate in store.candidates(cluster.lease) or []]


def start(cluster: Cluster, child: Child) -> Event:
    """Tell a deferred candidate to campaign; its ``started`` report."""
    after = child.send("start")
    return cluster.wait_for(matches("started", child.label), f"{child.label} started", after=after)


def join_in_order(cluster: Cluster, store: Backend, children: list[Child]) -> Event:
    """Start deferred candidates one after the other: the first once it leads, each other
    once the store has queued it. Returns the first one's ``elected`` report."""
    first: Event | None = None
    for child in children:
        start(cluster, child)
        if first is None:
            first = cluster.wait_for(matches("elected", child.label), f"{child.label} leading")
        else:
            queued(cluster, store, child)
    assert first is not None
    return first


def queued(cluster: Cluster, store: Backend, child: Child) -> None:
    """Wait until the store's registry lists ``child``."""
    wait_until(
        lambda: child.identity in queue(store, cluster),
        timeout=PATIENCE,
        message=lambda: f"{child.label} never queued\n{cluster.describe()}",
    )


def elected_in_order(cluster: Cluster) -> list[str]:
    return [event["who"] for event in cluster.select(matches("elected"))]


def attempted(cluster: Cluster, child: Child, after: float) -> Event:
    """Wait until the first acquisition ``child`` began after ``clock()`` time ``after``
    has returned (needs ``DL_MP_TRACE=acquire``); its ``returned`` report. (One Elector's
    attempts follow one another: the next return after a call is that call's.)"""
    began = cluster.wait_for(
        lambda e: matches("call", child.label, method="acquire")(e) and e["at"] > after,
        f"{child.label} trying",
    )
    return cluster.wait_for(
        lambda e: matches("returned", child.label, method="acquire")(e) and e["at"] >= began["at"],
        f"{child.label}'s attempt returning",
    )


def local_ports(pid: int, remote: int | None = None) -> set[int]:
    """The local ports of process ``pid``'s TCP connections (from /proc); with ``remote``,
    only those connected to that port."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] not in inodes:
                continue
            if remote is not None and int(fields[2].rsplit(":", 1)[1], 16) != remote:
                continue
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def listeners(store: Backend, alias: str, child: Child) -> list[int]:
    """The connections on which ``child`` listens for wake-ups, found by its local ports:
    on PostgreSQL its sessions whose last statement was a ``LISTEN`` (their backend pids),
    on Redis its pub/sub clients (their client ids), on ZooKeeper its connections to the
    server (their local ports: its watches live in its session)."""
    if isinstance(store, ZooKeeperBackend):
        server_port = int(store.conf.hosts.rsplit(":", 1)[1])
        return sorted(local_ports(child.pid, remote=server_port))
    ports = sorted(local_ports(child.pid))
    if isinstance(store, CacheBackend):
        clients = store.client.client_list(_type="pubsub")
        return [
            int(client["id"])
            for client in clients
            if int(client["addr"].rsplit(":", 1)[1]) in ports
        ]
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND client_port = ANY(%s) AND query LIKE 'LISTEN %%'",
            [ports],
        )
        return [pid for (pid,) in cursor.fetchall()]


def cut(store: Backend, alias: str, listener: int, request: pytest.FixtureRequest) -> None:
    """Drop a wake-up connection on the server's side: ``pg_terminate_backend`` of the
    session (and wait until it is gone), ``CLIENT KILL`` of the pub/sub client. Targeted:
    other tests may be listening on the same servers. On ZooKeeper, restart the test's
    own server (its data kept): every connection drops, the watches registered on it go
    with the process, and the sessions live on (a client that reconnects in time keeps
    its session, its leases and its candidacies)."""
    if isinstance(store, ZooKeeperBackend):
        request.node.zookeeper_server.restart()
        return
    if isinstance(store, CacheBackend):
        assert store.client.client_kill_filter(_id=str(listener), _type="pubsub") == 1
        return
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [listener])
        assert cursor.fetchone()[0] is True

        def gone() -> bool:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [listener])
            return bool(cursor.fetchone()[0] == 0)

        wait_until(gone, timeout=PATIENCE, message="the LISTEN session outlived its termination")


# -- 1. fifo -------------------------------------------------------------------------------
@on(*EVERY_STORE)
def test_fifo_candidates_lead_in_the_order_they_joined(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """Five fifo candidates join one after the other; each leader in turn gets SIGTERM
    (``stop()`` releases the lease): leadership passes down the queue in join order, each
    time by a release (never by an expiry), with no two leaders at once."""
    labels = ["a", "b", "c", "d", "e"]
    children = [
        cluster.spawn_candidate(label, retry=RETRY, DL_MP_MODE="fifo", DL_MP_DEFER="1")
        for label in labels
    ]
    cluster.wait_ready(children)
    first = join_in_order(cluster, store, children)
    assert queue(store, cluster) == [child.identity for child in children[1:]]

    leader, token = children[0], first["token"]
    takeovers = []
    for successor in children[1:]:
        after = cluster.position()
        leader.proc.send_signal(signal.SIGTERM)
        elected = cluster.wait_for(
            matches("elected"), f"a leader after {leader.label}", PATIENCE, after=after
        )
        lost = cluster.wait_for(
            matches("lost", leader.label, token=token), f"{leader.label} stepping down"
        )
        stopped = cluster.wait_for(matches("stopped", leader.label), f"{leader.label} stopped")
        assert stopped["history_flushed"] is True, stopped
        assert leader.proc.wait(timeout=PATIENCE) == 0
        assert elected["who"] == successor.label, cluster.describe()
        assert elected["previous_holder"] == "", elected  # released, not expired
        assert lost["clock"] < elected["clock"], (lost, elected)
        takeovers.append(elected["clock"] - lost["clock"])
        leader, token = successor, elected["token"]

    report(request, slowest_takeover=max(takeovers))
    assert elected_in_order(cluster) == labels
    terms = assert_no_overlap(cluster)
    # Each handover was a release (an expiry would be recorded as taken_over).
    history = cluster.history(cluster.lease, leader)
    expected = []
    for term in terms:
        holder = cluster.children[term.who].identity
        expected += [("acquired", holder, term.token), ("released", holder, term.token)]
    assert history == expected[:-1], history


# -- 2. priority -----------------------------------------------------------------------------
@on(*EVERY_STORE)
def test_higher_priority_newcomer_takes_over_at_the_next_renewal(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """Two priority-1 candidates, one leading; a priority-5 candidate joins. Within
    RENEW_INTERVAL (+ margin) of its joining it leads: the leader saw it at its next
    renewal, stepped down and handed over. By the one clock of the machine, the old leader
    had stepped down before the newcomer was elected; the other priority-1 candidate,
    first in the queue until then, never led."""
    low = [
        cluster.spawn_candidate(label, retry=RETRY, DL_MP_MODE="priority", DL_MP_PRIORITY="1")
        for label in ("a", "b")
    ]
    high = cluster.spawn_candidate(
        "c", retry=RETRY, DL_MP_MODE="priority", DL_MP_PRIORITY="5", DL_MP_DEFER="1"
    )
    cluster.wait_ready([*low, high])
    first = cluster.wait_for(matches("elected"), "a first leader", PATIENCE)
    old = cluster.children[first["who"]]
    other = next(child for child in low if child is not old)
    wait_until(
        lambda: queue(store, cluster) == [other.identity],
        timeout=PATIENCE,
        message=lambda: f"{other.label} never queued alone\n{cluster.describe()}",
    )

    joined = start(cluster, high)
    elected = cluster.wait_for(
        matches("elected", high.label), "the newcomer leading", RENEW + MARGIN + PATIENCE
    )
    lost = cluster.wait_for(matches("lost", old.label, token=first["token"]), "a stepping down")
    takeover = elected["clock"] - joined["clock"]
    report(request, takeover=takeover, gap=elected["clock"] - lost["clock"])
    assert takeover <= RENEW + MARGIN, f"took {takeover:.2f}s\n{cluster.describe()}"
    assert lost["reason"].startswith(LossReason.HANDED_OVER.value), lost
    assert lost["clock"] < elected["clock"], (lost, elected)
    assert elected["previous_holder"] == "", elected  # released, not expired
    # The newcomer keeps the lease: nobody takes it back.
    wait_renewals(cluster, high.label, elected["token"], 2)
    assert elected_in_order(cluster) == [old.label, high.label], cluster.describe()
    current = store.read(cluster.lease)
    assert current is not None and current.holder == high.identity, current
    assert_no_overlap(cluster)


# -- 3. a dead head of the queue ------------------------------------------------------------
@on("sqlite", "postgresql", "redis", "zookeeper")
def test_killed_head_of_the_queue_is_skipped_once_its_heartbeat_expires(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """fifo: a leads, b is next, then c. SIGKILL b, then a releases (SIGTERM): the release
    wakes b, which is dead; once b's registration expires (no heartbeat) c is first in the
    queue and leads — within the candidacy ttl + RETRY_INTERVAL (+ margin) of the
    release."""
    children = [
        cluster.spawn_candidate(label, retry=RETRY, DL_MP_MODE="fifo", DL_MP_DEFER="1")
        for label in ("a", "b", "c")
    ]
    cluster.wait_ready(children)
    a, b, c = children
    first = join_in_order(cluster, store, children)
    assert queue(store, cluster) == [b.identity, c.identity]

    b.kill()
    after = cluster.position()
    a.proc.send_signal(signal.SIGTERM)
    lost = cluster.wait_for(matches("lost", a.label, token=first["token"]), "a stepping down")
    bound = CANDIDACY_TTL + RETRY + MARGIN
    elected = cluster.wait_for(
        matches("elected"), "a leader after a", bound + PATIENCE, after=after
    )
    takeover = elected["clock"] - lost["clock"]  # from before the release
    report(request, takeover=takeover)
    assert elected["who"] == c.label, cluster.describe()
    assert takeover <= bound, f"took {takeover:.2f}s\n{cluster.describe()}"
    assert elected["previous_holder"] == "", elected  # released, not expired
    assert b.identity not in queue(store, cluster), "b's registration outlived its heartbeat"
    assert elected_in_order(cluster) == [a.label, c.label]
    assert_no_overlap(cluster)


# -- 4. a lost wake-up ----------------------------------------------------------------------
#: A long lease for this test only: a waiting candidate whose wake-ups are live sleeps until
#: the lease it saw would run out (at least LOST_TTL - LOST_RENEW), so only a wake-up can
#: explain a takeover within RETRY_INTERVAL.
LOST_TTL = 10.0
LOST_RENEW = 2.0
#: On ZooKeeper the connection is dropped by restarting the server, which takes seconds (a
#: JVM starts; the leader reconnects before it can release): a longer lease keeps the
#: waiting candidate's own timer out of the way.
LOST_TIMING = {PRIVATE_ZOOKEEPER: (20.0, 4.0)}


@on("postgresql", "redis", PRIVATE_ZOOKEEPER)
def test_lost_wake_up_costs_at_most_a_retry_interval(
    cluster: Cluster, store: Backend, request: pytest.FixtureRequest
) -> None:
    """race: a leads, b waits with its wake-ups live and so sleeps until a's lease would run
    out. Drop b's listening connection on the server (``pg_terminate_backend`` of its
    ``LISTEN`` session, ``CLIENT KILL`` of its pub/sub client) while b is stopped, so that
    it cannot reconnect before a releases: the release's wake-up is lost for certain. Once
    b runs again its hub finds the connection gone, reconnects and wakes everyone: b leads
    within RETRY_INTERVAL (+ margin), long before its own timer would have fired.

    On ZooKeeper, the test's own server is restarted while b is stopped (see :func:`cut`):
    b's watches go with the server process, and b learns of the release once it runs
    again and reconnects (its hub wakes it; the server also fires the watches set before
    the restart for what changed since, when the session lives on)."""
    ttl, renew = LOST_TIMING.get(request.node.callspec.params["store"], (LOST_TTL, LOST_RENEW))
    timing: dict[str, Any] = {"ttl": ttl, "renew": renew, "retry": RETRY}
    a = cluster.spawn_candidate("a", **timing, DL_MP_MODE="race")
    b = cluster.spawn_candidate(
        "b", **timing, DL_MP_MODE="race", DL_MP_DEFER="1", DL_MP_TRACE="acquire,woken,sleep"
    )
    cluster.wait_ready([a, b])
    first = cluster.wait_for(matches("elected", a.label), "a leading")
    start(cluster, b)
    cluster.wait_for(matches("new_leader", b.label, token=first["token"]), "b seeing a")
    # Its hub wakes it once connected (as after every connection): let that attempt pass.
    connected = cluster.wait_for(matches("call", b.label, method="woken"), "b's hub connecting")
    attempted(cluster, b, after=connected["at"])
    listening = wait_until(
        lambda: listeners(store, cluster.alias, b),
        timeout=PATIENCE,
        message="b never listened for wake-ups",
    )
    assert len(listening) == 1, listening

    # Wake b once more: its attempt sees a's lease with at least ttl - renew to
    # run (give or take a late renewal), and it sleeps that long unless woken.
    after = cluster.position()
    store.wake(cluster.lease)  # the channel race candidates and observers watch
    woken = cluster.wait_for(matches("call", b.label, method="woken"), "b woken", after=after)
    returned = attempted(cluster, b, after=woken["at"])
    # Stop b only once it sleeps: stopped between its attempt and deciding how long to
    # sleep, it would decide on resuming, its hub having found the connection gone by then,
    # and poll every RETRY_INTERVAL (right too, but not what this test is about).
    sleeping = cluster.wait_for(
        lambda e: matches("sleeping", b.label)(e) and e["at"] >= returned["at"], "b sleeping"
    )
    assert sleeping["interval"] >= ttl - 2 * renew, cluster.describe()
    timer_at = sleeping["at"] + sleeping["interval"]

    os.kill(b.pid, signal.SIGSTOP)
    wait_until(lambda: b.state() == "T", timeout=PATIENCE, interval=0.005)
    calls, returns = (
        len(cluster.select(matches(kind, b.label, method="acquire")))
        for kind in ("call", "returned")
    )
    assert calls == returns, f"b was stopped with an attempt in flight\n{cluster.describe()}"
    cut(store, cluster.alias, listening[0], request)
    a.proc.send_signal(signal.SIGTERM)
    stopped = cluster.wait_for(matches("stopped", a.label), "a releasing", after=after)
    assert a.proc.wait(timeout=PATIENCE) == 0
    # The release and its wake-up are done; b had no connection to hear it on.
    resumed = clock()
    os.kill(b.pid, signal.SIGCONT)

    elected = cluster.wait_for(matches("elected", b.label), "b leading", RETRY + MARGIN + PATIENCE)
    takeover = elected["clock"] - resumed
    report(request, takeover=takeover, timer_left=timer_at - elected["clock"])
    assert takeover <= RETRY + MARGIN, f"took {takeover:.2f}s\n{cluster.describe()}"
    assert stopped["clock"] < resumed
    assert elected["previous_holder"] == "", elected  # released, not expired
    # What got b going: a wake-up from its hub once it reconnected, not its own timer.
    assert elected["clock"] < timer_at, "b's own timer could explain the takeover"
    assert cluster.select(
        lambda e: (
            matches("call", b.label, method="woken")(e) and resumed < e["at"] < elected["clock"]
        )
    ), cluster.describe()
    again = wait_until(
        lambda: listeners(store, cluster.alias, b),
        timeout=PATIENCE,
        message="b's hub never listened again",
    )
    assert again != listening, again  # a new connection
    assert_no_overlap(cluster)


# -- 6. no herd -----------------------------------------------------------------------------
#: Long enough that nothing polls or renews on its own while a hand-over is counted: a fifo
#: head polls every HERD_RETRY, the others (wake-ups live) once the lease they saw would
#: run out, the leader renews and reads the registry every HERD_RENEW.
HERD_TTL = 60.0
HERD_RENEW = 20.0
HERD_RETRY = 30.0
#: Heartbeats that run on their own clocks, not caused by a hand-over: not counted.
BACKGROUND = ("announce", "renew")
#: What one fifo hand-over costs, whatever the number of candidates: the leader releases,
#: reads the head of the queue (not the queue: ``next_in_line``) and wakes it; the head
#: alone is woken and acquires at once (woken, it is its turn) and leaves the queue; the
#: old leader leaves it again once its term is over (in case its withdrawal at election
#: failed). Nobody listens to the membership signals: the new leader reads no registry.
FIFO_HANDOVER = Counter(release=1, next_in_line=1, wake=1, woken=1, acquire=1, withdraw=2)
#: Electors per backend instance: each instance has its own Redis connection pool, which
#: redis-py caps (100 connections by default in redis-py 8).
PER_BACKEND = 50


@dataclass
class Handover:
    """What one release cost: the store calls from the release until the new leader left
    the queue (race: until every waiting candidate had tried)."""

    calls: list[Call]
    head: str  # the first in the queue when the leader released ("" in race mode)
    elected: str
    waiting: set[str]  # every candidate but the leader

    def who(self, method: str) -> list[str]:
        return [call.who for call in self.calls if call.method == method]

    @property
    def tally(self) -> Counter[str]:
        return CallLog.tally(self.calls, leave_out=BACKGROUND)


def same_store(store: Backend) -> Backend:
    """Another backend instance on ``store``'s database, Redis or ZooKeeper (a session of
    its own)."""
    if isinstance(store, DatabaseBackend):
        return DatabaseBackend(store.alias)
    if isinstance(store, ZooKeeperBackend):
        conf = store.conf
        return ZooKeeperBackend(
            hosts=conf.hosts, root=store.root, session_timeout=conf.session_timeout
        )
    assert isinstance(store, CacheBackend)
    return CacheBackend(store.alias)


def hand_over_once(store: Backend, mode: str, size: int) -> Handover:
    """``size`` Electors (threads of this process, each making its calls on a connection of
    its own: PostgreSQL's per thread, Redis's from a pool; on ZooKeeper, one session per
    :data:`PER_BACKEND` Electors) campaign for a new name; the
    first leads, the rest wait until nothing moves; then the leader stops (releasing) and
    the calls the hand-over causes are counted."""
    log = CallLog()
    extra = [same_store(store) for _ in range((size - 1) // PER_BACKEND)]
    backends = [CountingBackend(real, log) for real in [store, *extra]]
    name = f"herd-{uuid.uuid4().hex[:10]}"
    elected: dict[str, float] = {}

    def elector(index: int) -> Elector:
        return Elector(
            name,
            ttl=HERD_TTL,
            renew_interval=HERD_RENEW,
            retry_interval=HERD_RETRY,
            identity=f"{mode}{size}-{index:03d}",
            backend=backends[index // PER_BACKEND],
            mode=mode,
            on_elected=lambda lease: elected.setdefault(lease.holder, clock()),
        )

    def made(method: str, since: float = 0.0) -> dict[str, float]:
        """Who made a call of ``method`` since ``since``, and when they last did."""
        return {call.who: call.at for call in log.between(since) if call.method == method}

    def registry() -> set[str]:
        return {candidate.identity for candidate in store.candidates(name) or []}

    leader = elector(0)
    followers = [elector(index) for index in range(1, size)]
    waiting = {follower.identity for follower in followers}
    leader.start()
    try:
        assert leader.wait_for_leadership(PATIENCE), "the first elector never led"
        for follower in followers:
            follower.start()
        if mode == "race":
            wait_until(
                lambda: waiting <= set(made("acquire")),
                timeout=STARTUP,
                message=lambda: f"never tried: {waiting - set(made('acquire'))}",
            )
        else:
            wait_until(
                lambda: registry() == waiting,
                timeout=STARTUP,
                message=lambda: f"never queued: {waiting - registry()}",
            )

        # Every watch live before the hand-over: a race watcher is woken once as it comes
        # live (a release it missed meanwhile), and on a loaded machine ZooKeeper's watch
        # thread arms a backend's 50 watches one after the other, so the last came live
        # after the followers had settled and its candidate tried twice in the hand-over.
        def watches() -> list[Watch]:
            return [watch for backend in backends for watch in backend.watches]

        wait_until(
            lambda: len(watches()) == size and all(watch.live for watch in watches()),
            timeout=STARTUP,
            message=lambda: f"{sum(not watch.live for watch in watches())} watches not live",
        )

        def quiet() -> bool:
            recent = log.between(clock() - 0.5)
            return not [call for call in recent if call.method not in BACKGROUND]

        wait_until(quiet, timeout=STARTUP, message="the followers never settled")
        members = store.candidates(name) or []
        head = members[0].identity if mode != "race" and members else ""

        released = clock()
        leader.stop()
        winner = wait_until(
            lambda: next(iter(set(elected) - {leader.identity}), None), timeout=PATIENCE
        )
        if mode == "race":
            # Everyone was woken: count until each has tried.
            def everyone_tried() -> float | None:
                tried = made("acquire", released)
                return max(tried.values()) if waiting <= set(tried) else None

            last = wait_until(
                everyone_tried,
                timeout=PATIENCE,
                message=lambda: f"never tried: {sorted(waiting - set(made('acquire', released)))}",
            )
            end = max(elected[winner], last)
        else:
            # Until both have left the queue: the new leader, and the old one again (on
            # ZooKeeper the head watches the lease node, so it may lead and leave the
            # queue before the old leader has woken it).
            def both_left() -> float | None:
                withdrew = made("withdraw", released)
                if winner in withdrew and leader.identity in withdrew:
                    return max(withdrew[winner], withdrew[leader.identity])
                return None

            end = wait_until(
                both_left, timeout=PATIENCE, message="the new leader never left the queue"
            )
        return Handover(log.between(released, end), head, winner, waiting)
    finally:
        everyone = [leader, *followers]
        with ThreadPoolExecutor(max_workers=32) as pool:
            list(pool.map(lambda e: e.stop(timeout=PATIENCE), everyone))
        if isinstance(store, CacheBackend):  # a lease's meta key never expires
            keys = list(store.client.scan_iter(match=f"*django_leader:{{{name}}}*", count=500))
            if keys:
                store.client.delete(*keys)
        for real in extra:
            real.close()
            if isinstance(real, CacheBackend):
                real.client.connection_pool.disconnect()
            if isinstance(real, ZooKeeperBackend):
                real.shutdown()


#: ZooKeeper: one session per backend, for the lease (HERD_TTL) and the candidacies
#: (3 x HERD_RETRY) alike, so that no session connects while a hand-over is counted.
HERD_SESSION = max(HERD_TTL, 3 * HERD_RETRY)


@pytest.fixture
def herd_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from open_any_store(request, tmp_path, session_timeout=HERD_SESSION)


@pytest.mark.parametrize(
    ("herd_store", "size"),
    # ZooKeeper: a server of the test's own, which grants the 90 s sessions these timings
    # need (the machine's grants 40 s at most).
    [("postgresql", 40), ("redis", 200), (PRIVATE_ZOOKEEPER, 200)],
    indirect=["herd_store"],
)
def test_fifo_handover_wakes_one_candidate_however_many_wait(
    herd_store: Backend, size: int, request: pytest.FixtureRequest
) -> None:
    """One hand-over (the leader stops and releases) among ``size`` candidates: in fifo
    mode it wakes the head of the queue alone, which alone tries, and costs the store the
    same few calls with 10 candidates as with ``size``. Counted by a Backend wrapper that
    notes each call the Electors make, and each wake-up delivered to them."""
    small = hand_over_once(herd_store, "fifo", 10)
    large = hand_over_once(herd_store, "fifo", size)
    summary = {
        f"fifo{count}": dict(handover.tally) for count, handover in ((10, small), (size, large))
    }
    print(summary)
    for handover in (small, large):
        assert handover.elected == handover.head, handover
        assert handover.who("woken") == [handover.head], (summary, handover.calls)
        assert handover.who("acquire") == [handover.head], (summary, handover.calls)
        assert handover.tally == FIFO_HANDOVER, summary
    request.node.user_properties += [("fifo_calls", large.tally.total())]


@pytest.mark.parametrize(
    ("herd_store", "size"),
    [("postgresql", 40), ("redis", 200), (PRIVATE_ZOOKEEPER, 200)],
    indirect=["herd_store"],
)
def test_race_handover_wakes_every_candidate_once(
    herd_store: Backend, size: int, request: pytest.FixtureRequest
) -> None:
    """The same hand-over in race mode: every waiting candidate is woken and tries once
    (the herd fifo avoids)."""
    herd = hand_over_once(herd_store, "race", size)
    summary = dict(herd.tally)
    print(summary)
    # Every waiting candidate is woken (all watch the name's channel, so a wake-up names
    # nobody: counted, not told apart) and each tries once; the stopping leader's own
    # watch may hear the wake-up too.
    assert len(herd.waiting) <= herd.tally["woken"] <= len(herd.waiting) + 1, summary
    assert sorted(herd.who("acquire")) == sorted(herd.waiting), summary
    request.node.user_properties += [("race_calls", herd.tally.total())]


def test_zookeeper_wake_up_after_a_release_calls_a_race_watcher_once() -> None:
    """ZooKeeper: a race watcher (``watch(name)``) is called once as it comes live, once by a
    release of the name and once by a ``wake(name)`` after it. A second name's watcher,
    rung after each step, marks when the watch thread has handled the step (it handles
    events in the order the ensemble sent them)."""
    watcher, other = zookeeper_backend(), zookeeper_backend()
    name = f"bell-{uuid.uuid4().hex[:10]}"
    marker = f"{name}-marker"
    calls: Counter[str] = Counter()
    try:
        held, _ = other.acquire(name, "holder", 2.0)
        assert held is not None
        watches = [watcher.watch(n, lambda n=n: calls.update([n])) for n in (name, marker)]
        wait_until(lambda: all(w is not None and w.live for w in watches), timeout=PATIENCE)
        # Each was called once as it came live (before ``live``): a release it might have
        # missed. Counted from here.
        assert calls == Counter({name: 1, marker: 1}), calls
        calls.clear()

        def step(rings: int) -> None:
            other.wake(marker)
            wait_until(lambda: calls[marker] >= rings, timeout=PATIENCE)

        assert other.release(held)
        step(1)
        assert calls[name] == 1, calls  # the release
        other.wake(name)
        step(2)
        assert calls[name] == 2, calls  # and the wake-up, once
    finally:
        for backend in (watcher, other):
            backend.flush_history(PATIENCE)
        for n in (name, marker):
            other.client.delete(other._name_path(n), recursive=True)
        watcher.shutdown()
        other.shutdown()
