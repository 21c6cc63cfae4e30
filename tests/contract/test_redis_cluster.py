"""Redis Cluster (SPEC "Replicated and pooled stores"): every lease in one hash slot, the
store marker and the terms kept per slot, MOVED and ASK followed, and a master failover
never giving two leaders nor repeating a token.

Each test starts its own cluster (tests/support/redis_cluster.py: three masters with a
replica each, private servers on loopback) and breaks it for real: a master killed,
frozen, or failed over by hand, its replica frozen first. Backends use
``django_leader.backends.redis.RedisClusterCache``, as a project does.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_leader import BackendUnavailable
from django_leader.checks import check_replication
from django_leader.testing.contract import BackendContract, RetentionContract
from tests.support.redis_cluster import ClusterTopology, unavailable
from tests.support.redis_topology import first_grant as grant
from tests.support.redis_topology import given_back_while_frozen, handed_on, running
from tests.support.stores import answered, stores_db, wipe
from tests.support.waiting import wait_until

#: A group of their own: beside the other replicated stores' (one topology at a time
#: there), not behind them.
pytestmark = [stores_db, pytest.mark.xdist_group("cluster"), pytest.mark.topology]

TTL = 3.0
#: The TTL of a lease that must outlive the test's steps, however slow the machine.
HELD = 60.0
WAIT = 30.0


def started(workdir: Path) -> Iterator[ClusterTopology]:
    yield from running(ClusterTopology(workdir), unavailable())


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterTopology]:
    """A cluster of the test's own, to break."""
    yield from started(tmp_path)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    """A cluster the contract's tests share, never broken, marked new by
    ``RedisBackend.initialize()`` (``manage.py leader init``): without its markers, a
    slot's first lease would wait for the lock-delay from the cluster's start, as its nodes
    may have been restarted without persistence for all the backend knows. The contract's
    tests take names in any slot at once, so each slot's marker must be there."""
    from django_leader.backends.redis import RedisBackend

    for found in started(tmp_path_factory.mktemp("cluster")):
        with override_settings(CACHES={**django_settings.CACHES, "cluster": cluster_cache(found)}):
            store = RedisBackend("cluster")
            assert store.initialize()
            assert not store.initialize()  # every marker there already
            store.close()
        yield found


def cluster_cache(cluster: ClusterTopology) -> dict[str, str]:
    return {
        "BACKEND": "django_leader.backends.redis.RedisClusterCache",
        "LOCATION": ",".join(f"redis://{node}" for node in cluster.startup_nodes),
    }


class TestTheContractOnACluster(BackendContract, RetentionContract):
    """The lease contract every store passes (django_leader.testing.contract), and
    retention, on a cluster: each test's name lands on whichever master serves its slot."""

    @pytest.fixture
    def backend(self, settings: Any, shared_cluster: ClusterTopology) -> Iterator[Any]:
        from django_leader.backends.redis import RedisBackend

        settings.CACHES = {**settings.CACHES, "cluster": cluster_cache(shared_cluster)}
        store = RedisBackend("cluster")
        yield store
        store.close()

    def forget(self, backend: Any, name: str) -> None:
        wipe(backend, name)


@pytest.fixture
def configure(settings: Any, cluster: ClusterTopology) -> Iterator[Any]:
    """``configure(wait=N)``: the Redis backend on a ``RedisClusterCache`` of the cluster
    (given one node: the client finds the others), REDIS_WAIT_REPLICAS ``N``."""
    active: list[Any] = []

    def apply(wait: int, ttl: float = TTL) -> None:
        cache = {
            "BACKEND": "django_leader.backends.redis.RedisClusterCache",
            "LOCATION": f"redis://{cluster.startup_nodes[0]}",
        }
        conf = {
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.redis.RedisBackend",
            "CACHE": "cluster",
            "LEASE_TTL": ttl,
            "RENEW_INTERVAL": 1.0,
            "RETRY_INTERVAL": 0.2,
            "REDIS_WAIT_REPLICAS": wait,
        }
        change = override_settings(CACHES={**settings.CACHES, "cluster": cache}, DJANGO_LEADER=conf)
        change.enable()
        active.append(change)

    yield apply
    for change in reversed(active):
        change.disable()


def backend() -> Any:
    from django_leader.backends.redis import RedisBackend

    return RedisBackend("cluster")


def first_grant(store: Any, name: str, holder: str, ttl: float = TTL) -> tuple[Any, float]:
    return grant(store, name, holder, ttl)


def names_on_every_master(cluster: ClusterTopology, store: Any, per_master: int) -> list[str]:
    """Fresh lease names, ``per_master`` served by each master."""
    by_master: dict[int, list[str]] = {}
    while (
        min((len(v) for v in by_master.values()), default=0) < per_master
        or len(by_master) < len(cluster.nodes) // 2
    ):
        name = f"spread-{uuid.uuid4().hex[:8]}"
        by_master.setdefault(cluster.master_of(store.keys(name)[0]).port, []).append(name)
    return [name for names in by_master.values() for name in names[:per_master]]


def test_every_lease_operation_runs_on_the_slot_of_its_name(
    cluster: ClusterTopology, configure: Any
) -> None:
    """Names served by each of the three masters: acquired, read, renewed one by one and
    all in one renew_many, listed, released (with the wake-up heard), taken again with a
    greater token. Every key a lease script touches hashes to the name's slot."""
    from redis.crc import key_slot

    configure(wait=1)
    store = backend()
    names = names_on_every_master(cluster, store, per_master=3)
    for name in names:
        slots = {key_slot(key.encode()) for key in
                 [*store.keys(name), store.store_key(name), store.terms_key(name)]}  # fmt: skip
        assert len(slots) == 1, (name, slots)

    def granted(name: str) -> Any:
        """Acquired with TTL (the lock-delay of a new store is the TTL asked), then held for
        the whole test: with TTL alone, the first leases expired before the last was
        granted once, on a loaded machine (nothing here waits for an expiry)."""
        renewed = store.renew(first_grant(store, name, "alice")[0], HELD)
        assert renewed is not None, name
        return renewed

    leases = [granted(name) for name in names]
    assert [store.read(name).holder for name in names] == ["alice"] * len(names)
    assert store.renew(leases[0], HELD) is not None
    renewed = store.renew_many(leases, HELD)
    assert all(lease is not None for lease in renewed), renewed
    assert set(names) <= set(store.names())

    heard = threading.Event()
    watch = store.watch(names[-1], heard.set)
    assert watch is not None
    try:
        wait_until(lambda: watch.live, timeout=WAIT, message="never subscribed")
        assert store.release(leases[-1])
        assert heard.wait(5.0), "no wake-up for the release"
    finally:
        watch.close()
    again, _ = store.acquire(names[-1], "bob", TTL)
    assert again is not None and again.token > leases[-1].token


def test_a_backend_made_while_the_cluster_is_down_answers_unavailable(
    cluster: ClusterTopology, configure: Any
) -> None:
    """Making the backend does not connect; its calls fail with BackendUnavailable while
    no node answers, and work once the cluster is back."""
    configure(wait=0)
    for node in cluster.nodes:
        cluster.freeze(node)
    try:
        store = backend()
        with pytest.raises(BackendUnavailable):
            store.acquire("down", "alice", TTL)
    finally:
        for node in cluster.nodes:
            cluster.thaw(node)
    lease, _ = first_grant(store, f"down-{uuid.uuid4().hex[:6]}", "alice")
    assert lease.holder == "alice"


def test_a_killed_master_hands_the_lease_on_only_after_the_holders_deadline(
    cluster: ClusterTopology, configure: Any
) -> None:
    """The master of the name's slot dies; its replica takes over. It is another server
    process: the backend takes that for a possible loss of state, and nobody gets the lease
    before every holder of the old master has stepped down; the token is greater than any
    the old master issued. Leases on the other masters are not delayed. (The killed node
    is started again, as an operator would: it rejoins as the new master's replica.)"""
    configure(wait=1)
    store, name = backend(), f"failover-{uuid.uuid4().hex[:8]}"
    held, sent = first_grant(store, name, "alice")
    believed_until = sent + TTL  # alice's local deadline is earlier still (rule 2)
    old = cluster.master_of(store.keys(name)[0])
    elsewhere = next(n for n in names_on_every_master(cluster, store, 1)
                     if cluster.master_of(store.keys(n)[0]) is not old)  # fmt: skip

    cluster.kill(old)
    cluster.await_promoted(old, store.keys(name)[0])
    # The promoted replica has no replica of its own until the killed node is back (as
    # its replica): with REDIS_WAIT_REPLICAS 1 no lease write counts before.
    cluster.restart(old)

    handed_on(store, name, held, believed_until, TTL)
    other, _ = answered(store.acquire, elsewhere, "carol", TTL, timeout=WAIT)
    assert other is not None, "a lease on a master that did not fail over was delayed"


def test_a_manual_failover_keeps_the_lease_and_its_renewals_follow_the_new_master(
    cluster: ClusterTopology, configure: Any
) -> None:
    """``CLUSTER FAILOVER``: the replica had every confirmed write, so alice's lease
    survives; her next renewal, sent where her client last saw the slot, is answered MOVED
    and follows to the new master (renew and renew_many alike)."""
    configure(wait=1)
    store, name = backend(), f"manual-{uuid.uuid4().hex[:8]}"
    held, _ = first_grant(store, name, "alice")
    old = cluster.master_of(store.keys(name)[0])
    new = cluster.manual_failover(old, store.keys(name)[0])
    # The first call after the failover, not retried: answered MOVED by the demoted master
    # (which also refuses the WAIT that followed), and sent again to the new one.
    renewed = store.renew(held, TTL)
    assert renewed is not None and renewed.token == held.token
    [again] = store.renew_many([renewed], TTL)
    assert again is not None
    assert new.client().hget(store.keys(name)[0], "holder") == b"alice"


def test_an_acquisition_the_replica_does_not_confirm_is_given_back(
    cluster: ClusterTopology, configure: Any
) -> None:
    """The replica of the name's master frozen: the master grants, WAIT times out, the
    acquisition fails with a clear error and the lease is released, not left to keep
    others out."""
    configure(wait=1)
    store, name = backend(), f"unconfirmed-{uuid.uuid4().hex[:8]}"
    first_grant(store, name, "warm")  # past the new cluster's lock-delay
    lease = store.read(name)
    assert lease is not None and store.release(lease)
    replica = cluster.replica_of(cluster.master_of(store.keys(name)[0]))
    given_back_while_frozen(cluster, [replica], store, name, TTL)


def test_a_replica_that_missed_the_last_grant_is_promoted_after_the_lock_delay(
    cluster: ClusterTopology, configure: Any
) -> None:
    """The worst case, without durable writes (REDIS_WAIT_REPLICAS 0, what W020 warns
    of): the replica frozen and its link cut, alice granted on the master alone, the
    master killed, the replica thawed and promoted without alice's grant. The lease looks
    free there, yet bob gets it only after alice's deadline, with a greater token."""
    configure(wait=0)
    store, name = backend(), f"lag-{uuid.uuid4().hex[:8]}"
    first_grant(store, f"{name}-warm", "warm")
    master = cluster.master_of(store.keys(name)[0])
    replica = cluster.replica_of(master)
    cluster.freeze(replica)
    # Its link cut too: else the grant waits in the socket buffers and arrives on thaw.
    master.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
    sent = time.monotonic()
    held, _ = store.acquire(name, "alice", TTL)
    assert held is not None
    cluster.kill(master)
    cluster.thaw(replica)
    cluster.await_promoted(master, store.keys(name)[0])
    assert answered(store.read, name, timeout=WAIT) is None  # the grant was lost

    handed_on(store, name, held, sent + TTL, TTL)


def test_check_warns_where_a_failover_could_lose_a_lease(
    cluster: ClusterTopology, configure: Any
) -> None:
    """``manage.py check`` on a cluster: masters with replicas and no REDIS_WAIT_REPLICAS
    get W020; more replicas asked for than a master has get W021; 1, nothing."""

    def ids(wait: int) -> list[str]:
        configure(wait=wait)
        return [str(m.id) for m in check_replication(databases=["default"])]

    assert ids(0) == ["django_leader.W020"]
    assert ids(1) == []
    assert ids(2) == ["django_leader.W021"]


def test_a_slot_migrating_mid_term_is_followed_by_ask_then_moved(
    cluster: ClusterTopology, configure: Any
) -> None:
    """Resharding: the lease's slot moves to another master while alice holds the lease.
    While it migrates (its keys already on the new master, the slot not yet handed over)
    the old master answers ASK, and calls are sent on with ASKING; once the slot is handed
    over, MOVED. alice renews throughout: her lease came with the keys. The store marker
    came too, written by another server process: the first acquisition on the new master
    cannot tell a migration from a restart, so the slot's new grants wait out a lock-delay
    (conservative: nothing was lost). The next term's token is greater."""
    from redis.crc import key_slot

    configure(wait=1)
    store, name = backend(), f"reshard-{uuid.uuid4().hex[:8]}"
    held, _ = first_grant(store, name, "alice")
    key = store.keys(name)[0]
    slot = key_slot(key.encode())
    source = cluster.master_of(key)
    target = next(
        cluster.node(port)
        for port, info in cluster.layout().items()
        if info["role"] == "master" and port != source.port
    )
    source_id = source.client().execute_command("CLUSTER MYID")
    target_id = target.client().execute_command("CLUSTER MYID")
    target.client().execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source.client().execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    keys = source.client().execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
    assert len(keys) >= 3, keys  # the lease, its meta, the slot's store marker
    source.client().execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)

    # Answered ASK by the source, run on the target with ASKING.
    renewed = store.renew(held, TTL)
    assert renewed is not None and renewed.token == held.token

    def marker() -> list[Any]:  # on the importing master: a read needs ASKING there
        pipe = target.client().pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.hmget(store.store_key(name), "run_id", "fence")
        return list(pipe.execute()[1])

    written_by, _ = marker()
    assert store.acquire(name, "bob", TTL)[0] is None  # held; the marker starts the delay
    noticed_by, fence = marker()
    assert noticed_by != written_by and int(fence) > 0  # taken for a loss: a lock-delay
    for node in (target, source):
        node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    again = store.renew(renewed, TTL)  # answered MOVED by the source
    assert again is not None and again.token == held.token
    assert target.client().hget(key, "holder") == b"alice"
    assert store.release(again)
    taken, _ = first_grant(store, name, "bob")  # once the lock-delay has passed
    assert taken.token > held.token
