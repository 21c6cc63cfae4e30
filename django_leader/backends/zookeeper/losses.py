"""What a ZooKeeper store can lose, and how :class:`~.backend.ZooKeeperBackend` notices it
(docs/zookeeper-backend.md#the-store-marker-and-the-lock-delay).

* **The store marker** (``<ROOT>/store``): missing (a new, wiped ensemble; ``ROOT`` or the
  marker deleted by hand), every name waits for the lock-delay and tokens continue from the
  ensemble's clock (:func:`lost_marker`).
* **A rollback** (a restore from an older snapshot): the marker comes back with the rest, so
  its presence proves nothing. Before each grant the acquirer writes the clock znode, and
  the write's zxid tells (:func:`rolled_back`): an ensemble (quorum) starts a new epoch (the
  zxid's high 32 bits) at every restart, so an epoch other than the marker's means the
  ensemble restarted or elected a new leader since, which a restore cannot avoid; and a
  write whose zxid is lower than one the session saw before it was refused (a standalone
  server keeps epoch 0 across restarts) means the store went back. Either way the marker is
  written anew: the lock-delay, and tokens from the clock.
* **A lease znode deleted by hand** (:func:`vanished`): the record says its holder neither
  released nor lost it (``released`` False, no ``expired``), yet the lease znode is gone
  while the session that made it still lives (its ephemeral ``<ROOT>/sessions/<id>``
  znode, :func:`mark_session`): only that name waits for the lock-delay (``fence`` in the
  record). A lease that went with its session needs no wait: a session ends no sooner than
  its timeout (>= the ttl) after its holder's last message, so its holder has stepped down.

Each function is handed the backend (an :class:`~.clock.EnsembleClock`, the package's base)
and uses only its session, paths and clock.
"""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from typing import Any

from ...conf import lock_delay
from ...lease import clock as lease_clock
from ..base import NEW_STORE_HINT
from .clock import EnsembleClock
from .layout import to_ms
from .session import Session

logger = logging.getLogger("django_leader")


def zxid_epoch(zxid: int) -> int:
    """The ensemble epoch a zxid was issued in (its high 32 bits; 0 on a standalone server,
    which never changes it)."""
    return int(zxid) >> 32


def create_marker(
    backend: EnsembleClock, client: Any, delay_ms: int
) -> tuple[dict[str, Any], bool]:
    """Write the store marker: a new epoch (now), no lease for ``delay_ms`` (0: none), and
    the ensemble epoch it was written in. The marker, and False if one was there already."""
    from kazoo.exceptions import NodeExistsError

    stat = backend._clock_stat()  # (makes ROOT if it is missing)
    now = int(stat.mtime)
    marker = {
        "epoch": now,
        "fence": now + delay_ms if delay_ms else 0,
        "zxepoch": zxid_epoch(stat.mzxid),
    }
    try:
        backend._wait(client.create_async(f"{backend.root}/store", json.dumps(marker).encode()))
    except NodeExistsError:
        return marker, False
    return marker, True


def lost_marker(backend: EnsembleClock, client: Any, ttl: float) -> dict[str, Any]:
    """The store marker, found missing by an acquisition: written anew, with a lock-delay
    (or, should another have just written it, that one)."""
    backend._forget_made()  # whatever we made may have gone with the marker
    delay = lock_delay(ttl)
    marker, created = create_marker(backend, client, to_ms(delay))
    if not created:  # another acquisition wrote it meanwhile: that one
        found = backend._get(client, f"{backend.root}/store")
        return found[0] if found is not None else marker
    logger.warning(
        "zookeeper %r %r has no store marker: it lost its state (wiped, restored, ROOT "
        "deleted) or was never used for leases. No lease on it may be taken for the "
        "lock-delay of %.1fs, so that every holder that could still believe it leads has "
        "stepped down. %s",
        backend.conf.hosts,
        backend.root,
        delay,
        NEW_STORE_HINT,
    )
    return marker


def rolled_back(
    backend: EnsembleClock,
    client: Any,
    session: Session,
    marker: tuple[dict[str, Any], Any],
    clock: Any,
    ttl: float,
) -> bool:
    """Whether the store may have gone back in time since ``marker`` was written, judged by
    ``clock`` (the stat of a write of the clock znode made just now): if so the marker is
    written anew (a new epoch, the lock-delay from now) and True is returned (the caller
    refuses). A marker of an older version (no ``zxepoch``) is given the current one."""
    from kazoo.exceptions import BadVersionError, NoNodeError

    data, stat = marker
    epoch = zxid_epoch(clock.mzxid)
    forgotten, session.forgotten = session.forgotten, 0
    went_back = bool(forgotten) and int(clock.mzxid) < forgotten
    if went_back and _rewritten_since(data, clock, session.refused_at):
        went_back = False  # another process noticed first: its lock-delay covers this one
    if "zxepoch" not in data and not went_back:
        updated = {**data, "zxepoch": epoch}  # written by an older version: adopt it
        why = ""
    elif data.get("zxepoch") != epoch or went_back:
        now = int(clock.mtime)
        delay = lock_delay(ttl)
        updated = {"epoch": now, "fence": now + to_ms(delay), "zxepoch": epoch}
        why = (
            f"a write got zxid {int(clock.mzxid):#x}, lower than {forgotten:#x} seen before"
            if went_back
            else f"ensemble epoch {epoch} (the marker's: {data.get('zxepoch')})"
        )
    else:
        return False
    try:
        backend._wait(
            client.set_async(
                f"{backend.root}/store", json.dumps(updated).encode(), version=stat.version
            )
        )
    except (BadVersionError, NoNodeError):
        return True  # another acquirer rewrote (or a wipe removed) it: look again
    if not why:
        return False
    backend._forget_made()
    logger.warning(
        "zookeeper %r %r may have been restored to an older state (%s): no lease on it may "
        "be taken for the lock-delay of %.1fs, and tokens continue from the ensemble's clock",
        backend.conf.hosts,
        backend.root,
        why,
        lock_delay(ttl),
    )
    return True


#: Seconds by which a marker must postdate a refused handshake to count as written after it
#: (clock rates and the two readings' latencies).
REWRITE_MARGIN = 0.2


def _rewritten_since(data: dict[str, Any], clock: Any, refused_at: float) -> bool:
    """Whether the marker was written (``epoch``, the ensemble's ms) after this process saw
    its handshake refused at ``refused_at`` (the lease clock): the store had gone back
    before that refusal, so such a marker and its lock-delay came after the rollback, and
    cover it. Measured as two ages, the marker's on the ensemble's clock and the refusal's
    on ours, so that only their rates need agree."""
    written = data.get("epoch")
    if not written or not refused_at:
        return False
    marker_age = (int(clock.mtime) - int(written)) / 1000
    return marker_age + REWRITE_MARGIN < lease_clock() - refused_at


def session_path(backend: EnsembleClock, session_id: int) -> str:
    return f"{backend.root}/sessions/{session_id:x}"


def mark_session(backend: EnsembleClock, client: Any) -> int | None:
    """Make sure the session ``client`` runs has its ephemeral marker (it goes when the
    session ends, with the session's leases, in the same transaction); its id."""
    from kazoo.exceptions import NodeExistsError

    session_id = (client.client_id or (None,))[0]
    if not session_id:
        return None
    path = session_path(backend, session_id)
    if path not in backend._made:
        with suppress(NodeExistsError):
            backend._wait(client.create_async(path, b"", ephemeral=True, makepath=True))
        backend._made.add(path)
    return int(session_id)


def vanished(
    backend: EnsembleClock,
    client: Any,
    name: str,
    record: tuple[dict[str, Any], Any],
    ttl: float,
) -> bool:
    """The name's lease znode is missing: True if nobody may take the name now, because
    it was deleted by hand while its holder may still believe it leads (the lock-delay
    starts now, written as the record's ``fence``), or such a lock-delay still runs."""
    from kazoo.exceptions import BadVersionError, NoNodeError

    data, stat = record
    fence = int(data.get("fence") or 0)
    if fence:
        return not backend._passed(fence)[0]
    if (
        "token" not in data
        or not data.get("holder")
        or data.get("released", True)
        or data.get("expired")
    ):
        return False  # never taken, released, force-released, or gone after its expiry
    owner = data.get("session")
    if owner and backend._wait(client.exists_async(session_path(backend, int(owner, 16)))) is None:
        return False  # it went with its session, which outlives its holder's deadline
    delay = lock_delay(ttl)
    until = backend._now_ms() + to_ms(delay)
    try:
        backend._wait(
            client.set_async(
                backend._name_path(name),
                json.dumps({**data, "fence": until}).encode(),
                version=stat.version,
            )
        )
    except (BadVersionError, NoNodeError):
        return True  # changed meanwhile: the next attempt looks again
    logger.warning(
        "zookeeper %r: the lease znode of %r (holder %r, token %s) is gone, but neither "
        "released nor expired, while its session lives (deleted by hand?): nobody may take "
        "it for the lock-delay of %.1fs",
        backend.conf.hosts,
        name,
        data.get("holder"),
        data.get("token"),
        delay,
    )
    return True
