"""Redis with replicas and Sentinels (SPEC rule 9): a failover never gives two leaders nor
repeats a token.

Each test starts its own topology (tests/support/redis_topology.py: a primary, two replicas
and three Sentinels, private servers on loopback) and breaks it for real: the primary is
killed, or frozen until the Sentinels have promoted a replica and then thawed, so that for a
while two servers take writes (the split brain Jepsen found losing acknowledged writes).
Backends use django-redis's ``SentinelClient``, as a project does; a holder whose
connection outlived the failover is a client of the old primary's address.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_leader import BackendUnavailable
from django_leader.checks import check_replication
from tests.support.redis_topology import (
    SentinelTopology,
    given_back_while_frozen,
    handed_on,
    running,
    unavailable,
)
from tests.support.redis_topology import first_grant as grant
from tests.support.stores import answered, stores_db
from tests.support.waiting import wait_until

pytestmark = [stores_db, pytest.mark.xdist_group("replicated"), pytest.mark.topology]

TTL = 3.0
WAIT = 30.0
#: The split-brain tests' TTL: alice's lease must outlive the freeze and the failover
#: (about 2 s) on the old primary, however busy the machine.
SPLIT_TTL = 8.0


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[SentinelTopology]:
    pytest.importorskip("django_redis")
    yield from running(SentinelTopology(tmp_path), unavailable())


def sentinel_cache(topology: SentinelTopology) -> dict[str, Any]:
    """django-redis through the Sentinels, as its documentation configures it."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{topology.service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": topology.sentinel_addresses,
            "SOCKET_TIMEOUT": 1.0,
        },
    }


def direct_cache(port: int) -> dict[str, Any]:
    """A client of one server's address: what a process whose connection outlived the
    failover still talks to."""
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{port}/0"}


@pytest.fixture
def configure(settings: Any) -> Iterator[Any]:
    """``configure(caches, wait=N)``: the given caches, the Redis backend, REDIS_WAIT_REPLICAS."""
    active: list[tuple[Any, dict[str, Any]]] = []

    def apply(caches: dict[str, Any], wait: int, ttl: float = TTL) -> None:
        caches = {**(active[-1][1] if active else {}), **caches}
        conf = {
            **settings.DJANGO_LEADER,
            "BACKEND": "django_leader.backends.redis.RedisBackend",
            "CACHE": next(reversed(caches)),
            "LEASE_TTL": ttl,
            "RENEW_INTERVAL": 1.0,
            "RETRY_INTERVAL": 0.2,
            "REDIS_WAIT_REPLICAS": wait,
        }
        change = override_settings(CACHES={**settings.CACHES, **caches}, DJANGO_LEADER=conf)
        change.enable()
        active.append((change, caches))

    yield apply
    for change, _ in reversed(active):
        change.disable()


def backend(alias: str) -> Any:
    from django_leader.backends.redis import RedisBackend

    return RedisBackend(alias)


def first_grant(store: Any, name: str, holder: str, ttl: float = TTL) -> tuple[Any, float]:
    return grant(store, name, holder, ttl)


def url_cache(topology: SentinelTopology) -> dict[str, Any]:
    """The package's own cache behind the Sentinels, from one ``redis+sentinel://`` URL
    (for projects without django-redis)."""
    sentinels = ",".join(f"{host}:{port}" for host, port in topology.sentinel_addresses)
    return {
        "BACKEND": "django_leader.backends.redis.RedisSentinelCache",
        "LOCATION": f"redis+sentinel://{sentinels}/{topology.service}/0",
        "OPTIONS": {"socket_timeout": 1.0},
    }


@pytest.mark.parametrize("cache", [sentinel_cache, url_cache], ids=["django-redis", "url"])
def test_a_killed_primary_hands_the_lease_on_only_after_the_holders_deadline(
    topology: SentinelTopology, configure: Any, cache: Any
) -> None:
    """The primary dies; the Sentinels promote a replica. The new primary is another
    server process: the backend takes that for a possible loss of state, and nobody gets
    the lease before every holder of the old primary has stepped down; the token is
    greater than any the old primary issued. Through django-redis's Sentinel client, and
    through a ``redis+sentinel://`` URL."""
    configure({"sentinel": cache(topology)}, wait=1)
    store, name = backend("sentinel"), f"failover-{uuid.uuid4().hex[:8]}"
    held, sent = first_grant(store, name, "alice")
    believed_until = sent + TTL  # alice's local deadline is earlier still (rule 2)

    topology.kill_primary()
    handed_on(store, name, held, believed_until, TTL)


def _split_brain(topology: SentinelTopology, configure: Any, wait: int) -> dict[str, Any]:
    """alice leads through the primary; the primary freezes, the Sentinels promote a
    replica, and the primary thaws still taking writes (the Sentinels are paused before
    they can demote it). alice renews through the old primary all along, as a holder whose
    connection outlived the failover does; bob takes the lease on the new primary once its
    lock-delay has passed. Returns alice's lease and renewals (a Lease, None, or the
    error) and bob's lease."""
    old = topology.primary()
    configure({"old": direct_cache(old.port)}, wait=wait, ttl=SPLIT_TTL)
    stale_store, name = backend("old"), f"split-{uuid.uuid4().hex[:8]}"
    held, _ = first_grant(stale_store, name, "alice", SPLIT_TTL)
    renewals: list[Any] = []

    def alice_renews() -> None:
        try:
            renewals.append(stale_store.renew(held, SPLIT_TTL))
        except BackendUnavailable as exc:
            renewals.append(exc)

    topology.freeze(old)
    promoted = topology.await_failover(old.port)
    topology.await_replicas(promoted, len(topology.nodes) - 2)
    topology.pause_sentinels()
    topology.thaw(old)
    try:
        alice_renews()
        # bob connects after the failover (the Sentinels, paused, could not tell him).
        configure({"new": direct_cache(promoted)}, wait=wait, ttl=SPLIT_TTL)
        store = backend("new")

        def granted() -> Any:
            alice_renews()
            return answered(store.acquire, name, "bob", SPLIT_TTL, timeout=WAIT)[0]

        taken = wait_until(granted, timeout=WAIT, interval=0.5, message="bob never got it")
        alice_renews()
        return {"held": held, "renewals": renewals, "taken": taken}
    finally:
        topology.resume_sentinels()


def test_a_renewal_on_a_primary_split_off_by_a_failover_does_not_count(
    topology: SentinelTopology, configure: Any
) -> None:
    """With REDIS_WAIT_REPLICAS=1 the old primary, which no replica follows any more,
    confirms none of alice's renewals: she steps down by her deadline, and bob leads alone,
    with a greater token."""
    found = _split_brain(topology, configure, wait=1)
    assert found["renewals"], "alice never renewed"
    for renewal in found["renewals"]:
        assert isinstance(renewal, BackendUnavailable), renewal
        assert "REDIS_WAIT_REPLICAS" in str(renewal)
    assert found["taken"].token > found["held"].token


def test_without_durable_writes_a_split_off_primary_makes_two_leaders(
    topology: SentinelTopology, configure: Any
) -> None:
    """What REDIS_WAIT_REPLICAS=0 allows (and what ``manage.py check`` warns of, W020):
    the old primary renews alice's lease after bob took the same name on the new one."""
    found = _split_brain(topology, configure, wait=0)
    last = found["renewals"][-1]
    assert last is not None and last.holder == "alice", found["renewals"]
    assert found["taken"].holder == "bob"  # two holders of one name, each told it leads


def test_an_acquisition_the_replicas_do_not_confirm_is_given_back(
    topology: SentinelTopology, configure: Any
) -> None:
    """Both replicas frozen: the primary grants, WAIT times out, the acquisition fails
    with a clear error and the lease is released, not left to keep others out."""
    configure({"sentinel": sentinel_cache(topology)}, wait=1)
    store, name = backend("sentinel"), f"unconfirmed-{uuid.uuid4().hex[:8]}"
    first_grant(store, f"{name}-warm", "alice")  # past the new store's lock-delay
    replicas = [node for node in topology.nodes if node.port != topology.primary_port()]
    given_back_while_frozen(topology, replicas, store, name, TTL)


def test_renewals_and_batches_wait_for_the_replicas(
    topology: SentinelTopology, configure: Any
) -> None:
    """renew() and renew_many() count only once confirmed: with the replicas frozen, both
    fail; once thawed, both succeed and the replicas hold the renewed expiry."""
    configure({"sentinel": sentinel_cache(topology)}, wait=2)
    store, name = backend("sentinel"), f"renew-{uuid.uuid4().hex[:8]}"
    lease, _ = first_grant(store, name, "alice")
    replicas = [node for node in topology.nodes if node.port != topology.primary_port()]
    topology.freeze(replicas[0])
    try:
        with pytest.raises(BackendUnavailable, match="reached 1 of the 2 replicas"):
            store.renew(lease, TTL)
        with pytest.raises(BackendUnavailable, match="reached 1 of the 2 replicas"):
            store.renew_many([lease], TTL)
    finally:
        topology.thaw(replicas[0])
    renewed = wait_until(lambda: answered(store.renew, lease, TTL, timeout=WAIT), timeout=WAIT)
    [again] = store.renew_many([renewed], TTL)
    assert again is not None
    key = store.keys(name)[0]
    for node in replicas:
        assert node.client().hget(key, "expires_at") is not None


def test_check_warns_where_a_failover_could_lose_a_lease(
    topology: SentinelTopology, configure: Any
) -> None:
    """``manage.py check``: a Redis with replicas and no REDIS_WAIT_REPLICAS gets W020
    (what a failover can do); more replicas asked for than the primary has gets W021;
    a setting the topology meets, nothing."""

    def ids(wait: int) -> list[str]:
        configure({"sentinel": sentinel_cache(topology)}, wait=wait)
        return [str(m.id) for m in check_replication(databases=["default"])]

    assert ids(0) == ["django_leader.W020"]
    assert ids(2) == []
    assert ids(3) == ["django_leader.W021"]


def test_a_failover_before_the_store_marker_reached_a_replica_starts_the_lock_delay(
    topology: SentinelTopology, configure: Any
) -> None:
    """The first lease a primary ever grants writes the store marker. Replicas cut off
    (frozen, links killed) before it, the primary killed, a replica promoted: the marker is
    missing there, as on a store never used, and the promoted server was never flushed.
    It was promoted (its previous replication id tells), so the loss counts from now: bob
    gets the lease only after alice's deadline (without durable writes, what W020 warns
    of). Failed before: bob got it at once."""
    configure({"sentinel": sentinel_cache(topology)}, wait=0)
    store, name = backend("sentinel"), f"first-{uuid.uuid4().hex[:8]}"
    primary = topology.primary()
    # Up for longer than the lock-delay: a store never used is used at once.
    wait_until(lambda: int(primary.client().info("server")["uptime_in_seconds"]) > TTL,
               timeout=WAIT)  # fmt: skip
    assert primary.client().exists(store.store_key(name)) == 0
    replicas = [node for node in topology.nodes if node is not primary]
    for node in replicas:
        topology.freeze(node)
    primary.client().execute_command("CLIENT", "KILL", "TYPE", "replica")
    sent = time.monotonic()
    held, _ = store.acquire(name, "alice", TTL)
    assert held is not None
    primary.kill()
    for node in replicas:
        topology.thaw(node)
    topology.await_failover(primary.port)
    assert answered(store.read, name, timeout=WAIT) is None  # the grant was lost

    handed_on(store, name, held, sent + TTL, TTL)
