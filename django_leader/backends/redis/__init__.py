"""Leases in Redis, through Django's cache framework (django-redis or Django's RedisCache).

:class:`RedisBackend`; ``django_leader.backends.cache.CacheBackend`` is another name for it
(the setting's value before it was renamed), and keeps working.

Every operation is one Lua script, so each check-and-write is atomic on the server, and
every time in it comes from the server (``TIME``, ``PEXPIRE``), never from a client clock.

Keys (one lease's keys share a hash tag, so they sit in one Redis Cluster slot):

* ``<prefix>:<version>:django_leader:{<name>}:lease`` — a hash (holder, token,
  acquired_at, renewed_at, expires_at; times in microseconds since the epoch on the
  server's clock) that expires with the lease (``PEXPIRE``). Missing = free; an empty
  holder = force-released, free for the taking once the key expires.
* ``<prefix>:<version>:django_leader:{<name>}:meta`` — a hash without expiry: the last
  fencing token, transitions, the last holder, whether it released, the end of its term
  (``expires``: a lease key deleted by hand or evicted still keeps others out until then)
  and the store epoch the token was issued in.
* ``<prefix>:<version>:django_leader:{<name>}:candidates`` — a sorted set of the Electors
  campaigning for the name (identity, scored by when its candidacy expires); only for
  ``manage.py leader status``, never part of a lease decision.
* ``<prefix>:<version>:django_leader:store`` — the store marker: the ``run_id`` of the
  Redis process that wrote it, the current epoch and the end of a running lock-delay.
* ``<prefix>:<version>:django_leader:terms`` — a hash of every lease name to the end of
  its last term, so that a name whose keys were deleted by hand is not given away early.

On a Redis Cluster (:class:`RedisClusterCache`) the two store-wide keys are kept once per
hash slot instead (``django_leader:{<slot tag>}:store`` and ``:terms``), so that every
script touches one slot: see :mod:`.cluster`.

**A Redis that forgets** (see "When the store forgets" in docs/safety.md). Redis may
lose writes it acknowledged: a ``FLUSHDB``/``FLUSHALL`` (``cache.clear()`` is one), a
restart without persistence, a restart from an RDB snapshot or an AOF older than the last
writes, a failover to a replica that missed them. A holder that cannot reach Redis may then
still believe it leads until its local deadline, while the store says the name is free.
Every acquisition therefore first checks the store marker:

* missing (flushed, restarted without persistence, deleted, failed over to a replica that
  never had it, or a store never used): the state was lost when the server started if
  nothing was flushed since (``INFO commandstats``) and the server was never promoted
  from replica (``INFO replication``), else at an unknown time before now;
* written by another server process (``run_id`` differs: a restart from disk, a failover):
  lost now.

Either way the marker is written anew with a new epoch, and no lease of this store may be
taken until the loss time plus the **lock-delay** (:func:`django_leader.conf.lock_delay`:
``LOCK_DELAY``, default ``LEASE_TTL``, or the acquirer's own ttl if longer; a longer ttl
asked for while the delay runs lengthens it). Every holder that could still believe it
leads made its last successful renewal before the loss, so its local deadline has passed by
then. A Redis that has been up for longer than the lock-delay and was never flushed is
used at once.

Tokens never repeat: a name whose counter is missing, or was issued in an earlier epoch
(the state may be an older snapshot), continues from the server's clock in microseconds
(``TIME``) when that is greater. Every token ever issued is at most the clock reading at
its issue plus the number of acquisitions issued within the same microseconds, so the new
token is greater than every earlier one. The assumption: Redis's clock does not go
backwards across the restart or failover (by more than the time the restart took). Tokens
therefore look like ``1763784000123457`` rather than ``1``; only their order matters.

The package, one concern a module, lower first: cluster.py (the cache, client and per-slot
keys of a Redis Cluster), sentinel.py (a cache behind Sentinels from one URL), client.py
(the redis-py client behind the cache, bounded in time), scripts.py (the Lua script of
each operation), store.py (what the others share: the client, the scripts registered, key
names, calls routed to their server, reply decoding), leases.py (acquire, renew, release,
read, hand-over, retention), batch.py (many renewals in one round trip), registry.py
(candidates), listen.py (wake-ups over pub/sub), slots.py (the beat's slot records),
backend.py (:class:`RedisBackend`, made of them).
"""

from django_leader.backends.redis.backend import RedisBackend
from django_leader.backends.redis.batch import BATCH
from django_leader.backends.redis.client import redis_client
from django_leader.backends.redis.cluster import RedisClusterCache
from django_leader.backends.redis.sentinel import RedisSentinelCache

__all__ = ["BATCH", "RedisBackend", "RedisClusterCache", "RedisSentinelCache", "redis_client"]
