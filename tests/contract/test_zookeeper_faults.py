"""Real faults of a ZooKeeper store under Electors and locks of this process: a private
standalone server (tests/support/zookeeper_server.py) is restarted, paused, wiped, or grants
sessions shorter than a lease's ttl. The machine's ZooKeeper on 2181 is left alone.

Each Elector has a ZooKeeperBackend of its own, so a session of its own, as two processes
would. Every term is recorded with the lease clock (``django_leader.lease.clock()``): when it
began (``on_elected``) and when its holder stopped believing it led (``on_lost``, or its
local deadline if that came first). Safety: no two terms overlap, tokens grow with every
term, a leader cut off from the store steps down at its local deadline, which comes before
the store's expiry of its lease. Liveness: a leader is elected again within the session
timeout + RETRY_INTERVAL + SLACK of the store being back.

Faults that need a real process (a holder SIGSTOPped, an ensemble losing nodes) are in
tests/processes/test_zookeeper_ensemble.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from django_leader import BackendUnavailable, Elector
from django_leader.backends.zookeeper import ZooKeeperBackend, encode_name
from django_leader.conf import resolve_timing
from django_leader.lease import Lease, LossReason, clock
from tests.support.waiting import wait_until
from tests.support.zookeeper_server import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    new_root,
    skip_without_kazoo,
)

skip_without_kazoo()

# They start JVMs, as the process tests start processes.
pytestmark = [pytest.mark.multiprocess, pytest.mark.topology]

TTL = 2.0
RENEW = 0.5
RETRY = 0.2
#: The session timeout asked for: the ttl, as with SESSION_TIMEOUT None.
SESSION = TTL
#: Scheduling slack on top of what the settings allow (threads waking, kazoo reconnecting).
SLACK = 1.0
#: For what has no bound of its own to check (a server starting).
WAIT = 30.0
#: ``LOCK_DELAY`` here: longer than TTL, so that the wiped-store test tells them apart.
LOCK_DELAY = 3.0
#: Losses of a leader cut off from its store: only its own deadline can end its term.
DEADLINE_CAUSES = {
    LossReason.DEADLINE,
    LossReason.IN_FLIGHT,
    LossReason.ANSWERED_LATE,
    LossReason.LOCAL_DEADLINE,
}


def wall(instant: float) -> float:
    """The ``time.time()`` of an instant of the lease clock."""
    return time.time() + (instant - clock())


@dataclass
class Term:
    who: str
    lease: Lease
    elected: float
    #: When ``on_lost`` ran (None while the term lasts).
    lost: float | None = None

    @property
    def end(self) -> float:
        """When its holder stopped believing it led: ``on_lost``, or the local deadline if
        that came first (``is_leader`` turns False then)."""
        assert self.lease.deadline is not None
        if self.lost is None:
            return float("inf") if not self.lease.lost.is_set() else self.lease.deadline
        return min(self.lost, self.lease.deadline)


class Terms:
    """Electors on one name, each with a backend (a session) of its own, and every term
    they had."""

    def __init__(self, hosts: str, root: str, name: str, **timing: float) -> None:
        self.hosts, self.root, self.name = hosts, root, name
        self.timing = resolve_timing(
            timing.get("ttl", TTL), timing.get("renew_interval", RENEW), RETRY
        )
        self.terms: list[Term] = []
        self.guard = threading.Lock()
        self.electors: list[Elector] = []
        self.backends: list[ZooKeeperBackend] = []

    def backend(self) -> ZooKeeperBackend:
        backend = ZooKeeperBackend(
            hosts=self.hosts,
            root=self.root,
            session_timeout=self.timing.ttl,
            timeout=self.timing.call_timeout,
        )
        self.backends.append(backend)
        return backend

    def start(self, who: str) -> Elector:
        def on_elected(lease: Lease) -> None:
            with self.guard:
                self.terms.append(Term(who, lease, clock()))

        def on_lost(lease: Lease) -> None:
            at = clock()
            with self.guard:
                term = next(t for t in self.terms if t.lease is lease)
                term.lost = at

        elector = Elector(
            self.name,
            identity=who,
            backend=self.backend(),
            ttl=self.timing.ttl,
            renew_interval=self.timing.renew_interval,
            retry_interval=self.timing.retry_interval,
            on_elected=on_elected,
            on_lost=on_lost,
        )
        self.electors.append(elector)
        elector.start()
        return elector

    def elected_since(self, instant: float) -> Term | None:
        """The first term that began at ``instant`` or later."""
        with self.guard:
            return next((t for t in self.terms if t.elected >= instant), None)

    def check(self) -> None:
        """No two terms overlap; each has a greater token than the one before."""
        with self.guard:
            terms = sorted(self.terms, key=lambda t: t.elected)
        for before, after in itertools.pairwise(terms):
            assert before.end <= after.elected, (
                f"{before.who} (token {before.lease.token}) still led at "
                f"{before.end:.3f} when {after.who} (token {after.lease.token}) was elected "
                f"at {after.elected:.3f}"
            )
            assert after.lease.token > before.lease.token, (before, after)

    def close(self) -> None:
        for elector in self.electors:
            elector.stop(timeout=WAIT)
        for backend in self.backends:
            backend.shutdown()


@pytest.fixture
def leader_settings(settings: Any) -> None:
    """No history (no database needed), and a LOCK_DELAY of our own."""
    settings.DJANGO_LEADER = {**settings.DJANGO_LEADER, "HISTORY": False, "LOCK_DELAY": LOCK_DELAY}


@pytest.fixture
def server(tmp_path: Path, leader_settings: None) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path) as started:
        yield started


@pytest.fixture
def terms(server: ZooKeeperServer, lease_name: str) -> Iterator[Terms]:
    recorded = Terms(server.hosts, new_root(server.hosts), lease_name)
    try:
        yield recorded
    finally:
        recorded.close()


def leader_and_follower(terms: Terms) -> tuple[Elector, Lease]:
    """``first`` elected, then ``second`` campaigning; the leader and its lease."""
    first = terms.start("first")
    assert first.wait_for_leadership(WAIT)
    terms.start("second")
    lease = first.lease
    assert lease is not None
    return first, lease


def assert_stepped_down_in_time(lease: Lease, cut_off: float) -> None:
    """A leader cut off from its store at ``cut_off`` stepped down by its own deadline,
    which came before the store's expiry of its lease (with room to spare: the margin)."""
    margin = resolve_timing(TTL, RENEW, RETRY).safety_margin
    assert lease.lost_cause in DEADLINE_CAUSES, lease.lost_reason
    assert lease.deadline is not None and lease.expires_at is not None
    assert lease.deadline <= cut_off + TTL, "its deadline was not set by its last renewal"
    assert wall(lease.deadline) <= lease.expires_at.timestamp() - margin / 2, (
        "it believed it led after the store could give its lease away"
    )


def test_restart_longer_than_the_ttl(server: ZooKeeperServer, terms: Terms) -> None:
    """Stop the server, start it again (data kept) once the leader stepped down: a leader
    again within session timeout + RETRY + SLACK of the server being back."""
    leader, lease = leader_and_follower(terms)
    cut_off = clock()
    server.stop()
    assert lease.lost.wait(TTL + SLACK), "the leader did not step down at its deadline"
    assert not leader.is_leader
    assert_stepped_down_in_time(lease, cut_off)
    stepped_down = clock()

    server.start()
    back = clock()
    bound = SESSION + RETRY + SLACK
    # Elected after the step-down: maybe already, as the server accepted clients before
    # start() returned (then the time printed below is negative).
    again = wait_until(
        lambda: terms.elected_since(stepped_down),
        timeout=bound,
        message="nobody was elected again",
    )
    print(f"restart: elected again {again.elected - back:.2f}s after the server was back")
    assert again.lease.token > lease.token
    terms.check()


def test_restart_shorter_than_the_ttl_keeps_the_term(
    server: ZooKeeperServer, lease_name: str
) -> None:
    """A restart that ends well before the leader's deadline: its session and lease survive
    it, it renews through the restarted server, keeps its token, and nobody else leads."""
    # A long ttl (so a long session): the restart must end well within it even on a busy
    # machine, where a JVM may take seconds to start.
    ttl, renew = 12.0, 1.0
    terms = Terms(server.hosts, new_root(server.hosts), lease_name, ttl=ttl, renew_interval=renew)
    try:
        leader, lease = leader_and_follower(terms)
        down = clock()
        server.restart()
        back, back_wall = clock(), time.time()
        assert lease.deadline is not None
        assert back - down < ttl / 2, f"the restart took {back - down:.1f}s: not a short one"

        def renewed_since_back() -> bool:
            assert lease.expires_at is not None
            return lease.expires_at.timestamp() - ttl >= back_wall

        # Before its deadline, or it would be lost: a renewal through the restarted server.
        wait_until(
            renewed_since_back,
            timeout=lease.deadline - clock(),
            message=lambda: f"no renewal since the restart: {lease.lost_reason or 'held'}",
        )
        print(f"short restart: {back - down:.2f}s down, term kept")
        assert leader.is_leader and leader.lease is lease and not lease.lost.is_set()
        assert [t.lease.token for t in terms.terms] == [lease.token]
        terms.check()
    finally:
        terms.close()


def test_pause_past_the_session_timeout(server: ZooKeeperServer, terms: Terms) -> None:
    """SIGSTOP the server past the session timeout, then SIGCONT: the leader stepped down
    at its deadline meanwhile; a leader again within session timeout + RETRY + SLACK of
    the resumption, with a greater token, never two at once."""
    leader, lease = leader_and_follower(terms)
    cut_off = clock()
    server.pause()
    try:
        assert lease.lost.wait(TTL + SLACK), "the leader did not step down at its deadline"
        assert not leader.is_leader
        # The fault itself: frozen past the session timeout (and a few ticks more).
        time.sleep(max(0.0, cut_off + SESSION + 3 * server.tick_ms / 1000 - clock()))
    finally:
        server.resume()
    resumed = clock()
    assert_stepped_down_in_time(lease, cut_off)
    bound = SESSION + RETRY + SLACK
    again = wait_until(
        lambda: terms.elected_since(resumed), timeout=bound, message="nobody was elected again"
    )
    print(f"pause: elected again {again.elected - resumed:.2f}s after the server resumed")
    assert again.lease.token > lease.token
    terms.check()


def test_wiped_server_waits_out_the_lock_delay(server: ZooKeeperServer, terms: Terms) -> None:
    """Stop, wipe, start: the store lost every lease and counter. Nobody acquires before
    the lock-delay has passed since the loss was noticed (the new store marker), and the
    next token is greater than every earlier one."""
    from django_leader.conf import lock_delay

    _leader, lease = leader_and_follower(terms)
    delay = lock_delay(TTL)
    assert delay == LOCK_DELAY
    server.stop()
    server.wipe()
    starting = clock()
    server.start()
    back = clock()
    bound = delay + SESSION + RETRY + SLACK
    again = wait_until(
        lambda: terms.elected_since(back), timeout=bound, message="nobody was elected again"
    )
    print(f"wipe: elected again {again.elected - back:.2f}s after the server was back")
    # The loss cannot have been noticed before the server started.
    assert again.elected >= starting + delay
    reader = terms.backend()
    marker, _ = reader.client.get(f"{terms.root}/store")
    fence, noticed = json.loads(marker)["fence"], json.loads(marker)["epoch"]
    assert again.lease.acquired_at is not None
    assert again.lease.acquired_at.timestamp() * 1000 >= fence
    assert fence - noticed >= delay * 1000
    assert lease.lost.is_set()
    assert again.lease.token > max(t.lease.token for t in terms.terms if t is not again)
    terms.check()


def acquired(backend: ZooKeeperBackend, name: str, holder: str) -> Lease | None:
    """``backend.acquire(name, holder, TTL)``'s grant, or None (refused, or the store not
    answering yet)."""
    try:
        return backend.acquire(name, holder, TTL)[0]
    except BackendUnavailable:
        return None


def test_restore_from_an_older_snapshot_never_repeats_a_token(
    server: ZooKeeperServer, tmp_path: Path, lease_name: str
) -> None:
    """Copy the data directory of a stopped server, grant more, stop, put the copy back,
    start: the store went back in time (its marker with it). The backend that saw the newer
    transactions notices (a write's zxid lower than one it saw): nobody acquires before the
    lock-delay has passed, and the next token is greater than every token handed out."""
    from django_leader.conf import lock_delay

    backend = ZooKeeperBackend(hosts=server.hosts, root=new_root(server.hosts), timeout=2.0)
    tokens: list[int] = []

    def grant_and_release() -> None:
        lease = wait_until(
            lambda: acquired(backend, lease_name, "alice"), timeout=WAIT, message="no grant"
        )
        tokens.append(lease.token)
        assert backend.release(lease)

    try:
        grant_and_release()
        server.stop()
        snapshot = tmp_path / "snapshot"
        shutil.copytree(server.data_dir, snapshot)
        server.start()
        for _ in range(3):
            grant_and_release()
        server.stop()
        shutil.rmtree(server.data_dir)
        shutil.copytree(snapshot, server.data_dir)
        server.start()
        back = clock()
        lease = wait_until(
            lambda: acquired(backend, lease_name, "bob"),
            timeout=lock_delay(TTL) + WAIT,
            message="no grant after the restore",
        )
        waited = clock() - back
        print(f"restore: tokens before {tokens}, after {lease.token}, waited {waited:.2f}s")
        assert lease.token > max(tokens)
        assert waited >= lock_delay(TTL) - 0.1, "acquired before the lock-delay had passed"
    finally:
        backend.shutdown()


def answers(backend: ZooKeeperBackend) -> bool:
    try:
        backend.ping(1.0)
    except BackendUnavailable:
        return False
    return True


def grant_and_release(backend: ZooKeeperBackend, name: str, holder: str) -> None:
    lease = wait_until(partial(acquired, backend, name, holder), timeout=WAIT, message="no grant")
    assert backend.release(lease)


def test_a_restore_noticed_by_two_clients_costs_one_lock_delay(
    server: ZooKeeperServer, tmp_path: Path, lease_name: str
) -> None:
    """Two clients saw the newer transactions of a store restored from an older copy. The
    first to try notices and starts the lock-delay; the second, trying once it has passed,
    finds the marker written after its own refused handshake: the rollback it saw is
    covered, and it acquires at once. (Each client started a lock-delay of its own, one
    after the other: in a chaos run, no leader for 8.9 s after a wipe.)"""
    from django_leader.conf import lock_delay

    root = new_root(server.hosts)
    first = ZooKeeperBackend(hosts=server.hosts, root=root, timeout=2.0)
    second = ZooKeeperBackend(hosts=server.hosts, root=root, timeout=2.0)
    try:
        for backend, holder in ((first, "alice"), (second, "bob")):
            grant_and_release(backend, f"{lease_name}-{holder}", holder)
        server.stop()
        snapshot = tmp_path / "snapshot"
        shutil.copytree(server.data_dir, snapshot)
        server.start()
        for index in range(5):  # transactions both clients see, gone after the restore
            for backend in (first, second):
                grant_and_release(backend, f"{lease_name}-{index}", "x")
        server.stop()
        shutil.rmtree(server.data_dir)
        shutil.copytree(snapshot, server.data_dir)
        server.start()
        # Both reconnect (as new clients, their handshakes refused) before either tries.
        for backend in (first, second):
            wait_until(partial(answers, backend), timeout=WAIT, message="no session")
        waiting = clock()
        wait_until(
            lambda: acquired(first, lease_name, "alice"),
            timeout=lock_delay(TTL) + WAIT,
            message="no grant after the restore",
        )
        assert clock() - waiting >= lock_delay(TTL) - 0.1, "granted within the lock-delay"
        trying = clock()
        again = acquired(second, f"{lease_name}-other", "bob")
        assert again is not None, (
            f"the second client started another lock-delay {clock() - trying:.2f}s after "
            "the first one's had passed"
        )
    finally:
        first.shutdown()
        second.shutdown()


def test_lease_znode_deleted_by_hand_waits_out_the_lock_delay(
    server: ZooKeeperServer, terms: Terms
) -> None:
    """The leader's lease znode deleted by hand while it leads: it loses the lease (its next
    renewal is refused), and nobody is elected before the lock-delay has passed since the
    deletion (the holder could be frozen and still believe it leads until its deadline)."""
    from kazoo.client import KazooClient

    from django_leader.backends.zookeeper import encode_name
    from django_leader.conf import lock_delay

    _leader, lease = leader_and_follower(terms)
    operator = KazooClient(hosts=server.hosts)
    operator.start(WAIT)
    try:
        # The ensemble's clock just before the deletion.
        before = operator.set(f"{terms.root}/clock", b"").mtime
        deleted = clock()
        operator.delete(f"{terms.root}/names/{encode_name(terms.name)}/lease")
    finally:
        operator.stop()
        operator.close()
    assert lease.lost.wait(TTL + SLACK), "the holder did not lose its deleted lease"
    delay = lock_delay(TTL)
    again = wait_until(
        lambda: terms.elected_since(deleted),
        timeout=delay + SESSION + RETRY + SLACK,
        message="nobody was elected again",
    )
    assert again.lease.acquired_at is not None
    print(f"deleted by hand: elected again {again.elected - deleted:.2f}s after the deletion")
    assert again.lease.acquired_at.timestamp() * 1000 >= before + delay * 1000
    assert again.lease.token > lease.token
    terms.check()


def server_zxid(server: ZooKeeperServer) -> str:
    """The newest transaction id of the server (``srvr``'s ``Zxid:`` line)."""
    return next(
        line.split(":", 1)[1].strip()
        for line in server.node.srvr().splitlines()
        if line.startswith("Zxid:")
    )


def test_read_and_ping_write_nothing(server: ZooKeeperServer, lease_name: str) -> None:
    """A health probe (``read()``, the system check's ``ping()``) of a held and a free name,
    from a process that has written nothing, is read-only: the server's newest transaction
    id does not move."""
    root = new_root(server.hosts)
    holder = ZooKeeperBackend(hosts=server.hosts, root=root)
    prober = ZooKeeperBackend(hosts=server.hosts, root=root)
    try:
        lease, _ = holder.acquire(lease_name, "alice", 30)
        assert lease is not None
        prober.ping(WAIT)  # connected (a new session is a transaction of its own)
        before = server_zxid(server)
        seen = prober.read(lease_name)
        assert seen is not None and (seen.holder, seen.token) == ("alice", lease.token)
        assert seen.read_at is not None and seen.expires_at is not None
        assert 0 < (seen.expires_at - seen.read_at).total_seconds() <= 30
        assert prober.read(f"{lease_name}-free") is None
        prober.ping(WAIT)
        assert server_zxid(server) == before, "a read-only probe wrote to the store"
    finally:
        holder.shutdown()
        prober.shutdown()


def test_ensemble_restored_from_an_older_copy_never_repeats_a_token(
    tmp_path: Path, leader_settings: None, lease_name: str
) -> None:
    """A three-node ensemble: copy every node's data directory while stopped, restart, let
    it elect another leader, grant more, stop, put the copies back, start. The restored
    ensemble reuses an epoch it had before (so zxids repeat), yet a process that never saw
    the newer transactions notices (the epoch is not the marker's): the lock-delay, and a
    token greater than every token handed out."""
    from django_leader.conf import lock_delay

    with ZooKeeperEnsemble(tmp_path) as ensemble:
        root = new_root(ensemble.hosts)
        tokens: list[int] = []

        def grant_and_release() -> None:
            backend = ZooKeeperBackend(hosts=ensemble.hosts, root=root, timeout=2.0)
            try:
                lease = wait_until(
                    lambda: acquired(backend, lease_name, "alice"),
                    timeout=lock_delay(TTL) + WAIT,
                    message="no grant",
                )
                tokens.append(lease.token)
                assert backend.release(lease)
            finally:
                backend.shutdown()

        def stop_all() -> None:
            for node in ensemble.nodes:
                node.stop()

        grant_and_release()
        stop_all()
        for i, node in enumerate(ensemble.nodes):
            shutil.copytree(node.data_dir, tmp_path / f"copy{i}")
        ensemble.start_all()
        zk_leader = ensemble.leader()
        ensemble.kill(zk_leader)  # a new epoch, which the restored ensemble will use again
        ensemble.wait_quorum()
        ensemble.start(zk_leader)
        for _ in range(2):
            grant_and_release()
        stop_all()
        for i, node in enumerate(ensemble.nodes):
            shutil.rmtree(node.data_dir)
            shutil.copytree(tmp_path / f"copy{i}", node.data_dir)
        ensemble.start_all()
        back = clock()
        fresh = ZooKeeperBackend(hosts=ensemble.hosts, root=root, timeout=2.0)
        try:
            lease = wait_until(
                lambda: acquired(fresh, lease_name, "bob"),
                timeout=lock_delay(TTL) + WAIT,
                message="no grant after the restore",
            )
        finally:
            fresh.shutdown()
        waited = clock() - back
        print(f"ensemble restore: tokens before {tokens}, after {lease.token}, {waited:.2f}s")
        assert lease.token > max(tokens)
        assert waited >= lock_delay(TTL) - 0.1, "acquired before the lock-delay had passed"


def test_a_read_from_a_clock_an_hour_ahead_still_sees_the_holder(lease_name: str) -> None:
    """A process that has written nothing yet (no estimate of the ensemble's clock) reads a
    held lease: whatever its own clock says, the lease is held. (It once judged expiry by
    its wall clock: an hour ahead, every held lease read as free.)"""
    import time_machine

    from tests.support.stores import zookeeper_backend

    holder = zookeeper_backend()
    reader = ZooKeeperBackend(hosts=holder.conf.hosts, root=holder.root)  # has written nothing
    try:
        lease, _ = holder.acquire(lease_name, "alice", 30)
        assert lease is not None
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        with time_machine.travel(later, tick=True):
            seen = reader.read(lease_name)
        assert seen is not None and seen.holder == "alice"
        assert holder.release(lease)
        assert reader.read(lease_name) is None
    finally:
        holder.shutdown()
        reader.shutdown()


def test_a_name_granted_while_its_record_was_made_is_not_taken_for_a_deletion(
    server: ZooKeeperServer, terms: Terms
) -> None:
    """Two candidates race for a name never used: the loser finds no record, makes it, and
    meanwhile the winner is granted the name. The loser must answer with the winner's lease
    (it was told nothing was held), not take the record it reads back (held, no lease znode
    in its first reading) for a lease deleted by hand: that refused with no holder to show
    and fenced the winner's name for a lock-delay. Found under load by
    test_multiprocess.py's race; made certain here by granting the name inside the loser's
    making of the record."""
    winner, loser = terms.backend(), terms.backend()
    made = loser._ensure

    def ensure_then_lose_the_race(client: Any, path: str, **kwargs: Any) -> Any:
        result = made(client, path, **kwargs)
        if path.endswith(encode_name(terms.name)):
            granted, _ = winner.acquire(terms.name, "winner", TTL)
            assert granted is not None
        return result

    loser._ensure = ensure_then_lose_the_race  # type: ignore[method-assign]
    granted, current = loser.acquire(terms.name, "loser", TTL)
    assert granted is None
    assert current is not None and current.holder == "winner", current
    record = json.loads(winner._session().client.get(winner._name_path(terms.name))[0])
    assert not record.get("fence"), f"the winner's name was fenced: {record}"
