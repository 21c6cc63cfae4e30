"""Leases in ZooKeeper (on kazoo): a consensus store that survives the loss of a server.

:class:`ZooKeeperBackend`, configured by ``DJANGO_LEADER["ZOOKEEPER"]`` (docs/
zookeeper-backend.md). Every lease decision is one ZooKeeper write made conditional on the
versions read just before it (a ``multi`` where it changes several znodes), so two
contenders never both succeed; every time comes from the ensemble (a write's ``mtime``),
never from a client clock.

Znodes under ``ROOT`` (``/django-leader``), for a lease name ``N`` (percent-encoded):

* ``names/N`` — the name's record, persistent: the last token, transitions, the last holder
  and whether it released, the store epoch the token was issued in, a standing hand-over
  request. Its version is the compare-and-set of every acquisition.
* ``names/N/lease`` — the lease, **ephemeral**: holder, token, ttl. Created by the
  acquisition (in the same ``multi`` as the record's update), its ``ctime`` is the
  acquisition and its ``mtime`` the last renewal (a conditional ``set``), so it expires at
  ``mtime + ttl`` by the ensemble's clock; a contender deletes an expired one (conditional on
  its version) in the ``multi`` that takes the name. Being ephemeral, it also goes when the
  holder's **session** ends: ZooKeeper's own failure detector. A session ends no sooner than
  its timeout after the holder's last message, which came after its last renewal was sent,
  so as long as the ttl is within the session timeout the ensemble granted, the holder's
  local deadline (send time of its last renewal + ttl - margin) always comes first
  (docs/safety.md). A lease whose ttl is longer than that timeout (the ensemble clamps
  sessions to its maxSessionTimeout) is a **persistent** znode instead, freed by its expiry
  alone.
* ``names/N/queue/c<digest>-<seq>`` — a candidate (fifo and priority elections),
  **ephemeral sequential**: the sequence is the join order; the data what the candidate
  said of itself, its ``mtime`` its last heartbeat. Each candidate that waits in a queue
  watches only the node before its own (ZooKeeper's recipe: no herd), the head watches the
  lease.
* ``names/N/bells/<digest>`` — door bells: :meth:`ZooKeeperBackend.wake` writes one, and
  the watchers it names are woken.
* ``store`` — the store marker: the epoch and the end of a lock-delay. Missing (a new or a
  wiped ensemble, a ``ROOT`` deleted by hand): the state may have been lost, so nobody may
  take a lease for the lock-delay and tokens continue from the ensemble's clock in
  microseconds, like the Redis backend's.
* ``clock`` — written to read the ensemble's clock (its ``mtime``) and epoch (its zxid).
* ``sessions/<id>`` — ephemeral, one per session that took a lease: tells a lease znode
  that went with its session from one deleted by hand (losses.py).

Fencing tokens: the record's counter, incremented by the compare-and-set that grants the
lease, so it survives a restart of the ensemble and the loss of any session (it is
persistent and written through ZooKeeper's log before the grant is acknowledged). After a
loss (a missing marker, a rollback noticed by losses.py) it continues from the
ensemble's clock. Why not the lease node's ``czxid``: a restored ensemble issues zxids it
issued before (a standalone server keeps epoch 0, an ensemble restored with its epoch
files starts the epoch after theirs), see docs/zookeeper-backend.md#fencing-tokens.

The package, one concern a module, lower first: layout.py (znode names, times),
session.py (a kazoo session and its handshake), ensemble.py (settings, calls, paths),
clock.py (the ensemble's clock and estimates of it), losses.py (the store marker,
rollbacks, lease znodes deleted by hand), leases.py (acquire, release, read), renewal.py
(renewal, many at once), candidates.py (the queue), watches.py (the watch thread),
slots.py (the beat's slot records), backend.py (:class:`ZooKeeperBackend`, made of them).
"""

from .backend import ZooKeeperBackend
from .layout import candidate_prefix, encode_name

__all__ = ["ZooKeeperBackend", "candidate_prefix", "encode_name"]
