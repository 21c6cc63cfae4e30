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
  that went with its session from one deleted by hand (zookeeper_losses.py).

Fencing tokens: the record's counter, incremented by the compare-and-set that grants the
lease, so it survives a restart of the ensemble and the loss of any session (it is
persistent and written through ZooKeeper's log before the grant is acknowledged). After a
loss (a missing marker, a rollback noticed by zookeeper_losses.py) it continues from the
ensemble's clock. Why not the lease node's ``czxid``: a restored ensemble issues zxids it
issued before (a standalone server keeps epoch 0, an ensemble restored with its epoch
files starts the epoch after theirs), see docs/zookeeper-backend.md#fencing-tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, unquote

from ..conf import ZooKeeperSettings, get_settings
from ..exceptions import BackendUnavailable, NotSupportedError
from ..lease import EventKind, Lease
from ..lease import clock as lease_clock
from . import zookeeper_losses as losses
from .base import Backend, Watch
from .history import HistoryWriter, WrittenAfterwards

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from ..conf import LeaderSettings
    from ..election import Candidate
    from .zookeeper_slots import ZooKeeperSlots

logger = logging.getLogger("django_leader")

_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)

#: How sure a clock estimate must be (seconds) to decide "not expired yet" without writing
#: the clock znode; closer calls read the ensemble's clock.
ESTIMATE_SLACK = 0.25
#: The session timeout asked for when ``SESSION_TIMEOUT`` is None (or ``LEASE_TTL`` if
#: longer). A lease expires by its own ttl, so a longer session costs no failover time; it
#: only has to cover every ttl granted in it (ZooKeeper's default maxSessionTimeout is 40 s).
DEFAULT_SESSION_TIMEOUT = 30.0
#: Seconds a session handshake may take before the client gives up on that server and
#: tries again (kazoo's own bound is the whole session timeout).
HANDSHAKE_TIMEOUT = 2.0
#: Session handshakes in a row that may fail before the client forgets the newest
#: transaction it has seen (which a server that lost its data refuses for ever). Forgetting
#: it costs nothing that matters here: a server behind the others may then answer reads
#: with older data, but every decision is a conditional write, made by the ensemble's
#: leader on its current data.
HANDSHAKES_REFUSED = 1
#: How long a clock estimate is trusted before the clock znode is written again.
ESTIMATE_AGE = 30.0
#: Leases renewed by one ``multi`` of :meth:`ZooKeeperBackend.renew_many` (two operations
#: each, well under the ensemble's request size limit, ``jute.maxbuffer``).
BATCH = 500


@dataclass
class _Held:
    """What this backend knows of a lease znode it wrote (see ``_held``)."""

    #: The lease znode's version after our last write.
    version: int
    #: Its ``mtime`` then (the ensemble's milliseconds), and the ttl written.
    mtime: int
    ttl: int
    #: The timeout granted to the session that owns it, in ms: 0 for a persistent znode
    #: (or not known), -1 for another session's.
    granted: int
    #: The version of the name's record when we last read or wrote it. Every grant changes
    #: the record, so a write conditional on this version cannot land on a lease znode made
    #: by a later grant (whose version restarts at 0 and may equal ours).
    record_version: int
    #: The record's content at that version (its hand-over request, its transitions): a
    #: renewal conditional on the version needs not read it again.
    record: dict[str, Any] = field(default_factory=dict)


def _time(ms: int | float) -> datetime:
    return _EPOCH + timedelta(milliseconds=int(ms))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def candidate_prefix(identity: str) -> str:
    """The start of the name of ``identity``'s candidate znode (ZooKeeper appends the
    sequence number)."""
    return f"c{_digest(identity)}-"


def encode_name(name: str) -> str:
    """A lease name as one znode name (percent-encoded; '.' too, since '.' and '..' are
    not znode names)."""
    return quote(name, safe="").replace(".", "%2E")


def kazoo_module() -> Any:
    try:
        import kazoo.client
    except ImportError:  # pragma: no cover - depends on the environment
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "django_leader's ZooKeeper backend needs kazoo: pip install 'django-leader[zookeeper]'"
        ) from None
    return kazoo


def _acl(conf: ZooKeeperSettings) -> list[Any] | None:
    from kazoo.security import ACL, CREATOR_ALL_ACL, Id, make_acl

    if conf.acl is None:
        return None
    if conf.acl == "creator":
        return list(CREATOR_ALL_ACL)
    acls = []
    for entry in conf.acl:
        scheme_id, perms = entry.rsplit(":", 1)
        scheme, ident = scheme_id.split(":", 1)
        flags = {
            "read": "r" in perms,
            "write": "w" in perms,
            "create": "c" in perms,
            "delete": "d" in perms,
            "admin": "a" in perms,
        }
        acls.append(make_acl(scheme, ident, **flags))
    assert all(isinstance(acl, ACL) and isinstance(acl.id, Id) for acl in acls)
    return acls


class _Session:
    """One kazoo client (one ZooKeeper session) and the session timeout it was granted."""

    def __init__(self, conf: ZooKeeperSettings, timeout: float, on_state: Callable) -> None:
        kazoo = kazoo_module()
        self.requested = timeout
        #: Seconds the ensemble granted (None until the first connection).
        self.granted: float | None = None
        #: The newest zxid the client had seen when a refused handshake made it forget it
        #: (0: none): a later write with a lower zxid shows the store went back.
        self.forgotten = 0
        #: When (lease clock) the first such refusal was seen: the store went back before.
        self.refused_at = 0.0
        self.client = kazoo.client.KazooClient(
            hosts=conf.hosts,
            timeout=timeout,
            auth_data=list(conf.auth) or None,
            default_acl=_acl(conf),
            # Reconnect forever, in the background; each call has its own bound.
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 0.5},
            command_retry=None,
        )
        self._wrap_connect(conf)
        self.client.add_listener(on_state)
        self.started = self.client.start_async()

    def _wrap_connect(self, conf: ZooKeeperSettings) -> None:
        """Learn the session timeout the ensemble granted (it may clamp the one asked to its
        min/maxSessionTimeout): kazoo keeps it only as the read timeout, 2/3 of it."""
        connection = getattr(self.client, "_connection", None)
        connect = getattr(connection, "_connect", None)
        if connection is None or connect is None:  # pragma: no cover - another kazoo
            return

        def recording(*args: Any, **kwargs: Any) -> Any:
            result = connect(*args, **kwargs)
            self.granted = result[0] * 1.5 / 1000.0
            return result

        connection._connect = recording
        invoke = getattr(connection, "_invoke", None)
        if invoke is None:  # pragma: no cover - another kazoo
            return
        from kazoo.protocol.serialization import Connect

        client = self.client
        refused = [0]
        session = self

        def handshake(timeout: float, request: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(request, Connect):
                return invoke(timeout, request, *args, **kwargs)
            # kazoo waits up to the whole session timeout for the session handshake: a
            # server that accepted the connection but does not answer yet (starting,
            # frozen) would keep us SUSPENDED that long. Give up sooner and try again.
            try:
                result = invoke(min(timeout, HANDSHAKE_TIMEOUT), request, *args, **kwargs)
            except Exception:
                refused[0] += 1
                if refused[0] >= HANDSHAKES_REFUSED and client.last_zxid:
                    # A server that lost its data (wiped, restored from an older snapshot)
                    # refuses every client that has seen a newer transaction than its own,
                    # for ever. The store's loss is then noticed like any other (its marker
                    # is missing: the lock-delay); to get there, connect as a new client.
                    logger.warning(
                        "zookeeper %r refused %d session handshake(s) in a row: if it lost "
                        "its data it refuses clients that saw newer transactions; "
                        "connecting again as a new client",
                        conf.hosts,
                        refused[0],
                    )
                    if not session.forgotten:
                        session.refused_at = lease_clock()
                    session.forgotten = max(session.forgotten, int(client.last_zxid))
                    client.last_zxid = 0
                    refused[0] = 0
                raise
            refused[0] = 0
            return result

        connection._invoke = handshake


class ZooKeeperBackend(WrittenAfterwards, Backend):
    """Leases in the ZooKeeper ensemble of ``DJANGO_LEADER["ZOOKEEPER"]``."""

    def __init__(
        self,
        *,
        timeout: float | None = None,
        root: str | None = None,
        hosts: str | None = None,
        session_timeout: float | None = None,
    ) -> None:
        conf = get_settings()
        base = conf.zookeeper or _default_zookeeper()
        self.conf = ZooKeeperSettings(
            hosts=hosts or base.hosts,
            root=root or base.root,
            session_timeout=session_timeout or base.session_timeout,
            connect_timeout=base.connect_timeout,
            auth=base.auth,
            acl=base.acl,
        )
        self.timeout = timeout or conf.timing.call_timeout
        self.root = self.conf.root
        self.history_database = conf.database if conf.history else None
        self._history = HistoryWriter(conf.database) if conf.history else None
        self._lock = threading.Lock()
        self._current: _Session | None = None
        self._default_timeout = float(
            self.conf.session_timeout or max(conf.timing.ttl, DEFAULT_SESSION_TIMEOUT)
        )
        #: (ensemble ms, time.monotonic()) of the latest write seen: the clock estimate.
        self._clock: tuple[int, float] | None = None
        #: (name, holder, token) -> what we know of the lease znode we wrote.
        self._versions: dict[tuple[str, str, int], _Held] = {}
        #: (name, identity) -> path of our candidate node.
        self._mine: dict[tuple[str, str], str] = {}
        self._made: set[str] = set()
        self._hub: _Hub | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"<ZooKeeperBackend {self.conf.hosts!r} {self.root!r}>"

    # -- connection -------------------------------------------------------------------------
    def _session(self) -> _Session:
        """This backend's session, connected within the call bound, else
        BackendUnavailable (the client keeps reconnecting in the background)."""
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            session = self._current
            if session is None:
                session = self._current = _Session(
                    self.conf, self._default_timeout, self._state_changed
                )
        if not session.client.connected:
            bound = self.conf.connect_timeout or self.timeout
            session.started.wait(bound)
            if not session.client.connected:
                raise BackendUnavailable(
                    f"zookeeper {self.conf.hosts!r}: not connected (session state "
                    f"{session.client.state})"
                )
        return session

    def _forked(self) -> None:
        """In a forked child: the parent's sessions are the parent's (their threads did not
        come along, and closing them would end the parent's session): start afresh."""
        with self._lock:
            self._pid = os.getpid()
            self._current = None
            self._hub = None
            self._versions.clear()
            self._mine.clear()

    @property
    def client(self) -> Any:
        return self._session().client

    def _state_changed(self, state: str) -> None:
        hub = self._hub
        if hub is not None:
            hub.state_changed(state)

    def _wait(self, result: Any, deadline: float | None = None) -> Any:
        """The outcome of a kazoo async call within the call bound (or by ``deadline``, a
        ``time.monotonic()`` time, for the calls of a batch sent together)."""
        from kazoo.exceptions import (
            ConnectionClosedError,
            ConnectionLoss,
            OperationTimeoutError,
            SessionExpiredError,
        )
        from kazoo.handlers.threading import KazooTimeoutError

        timeout = self.timeout if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return result.get(timeout=timeout)
        except KazooTimeoutError as exc:
            raise BackendUnavailable(
                f"zookeeper {self.conf.hosts!r}: no answer within {self.timeout:g}s"
            ) from exc
        except (
            ConnectionLoss,
            SessionExpiredError,
            ConnectionClosedError,
            OperationTimeoutError,
        ) as exc:
            raise BackendUnavailable(f"zookeeper {self.conf.hosts!r}: {exc!r}") from exc

    def _get(self, client: Any, path: str) -> tuple[dict[str, Any], Any] | None:
        """``(data, stat)`` of ``path``, or None if it does not exist."""
        return self._read_result(client.get_async(path))

    def _read_result(
        self, result: Any, deadline: float | None = None
    ) -> tuple[dict[str, Any], Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._wait(result, deadline)
        except NoNodeError:
            return None
        return (json.loads(raw) if raw else {}), stat

    def _ensure(self, client: Any, path: str, *, anew: bool = False) -> None:
        """Create ``path`` (and its parents) if missing; remembered once made. ``anew``:
        it was found missing (the store was wiped): forget that it was made."""
        if anew:
            self._made.discard(path)
        elif path in self._made:
            return
        from kazoo.exceptions import NodeExistsError

        with suppress(NodeExistsError):
            self._wait(client.create_async(path, b"", makepath=True))
        self._made.add(path)

    def _seen(self, mtime: int) -> None:
        """A write's ``mtime``: the ensemble's clock when it was applied."""
        self._clock = (int(mtime), time.monotonic())

    # -- paths ------------------------------------------------------------------------------
    def _name_path(self, name: str) -> str:
        return f"{self.root}/names/{encode_name(name)}"

    def _lease_path(self, name: str) -> str:
        return f"{self._name_path(name)}/lease"

    def _queue_path(self, name: str) -> str:
        return f"{self._name_path(name)}/queue"

    def _bell_path(self, name: str, identity: str | None) -> str:
        return f"{self._name_path(name)}/bells/{_digest(identity) if identity else 'all'}"

    # -- the ensemble's clock ---------------------------------------------------------------
    def _clock_stat(self) -> Any:
        """A write to the clock znode: its stat (``mtime``: the ensemble's clock now;
        ``mzxid``: its epoch)."""
        from kazoo.exceptions import NoNodeError

        client = self.client
        path = f"{self.root}/clock"
        try:
            stat = self._wait(client.set_async(path, b""))
        except NoNodeError:
            self._ensure(client, path, anew=True)
            stat = self._wait(client.set_async(path, b""))
        self._seen(stat.mtime)
        return stat

    def _now_ms(self) -> int:
        """The ensemble's clock now: a write to the clock znode, whose ``mtime`` it is."""
        return int(self._clock_stat().mtime)

    def _read_only_now(self, floor: int) -> int:
        """The ensemble's clock as well as a process can tell without writing: the clock
        estimate whatever its age (else the clock znode's last ``mtime``, a time the
        ensemble has passed: never this machine's clock, which may be ahead and report a
        held lease free), never before ``floor`` (an ``mtime`` just read). For :meth:`read`
        alone: no lease decision rests on it."""
        if self._clock is None:
            stat = self._wait(self.client.exists_async(f"{self.root}/clock"))
            return max(floor, int(stat.mtime) if stat is not None else 0)
        at, seen = self._clock
        return max(floor, at + int((time.monotonic() - seen) * 1000))

    def now(self) -> datetime:
        return _time(self._now_ms())

    def _estimate_ms(self) -> int | None:
        if self._clock is None:
            return None
        at, seen = self._clock
        age = time.monotonic() - seen
        if age > ESTIMATE_AGE:
            return None
        return at + int(age * 1000)

    def _passed(self, until_ms: int) -> tuple[bool, int]:
        """Has the ensemble's clock passed ``until_ms``? ``(passed, now_ms)``. A clock
        estimate (the last write's ``mtime`` plus the time since) answers "not yet" when
        it is sure by :data:`ESTIMATE_SLACK`; otherwise the clock znode is written. Only a
        reading of the ensemble's clock ever answers "passed"."""
        estimate = self._estimate_ms()
        if estimate is not None and estimate + ESTIMATE_SLACK * 1000 < until_ms:
            return False, estimate
        now = self._now_ms()
        return now >= until_ms, now

    # -- the store marker -------------------------------------------------------------------
    def _forget_made(self) -> None:
        """The store lost state: whatever we made (parents, session markers) may be gone."""
        self._made.clear()

    def initialize(self) -> bool:
        """Write the store marker of a ``ROOT`` never used before, **without** the
        lock-delay a missing marker otherwise costs (nobody can hold a lease in a store that
        never had one). True if this call wrote it, False if it was there. Only for a new
        ``ROOT``: after a wipe or a restore, let the first acquisition notice the loss."""
        return losses.create_marker(self, self.client, 0)[1]

    # -- lease operations -------------------------------------------------------------------
    def _lease(
        self, name: str, data: dict[str, Any], stat: Any, record: dict[str, Any] | None
    ) -> Lease:
        expires = self._expiry(data, stat)
        return Lease(
            name=name,
            holder=str(data.get("holder", "")),
            token=int(data["token"]),
            transitions=int((record or {}).get("transitions", 0)),
            acquired_at=_time(stat.ctime),
            renewed_at=_time(stat.mtime),
            expires_at=_time(expires),
        )

    @staticmethod
    def _expiry(data: dict[str, Any], stat: Any) -> int:
        until = data.get("until")
        return int(until) if until is not None else int(stat.mtime) + int(data["ttl"])

    def acquire(self, name: str, holder: str, ttl: float) -> tuple[Lease | None, Lease | None]:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        session = self._session()
        client = session.client
        # Ephemeral when the session outlives the lease (its end then frees it, never
        # before the holder's deadline); else persistent, freed by its expiry alone.
        ephemeral = session.granted is not None and ttl <= session.granted
        path, lease_path = self._name_path(name), self._lease_path(name)
        marker_result = client.get_async(f"{self.root}/store")  # sent first, read after
        record_found, current = self._record_and_lease(client, name)
        marker = self._read_result(marker_result)
        if marker is None:
            # Written anew with the lock-delay: a rollback the session saw is covered too.
            session.forgotten = 0
        store = marker[0] if marker is not None else losses.lost_marker(self, client, ttl)

        fence = int(store.get("fence", 0))
        if fence:
            passed, _ = self._passed(fence)
            if not passed:
                return None, None
        stale: tuple[dict[str, Any], Any] | None = None
        if current is not None:
            data, stat = current
            passed, now = self._passed(self._expiry(data, stat))
            if not passed:
                if not data.get("holder"):  # force-released, its term still running
                    return None, None
                lease = self._lease(name, data, stat, record_found and record_found[0])
                lease.read_at = _time(now)
                return None, lease
            stale = current
        if record_found is None:
            self._ensure(client, path, anew=True)
            # Read both again: another candidate may have been granted the name meanwhile
            # (its record then says held, and our first reading had no lease znode).
            record_found, current = self._record_and_lease(client, name)
            if record_found is None:
                raise BackendUnavailable(f"zookeeper: {path} vanished")
            if current is not None:
                return None, self.read(name)
        record, record_stat = record_found
        if current is None and losses.vanished(self, client, name, record_found, ttl):
            return None, None  # deleted by hand: the lock-delay runs
        to, until = record.get("handover_to"), int(record.get("handover_until") or 0)
        if to and to != holder and until and not self._passed(until)[0]:
            return None, None
        # A write of the clock before each grant: its zxid tells a rolled-back store.
        clock = self._clock_stat()
        if marker is not None and losses.rolled_back(self, client, session, marker, clock, ttl):
            return None, None
        owner = losses.mark_session(self, client) if ephemeral else None
        token = record.get("token")
        if token is None or record.get("epoch") != store.get("epoch"):
            # A new name, or a counter that may be older than tokens already issued (the
            # store lost state): continue from the ensemble's clock in microseconds.
            token = max(int(token or 0), int(clock.mtime) * 1000)
        token = int(token) + 1
        previous = str(record.get("holder") or "")
        released = bool(record.get("released", True))
        if stale is not None:
            previous, released = str(stale[0].get("holder") or previous), False
            if not stale[0].get("holder"):
                released = True
        new_record = {
            **record,
            "name": name,
            "token": token,
            "holder": holder,
            "released": False,
            "epoch": store.get("epoch"),
            "transitions": int(record.get("transitions", 0)) + 1,
            "session": f"{owner:x}" if owner else None,
        }
        for gone in ("handover_to", "handover_until", "fence", "expired"):
            new_record.pop(gone, None)
        lease_data = {"holder": holder, "token": token, "ttl": _ms(ttl)}
        transaction = client.transaction()
        if stale is not None:
            transaction.delete(lease_path, version=stale[1].version)
        transaction.set_data(path, json.dumps(new_record).encode(), version=record_stat.version)
        transaction.create(lease_path, json.dumps(lease_data).encode(), ephemeral=ephemeral)
        pending = transaction.commit_async()
        try:
            results = self._wait(pending)
        except BackendUnavailable:
            # The grant may still be applied after we gave up: hand it back if it is.
            pending.rawlink(lambda outcome: self._hand_back(outcome, name, holder, token))
            raise
        failed = _failure(results)
        if failed is not None:
            if isinstance(failed[1], BadVersionError | NodeExistsError | NoNodeError):
                return None, self.read(name)  # another candidate (or request) came first
            raise BackendUnavailable(f"zookeeper: acquisition of {name!r}: {failed[1]!r}")
        stat = results[-2]
        self._seen(stat.mtime)
        self._versions[(name, holder, token)] = _Held(
            version=0,
            mtime=int(stat.mtime),
            ttl=_ms(ttl),
            granted=_granted_ms(session) if ephemeral else 0,
            record_version=int(stat.version),
            record=new_record,
        )
        lease = Lease(
            name=name,
            holder=holder,
            token=token,
            transitions=new_record["transitions"],
            acquired_at=_time(stat.mtime),
            renewed_at=_time(stat.mtime),
            expires_at=_time(stat.mtime + _ms(ttl)),
            previous_holder=previous,
        )
        taken_over = bool(previous) and not released
        if not taken_over:
            lease.previous_holder = ""
        self._record(
            EventKind.TAKEN_OVER if taken_over else EventKind.ACQUIRED,
            lease,
            lease.acquired_at,
            detail=f"lease of {previous} had expired" if taken_over else "",
        )
        return lease, lease

    def _hand_back(self, outcome: Any, name: str, holder: str, token: int) -> None:
        try:
            results = outcome.get_nowait()
        except Exception:
            return
        if any(isinstance(result, Exception) for result in results):
            return
        lease = Lease(name, holder, token, None, None, None, 0)
        threading.Thread(target=self._release_quietly, args=(lease,), daemon=True).start()

    def _release_quietly(self, lease: Lease) -> None:
        try:
            self.release(lease)
        except Exception:  # pragma: no cover - best effort; the lease expires anyway
            logger.debug("handing back a late grant of %r failed", lease.name, exc_info=True)

    def _record_and_lease(
        self, client: Any, name: str
    ) -> tuple[tuple[dict[str, Any], Any] | None, tuple[dict[str, Any], Any] | None]:
        """The name's record and its lease znode (each ``(data, stat)`` or None), asked for
        together, the record first: a grant between the two reads then shows in the lease,
        and one after them in the record's version (so a write conditional on it fails)."""
        record_result = client.get_async(self._name_path(name))
        lease_result = client.get_async(self._lease_path(name))
        return self._read_result(record_result), self._read_result(lease_result)

    def _held(
        self, client: Any, lease: Lease, *, fresh: bool = False
    ) -> tuple[_Held, dict[str, Any]] | None:
        """What we know of ``lease``'s znode if it is still ``lease.holder``'s with
        ``lease.token`` (None if not), and the name's record as read (``{}`` if from the
        cache). ``fresh``: read both (:meth:`_record_and_lease`)."""
        key = (lease.name, lease.holder, lease.token)
        known = self._versions.get(key)
        if known is not None and not fresh:
            return known, {}
        return self._held_as_read(lease, *self._record_and_lease(client, lease.name))

    def _held_as_read(
        self,
        lease: Lease,
        record_found: tuple[dict[str, Any], Any] | None,
        found: tuple[dict[str, Any], Any] | None,
    ) -> tuple[_Held, dict[str, Any]] | None:
        """:meth:`_held` from the name's record and lease znode as read."""
        key = (lease.name, lease.holder, lease.token)
        if found is None or record_found is None:
            return None
        data, stat = found
        if data.get("holder") != lease.holder or int(data.get("token", -1)) != lease.token:
            return None
        if data.get("until") is not None:
            return None
        owner = 0
        if stat.ephemeralOwner:
            session = self._current
            ours = session is not None and (session.client.client_id or (None,))[0]
            owner = _granted_ms(session) if session and ours == stat.ephemeralOwner else -1
        held = _Held(
            version=int(stat.version),
            mtime=int(stat.mtime),
            ttl=int(data["ttl"]),
            granted=owner,
            record_version=int(record_found[1].version),
            record=record_found[0],
        )
        self._versions[key] = held
        return held, record_found[0]

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        return self.renew_many([lease], ttl)[0]

    def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """:meth:`renew` each of ``leases``, pipelined: every read, every clock reading and
        every conditional write of the batch is sent before any answer is waited for, so a
        batch costs the round trips of one renewal (one, once the lease znodes' versions
        are known), not one per lease. Each lease's write is conditional on its own
        record's and lease znode's versions, as a single renewal's is."""
        if not leases:
            return []
        client = self.client
        wanted = {(lease.name, lease.holder, lease.token): lease for lease in leases}
        answers: dict[tuple[str, str, int], Any] = {}
        pending = list(wanted)
        for attempt in range(2):
            # What we know of each lease znode; read (all at once) what we do not, and on
            # the second attempt everything (a write found the versions changed).
            deadline = time.monotonic() + self.timeout
            reads = {
                key: self._record_and_lease_async(client, key[0])
                for key in pending
                if attempt or key not in self._versions
            }
            held: dict[tuple[str, str, int], _Held] = {}
            for key in pending:
                if key in reads:
                    record_result, lease_result = reads[key]
                    found = self._held_as_read(
                        wanted[key],
                        self._read_result(record_result, deadline),
                        self._read_result(lease_result, deadline),
                    )
                    known = found[0] if found is not None else None
                else:
                    known = self._versions[key]
                if known is None:
                    self._versions.pop(key, None)
                    answers[key] = None
                    continue
                # An ephemeral lease is never longer than its session (whose end frees
                # it); -1: another session's, whose timeout we do not know.
                limit = known.ttl if known.granted < 0 else known.granted
                if limit and _ms(ttl) > limit:
                    raise NotSupportedError(
                        f"cannot renew {key[0]!r} for {ttl:g}s: the session that holds it "
                        f"ends {limit / 1000:g}s after its holder's last message, and its "
                        "end frees the lease"
                    )
                held[key] = known
            self._drop_expired(held, answers)
            pending = self._renew_held(client, held, ttl, answers)
            if not pending:
                break
        for key in pending:  # conflicting twice: another grant, or a hand-over request
            answers[key] = None
        renewed: list[Lease | None] = []
        for lease in leases:
            answer = answers[(lease.name, lease.holder, lease.token)]
            if answer is None:
                renewed.append(None)
                continue
            data, stat, record = answer
            one = self._lease(lease.name, data, stat, record)
            one.handover_to = _handover_to(record, stat.mtime)
            renewed.append(one)
        return renewed

    def _record_and_lease_async(self, client: Any, name: str) -> tuple[Any, Any]:
        """:meth:`_record_and_lease` sent, not waited for."""
        return client.get_async(self._name_path(name)), client.get_async(self._lease_path(name))

    def _drop_expired(
        self, held: dict[tuple[str, str, int], _Held], answers: dict[tuple[str, str, int], Any]
    ) -> None:
        """Refuse the leases of ``held`` whose term has passed by the ensemble's clock, as
        far as a clock estimate tells (without one, the write's ``mtime`` will): those the
        estimate is not sure of are decided by one reading of the clock for all."""
        estimate = self._estimate_ms()
        if estimate is None:
            return
        unsure = [
            key
            for key, known in held.items()
            if estimate + ESTIMATE_SLACK * 1000 >= known.mtime + known.ttl
        ]
        if not unsure:
            return
        now = self._now_ms()
        for key in unsure:
            known = held[key]
            if now >= known.mtime + known.ttl:
                del held[key]
                self._versions.pop(key, None)
                answers[key] = None

    def _renew_held(
        self,
        client: Any,
        held: dict[tuple[str, str, int], _Held],
        ttl: float,
        answers: dict[tuple[str, str, int], Any],
    ) -> list[tuple[str, str, int]]:
        """Write every lease znode of ``held``, each write conditional on the lease's own
        record and znode versions: one ``multi`` per ``BATCH`` (500) leases, all sent before
        the first answer is waited for. A ``multi`` is all or nothing, so one that a lease
        made fail is sent again without it, one ``multi`` per lease: one lease refused
        never costs the others theirs. Puts ``(data, stat, record)`` of each renewed lease
        (None if refused) in ``answers``; returns the leases to look at again (their
        versions changed: another grant, or a hand-over request)."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        keys = list(held)
        groups = [keys[start : start + BATCH] for start in range(0, len(keys), BATCH)]
        again = []
        deadline = time.monotonic() + self.timeout
        while groups:
            sent = []
            for group in groups:
                transaction = client.transaction()
                for name, holder, token in group:
                    transaction.check(
                        self._name_path(name), held[(name, holder, token)].record_version
                    )
                    data = {"holder": holder, "token": token, "ttl": _ms(ttl)}
                    transaction.set_data(
                        self._lease_path(name),
                        json.dumps(data).encode(),
                        version=held[(name, holder, token)].version,
                    )
                sent.append((group, transaction.commit_async()))
            groups = []
            for group, pending in sent:
                results = self._wait(pending, deadline)
                failed = _failure(results)
                if failed is None:
                    for index, key in enumerate(group):
                        self._renewed(client, key, held[key], results[2 * index + 1], ttl, answers)
                    continue
                if not isinstance(failed[1], BadVersionError | NoNodeError):
                    raise BackendUnavailable(
                        f"zookeeper: renewal of {group[failed[0] // 2][0]!r}: {failed[1]!r}"
                    )
                culprit = group[failed[0] // 2]
                self._versions.pop(culprit, None)
                again.append(culprit)
                groups += [[key] for key in group if key != culprit]
        return again

    def _renewed(
        self,
        client: Any,
        key: tuple[str, str, int],
        known: _Held,
        stat: Any,
        ttl: float,
        answers: dict[tuple[str, str, int], Any],
    ) -> None:
        """A lease znode written by a renewal: renewed, unless its term had passed first."""
        name, holder, token = key
        self._seen(stat.mtime)
        if stat.mtime >= known.mtime + known.ttl:
            # It had expired before this renewal reached the ensemble: not renewed, and the
            # znode we just wrote goes (nobody else has taken the name: the record has not
            # changed), marked ``expired`` in the record (no lock-delay for that).
            self._versions.pop(key, None)
            cleanup = client.transaction()
            cleanup.set_data(
                self._name_path(name),
                json.dumps({**known.record, "expired": True}).encode(),
                version=known.record_version,
            )
            cleanup.delete(self._lease_path(name), version=stat.version)
            cleanup.commit_async().rawlink(lambda _: None)
            answers[key] = None
            return
        known.version, known.mtime, known.ttl = int(stat.version), int(stat.mtime), _ms(ttl)
        self._versions[key] = known
        # The record is as we know it (the write was conditional on its version): its
        # hand-over request, if any, needs no reading.
        data = {"holder": holder, "token": token, "ttl": _ms(ttl)}
        answers[key] = (data, stat, known.record)

    def release(self, lease: Lease) -> bool:
        from kazoo.exceptions import BadVersionError, NoNodeError

        client = self.client
        key = (lease.name, lease.holder, lease.token)
        for _ in range(5):
            found = self._held(client, lease, fresh=True)
            if found is None:
                self._versions.pop(key, None)
                return False
            held, record = found
            transaction = client.transaction()
            transaction.delete(self._lease_path(lease.name), version=held.version)
            transaction.set_data(
                self._name_path(lease.name),
                json.dumps({**record, "released": True}).encode(),
                version=held.record_version,
            )
            results = self._wait(transaction.commit_async())
            failed = _failure(results)
            if failed is None:
                self._versions.pop(key, None)
                self._seen(results[1].mtime)
                self._record(EventKind.RELEASED, lease, _time(results[1].mtime))
                return True
            if not isinstance(failed[1], NoNodeError | BadVersionError):
                raise BackendUnavailable(f"zookeeper: release of {lease.name!r}: {failed[1]!r}")
            # A renewal we did not see, a successor, a hand-over request: look again.
        raise BackendUnavailable(f"zookeeper: release of {lease.name!r} kept conflicting")

    def force_release(self, name: str, *, actor: str = "", detail: str = "") -> Lease | None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        client = self.client
        for _ in range(5):
            record_found, found = self._record_and_lease(client, name)
            if found is None or record_found is None or not found[0].get("holder"):
                return None
            data, stat = found
            until = self._expiry(data, stat)
            if self._passed(until)[0]:
                return None
            lease = self._lease(name, data, stat, record_found[0])
            transaction = client.transaction()
            # No holder, but the term is not cut short: nobody may take it before it ends.
            transaction.set_data(
                self._lease_path(name),
                json.dumps({**data, "holder": "", "until": until}).encode(),
                version=stat.version,
            )
            transaction.set_data(
                self._name_path(name),
                json.dumps({**record_found[0], "released": True}).encode(),
                version=record_found[1].version,
            )
            results = self._wait(transaction.commit_async())
            failed = _failure(results)
            if failed is not None:
                if isinstance(failed[1], BadVersionError | NoNodeError):
                    continue
                raise BackendUnavailable(f"zookeeper: force release of {name!r}: {failed[1]!r}")
            self._seen(results[0].mtime)
            self._versions.pop((name, lease.holder, lease.token), None)
            self._record(
                EventKind.FORCED_RELEASE, lease, _time(results[0].mtime), detail=detail, actor=actor
            )
            return lease
        raise BackendUnavailable(f"zookeeper: force release of {name!r} kept conflicting")

    def read(self, name: str) -> Lease | None:
        """Read-only (two reads, no write: a health probe changes nothing); expiry by
        ``_read_only_now()``."""
        record_found, found = self._record_and_lease(self.client, name)
        if found is None or not found[0].get("holder"):
            return None
        data, stat = found
        now = self._read_only_now(int(stat.mtime))
        if now >= self._expiry(data, stat):
            return None
        lease = self._lease(name, data, stat, record_found and record_found[0])
        lease.read_at = _time(now)
        lease.handover_to = _handover_to(record_found[0] if record_found else {}, now)
        return lease

    def names(self) -> list[str]:
        from kazoo.exceptions import NoNodeError

        client = self.client
        try:
            children = self._wait(client.get_children_async(f"{self.root}/names"))
        except NoNodeError:
            return []
        # A name's record is made empty by a watcher of a name never taken: not a lease.
        results = [(child, client.get_async(f"{self.root}/names/{child}")) for child in children]
        return sorted(
            unquote(child)
            for child, result in results
            if (found := self._read_result(result)) is not None and "token" in found[0]
        )

    # -- candidates -------------------------------------------------------------------------
    def _queue(self, client: Any, name: str) -> list[str]:
        """The candidate node names of ``name`` in join order."""
        from kazoo.exceptions import NoNodeError

        try:
            children = self._wait(client.get_children_async(self._queue_path(name)))
        except NoNodeError:
            return []
        return sorted(children, key=lambda child: child.rsplit("-", 1)[-1])

    def _my_node(self, client: Any, name: str, identity: str) -> str | None:
        """The node name of ``identity``'s candidacy for ``name`` (None if it has none)."""
        prefix = candidate_prefix(identity)
        mine = [child for child in self._queue(client, name) if child.startswith(prefix)]
        return mine[0] if mine else None

    def announce(self, name: str, candidate: Candidate, ttl: float) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.client
        info = {
            "identity": candidate.identity,
            "priority": candidate.priority,
            "host": candidate.host,
            "pid": candidate.pid,
            "version": candidate.version,
            "ttl": _ms(ttl),
        }
        raw = json.dumps(info).encode()
        key = (name, candidate.identity)
        node = self._mine.get(key) or self._my_node(client, name, candidate.identity)
        if node is not None:
            try:
                stat = self._wait(client.set_async(f"{self._queue_path(name)}/{node}", raw))
            except NoNodeError:
                node = None  # its session ended or it expired: join again, at the tail
            else:
                self._seen(stat.mtime)
                self._mine[key] = node
                return
        created = self._wait(
            client.create_async(
                f"{self._queue_path(name)}/{candidate_prefix(candidate.identity)}",
                raw,
                ephemeral=True,
                sequence=True,
                makepath=True,
            )
        )
        self._mine[key] = created.rsplit("/", 1)[-1]
        hub = self._hub
        if hub is not None:
            hub.rearm(name, candidate.identity)

    def withdraw(self, name: str, identity: str) -> None:
        from kazoo.exceptions import NoNodeError

        client = self.client
        node = self._mine.pop((name, identity), None) or self._my_node(client, name, identity)
        if node is None:
            return
        with suppress(NoNodeError):
            self._wait(client.delete_async(f"{self._queue_path(name)}/{node}"))

    def candidates(self, name: str) -> list[Candidate] | None:
        from kazoo.exceptions import NoNodeError

        from ..election import Candidate

        client = self.client
        nodes = self._queue(client, name)
        results = [client.get_async(f"{self._queue_path(name)}/{node}") for node in nodes]
        found = []
        for node, result in zip(nodes, results, strict=True):
            try:
                raw, stat = self._wait(result)
            except NoNodeError:
                continue
            info = json.loads(raw)
            expires = int(stat.mtime) + int(info.get("ttl", 0))
            if self._passed(expires)[0]:
                client.delete_async(f"{self._queue_path(name)}/{node}", stat.version)
                continue
            found.append(
                Candidate(
                    identity=str(info["identity"]),
                    priority=int(info.get("priority", 0)),
                    host=str(info.get("host", "")),
                    pid=int(info.get("pid", 0)),
                    version=str(info.get("version", "")),
                    seq=int(node.rsplit("-", 1)[-1]),
                    joined_at=_time(stat.ctime),
                    seen_at=_time(stat.mtime),
                    expires_at=_time(expires),
                )
            )
        return found

    # -- wake-ups and hand-over -------------------------------------------------------------
    def watch(
        self, name: str, callback: Callable[[], None], *, identity: str | None = None
    ) -> Watch | None:
        """ZooKeeper watches: a race watcher watches the lease node (woken when it goes)
        and the name's door bell; a queued candidate watches its own bell and the node
        before its own in the queue (the head: the lease node)."""
        with self._lock:
            if self._hub is None:
                self._hub = _Hub(self)
            hub = self._hub
        return hub.watch(name, identity, callback)

    def wake(self, name: str, identity: str | None = None) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        client = self.client
        path = self._bell_path(name, identity)
        try:
            self._wait(client.set_async(path, b""))
        except NoNodeError:
            # Never watched, or lost with the store: creating it rings it too.
            with suppress(NodeExistsError):
                self._wait(client.create_async(path, b"", makepath=True))

    def request_handover(
        self, name: str, to: str, window: float, *, actor: str = "", detail: str = ""
    ) -> Lease | None:
        from kazoo.exceptions import BadVersionError

        client = self.client
        path = self._name_path(name)
        self._ensure(client, path)
        for _ in range(10):
            found = self._get(client, path)
            if found is None:  # deleted meanwhile (the store was wiped): make it again
                self._ensure(client, path, anew=True)
                continue
            record, stat = found
            now = self._now_ms()
            updated = {**record, "handover_to": to, "handover_until": now + _ms(window)}
            try:
                self._wait(
                    client.set_async(path, json.dumps(updated).encode(), version=stat.version)
                )
            except BadVersionError:
                continue
            lease = self.read(name)
            self._record(
                EventKind.HANDOVER,
                lease or Lease(name, "", 0, None, None, None, 0),
                _time(now),
                detail=detail or f"to {to}",
                actor=actor,
            )
            return lease
        raise BackendUnavailable(f"zookeeper: hand-over request for {name!r} kept conflicting")

    # -- beat slot records ------------------------------------------------------------------
    #: Beat slot records are znodes beside the lease's, written in a ``multi`` that checks
    #: the lease znode's version first.
    shared_slots: ClassVar[bool] = True

    def slots(self) -> ZooKeeperSlots:
        from .zookeeper_slots import ZooKeeperSlots

        return ZooKeeperSlots(self)

    # -- what the admin and the checks need -------------------------------------------------
    def describe(self) -> str:
        history = self.history_database or get_settings().database
        return (
            f"{type(self).__name__} {self.conf.hosts!r} {self.root!r}: live state read from "
            f"the ensemble; history from database {history!r}."
        )

    @classmethod
    def check_configuration(cls, conf: LeaderSettings) -> list[CheckMessage]:
        """E005: kazoo must be installed."""
        from django.core.checks import Error

        try:
            import kazoo  # noqa: F401
        except ImportError:
            return [
                Error(
                    "DJANGO_LEADER['BACKEND'] is the ZooKeeper backend, but kazoo is not installed",
                    hint="pip install 'django-leader[zookeeper]'",
                    id="django_leader.E005",
                )
            ]
        return []

    def ping(self, timeout: float) -> float:
        """Connect (within ``timeout``) and return the session timeout the ensemble granted
        (seconds); BackendUnavailable if it does not answer. For the system check: one
        read, no write."""
        with self._lock:
            session = self._current
            if session is None:
                session = self._current = _Session(
                    self.conf, self._default_timeout, self._state_changed
                )
        session.started.wait(timeout)
        if not session.client.connected:
            raise BackendUnavailable(
                f"zookeeper {self.conf.hosts!r}: no answer within {timeout:g}s"
            )
        self._wait(session.client.exists_async(self.root))
        return session.granted or self._default_timeout

    def close(self) -> None:
        """kazoo's connection is shared by threads: nothing per thread."""

    def shutdown(self) -> None:
        """End every session (its ephemeral leases and candidacies go at once) and the
        watch thread. The backend reconnects if used again."""
        with self._lock:
            sessions = [self._current] if self._current is not None else []
            self._current = None
            hub, self._hub = self._hub, None
        if hub is not None:
            hub.stop()
        for session in sessions:
            try:
                session.client.stop()
                session.client.close()
            except Exception:  # pragma: no cover - best effort
                logger.debug("closing a ZooKeeper session failed", exc_info=True)
        self._versions.clear()
        self._mine.clear()
        self._made.clear()


def _handover_to(record: dict[str, Any], at_ms: int) -> str:
    """The candidate a hand-over request in the name's ``record`` names, if it still stands
    at ``at_ms`` (the ensemble's clock); "" otherwise."""
    to, until = record.get("handover_to"), int(record.get("handover_until") or 0)
    return str(to) if to and until > at_ms else ""


def _failure(results: list[Any]) -> tuple[int, Exception] | None:
    """The operation of a failed ``multi`` that made it fail, and why (the others report
    ``RolledBackError``); None if it succeeded."""
    from kazoo.exceptions import RolledBackError

    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return index, result
    return None


def _granted_ms(session: _Session) -> int:
    """The session timeout granted to ``session`` in milliseconds (0 if not known yet)."""
    return round(session.granted * 1000) if session.granted else 0


def _default_zookeeper() -> ZooKeeperSettings:
    from ..conf import _validate_zookeeper

    settings = _validate_zookeeper({})
    assert settings is not None
    return settings


class _ZkWatch:
    def __init__(self, hub: _Hub, name: str, identity: str | None, callback: Callable) -> None:
        self.hub = hub
        self.name = name
        self.identity = identity
        self.callback = callback
        self.closed = False
        #: The connection generation this watch was last armed in.
        self.armed_in = -1
        #: The znodes it watches: (kind, path) keys of :attr:`_Hub.paths`.
        self.keys: set[tuple[str, str]] = set()

    @property
    def live(self) -> bool:
        return not self.closed and self.hub.connected() and self.armed_in == self.hub.generation

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.hub.forget(self)


#: What a watched znode is to the watches that watch it.
_LEASE, _BELL, _PREDECESSOR = "lease", "bell", "predecessor"


class _Hub:
    """The watches of one backend, and the thread that arms them again after each event
    (ZooKeeper watches fire once) and calls their callbacks.

    One ZooKeeper watch per znode, shared by every watch of this backend that needs it (a
    name's race candidates and observers share its lease's; ZooKeeper notifies a session
    once per event anyway): an event costs one read to watch again, whatever the number of
    watches it wakes. kazoo calls watch functions on its own thread, which must not block:
    they only queue work for this one."""

    def __init__(self, backend: ZooKeeperBackend) -> None:
        self.backend = backend
        self.watches: set[_ZkWatch] = set()
        #: (kind, path) -> the watches that watch it, and what it is to each.
        self.paths: dict[tuple[str, str], dict[_ZkWatch, str]] = {}
        self.functions: dict[tuple[str, str], tuple[int, Callable[[Any], None]]] = {}
        #: Whether the lease znode was there when each name's children were last read, and
        #: their version then (``cversion``: it counts creations and deletions, so an event
        #: for a change already seen, or a duplicate, changes nothing).
        self.present: dict[tuple[str, str], tuple[bool, int]] = {}
        self.lock = threading.Lock()
        self.generation = 0
        self.work: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stopped = False
        self.thread = threading.Thread(
            target=self._run, name=f"leader-zk-watch:{backend.root}", daemon=True
        )
        self.thread.start()

    def connected(self) -> bool:
        session = self.backend._current
        return session is not None and bool(session.client.connected)

    def watch(self, name: str, identity: str | None, callback: Callable) -> _ZkWatch:
        watch = _ZkWatch(self, name, identity, callback)
        with self.lock:
            self.watches.add(watch)
        self.work.put(("arm", watch))
        return watch

    def rearm(self, name: str, identity: str) -> None:
        """``identity`` joined ``name``'s queue: its watches watch its predecessor now."""
        with self.lock:
            mine = [w for w in self.watches if (w.name, w.identity) == (name, identity)]
        for watch in mine:
            self.work.put(("arm", watch))

    def forget(self, watch: _ZkWatch) -> None:
        with self.lock:
            self.watches.discard(watch)
            self._unwatch(watch)

    def _unwatch(self, watch: _ZkWatch) -> None:
        for key in watch.keys:
            self.paths.get(key, {}).pop(watch, None)
        watch.keys.clear()

    def stop(self) -> None:
        self.stopped = True
        self.work.put(("stop", None))

    def state_changed(self, state: str) -> None:
        if state == "CONNECTED":
            self.work.put(("resync", None))

    def _run(self) -> None:
        while not self.stopped:
            try:
                kind, item = self.work.get(timeout=1.0)
            except queue.Empty:
                kind, item = "retry", None
            if kind == "stop":
                return
            try:
                if kind == "arm":
                    self._arm(item, coming_live=item.armed_in == -1)
                elif kind == "fired":
                    self._fired(*item)
                elif kind in ("resync", "retry"):
                    self._resync(kind == "resync")
            except BackendUnavailable:
                time.sleep(0.1)  # armed again at the next "retry" or "resync"
            except Exception:  # pragma: no cover - never let the watch thread die
                logger.exception("django_leader: ZooKeeper watch thread")

    def _resync(self, reconnected: bool) -> None:
        if reconnected:
            self.generation += 1
        with self.lock:
            watches = [w for w in self.watches if w.armed_in != self.generation]
        for watch in watches:
            self._arm(watch, wake_if_free=True)
            if reconnected and watch.identity is None:
                self._call(watch)  # a wake-up may have been missed meanwhile

    def _call(self, watch: _ZkWatch) -> None:
        if watch.closed:
            return
        try:
            watch.callback()
        except Exception:  # pragma: no cover - a callback's own error
            logger.exception("django_leader: a wake-up callback failed")

    def _fired(self, key: tuple[str, str], event: Any, generation: int) -> None:
        if generation != self.generation:
            return
        with self.lock:
            watching = dict(self.paths.get(key, {}))
        kind = getattr(event, "type", "NONE")
        if kind == "NONE":  # the connection dropped: armed again once it is back
            for watch in watching:
                watch.armed_in = -1
            return
        if not watching:
            return
        roles = set(watching.values())
        if _PREDECESSOR in roles and kind == "DELETED":
            # The one before them left (it leads now, withdrew, its session ended): each
            # may be the head now, and is woken only if so and the lease is free.
            for watch in watching:
                self._arm(watch, wake_if_free=True)
            return
        before = self.present.get(key, (True, -1))
        present = self._watch(key)  # (wakes the race watchers if the lease went)
        changed = self.present.get(key, (present, -1))[1] != before[1]
        for watch, role in watching.items():
            if (
                role == _LEASE
                and watch.identity
                and changed
                and not present
                and not self._released(watch.name)
                and self._first(watch)
            ):
                # The head, and the lease is free without a release (its holder's session
                # ended): nobody else will wake it. (A releaser wakes the next in line.)
                self._call(watch)
            elif role == _BELL and kind in ("CHANGED", "CREATED"):
                self._call(watch)
            elif role == _PREDECESSOR and not present:  # went before we watched it again
                self._arm(watch, wake_if_free=True)

    def _event(self, key: tuple[str, str]) -> Callable[[Any], None]:
        """The watch function of ``key`` in this connection generation: one function, so
        that kazoo (which keeps a set of them per znode) calls it once per event."""
        generation = self.generation
        known = self.functions.get(key)
        if known is not None and known[0] == generation:
            return known[1]

        def fired(event: Any) -> None:
            self.work.put(("fired", (key, event, generation)))

        self.functions[key] = (generation, fired)
        return fired

    def _watch(self, key: tuple[str, str]) -> bool:
        """Set ZooKeeper's watch on ``key`` (kind, path): ``children`` of a name's znode (its
        lease created, deleted: not each renewal's change of its data), or ``exists`` of a
        znode. Whether the lease is there / the znode exists."""
        from kazoo.exceptions import NoNodeError

        backend = self.backend
        kind, path = key
        if kind == "exists":
            stat = backend._wait(backend.client.exists_async(path, watch=self._event(key)))
            return stat is not None
        for _ in range(2):
            try:
                children, stat = backend._wait(
                    backend.client.get_children_async(
                        path, watch=self._event(key), include_data=True
                    )
                )
            except NoNodeError:  # a name never taken: its record, empty, to watch
                backend._ensure(backend.client, path, anew=True)
                continue
            before = self.present.get(key)
            self.present[key] = ("lease" in children, int(stat.cversion))
            if before is not None and before[0] and before[1] != stat.cversion:
                # The lease znode that was there when we last looked went (whether or not
                # another has taken the name since): every race watcher hears of it, once,
                # whichever read (an event's, a new watch's) notices.
                with self.lock:
                    racing = [w for w, role in self.paths.get(key, {}).items() if role == _LEASE]
                for watch in racing:
                    if watch.identity is None:
                        self._call(watch)
            return "lease" in children
        return False

    def _released(self, name: str) -> bool:
        """Whether the name's last holder released it (then the releaser wakes the next in
        line itself), rather than its lease znode going with its session."""
        found = self.backend._get(self.backend.client, self.backend._name_path(name))
        return found is not None and bool(found[0].get("released", True))

    def _first(self, watch: _ZkWatch) -> bool:
        """Whether the head of the queue (by join order) ``watch`` is also first by
        priority: a queued candidate woken by the store tries at once, so the store wakes
        it only when it is first in every mode's order (fifo: join order; priority: the
        highest, then join order). Otherwise it is woken by the releaser (``wake``) or
        finds its turn when it polls."""
        members = self.backend.candidates(watch.name) or []
        mine = [c.priority for c in members if c.identity == watch.identity]
        return bool(mine) and all(c.priority <= mine[0] for c in members)

    def _arm_one(self, watch: _ZkWatch, key: tuple[str, str], role: str) -> bool:
        with self.lock:
            self.paths.setdefault(key, {})[watch] = role
            watch.keys.add(key)
        return self._watch(key)

    def _arm(
        self, watch: _ZkWatch, *, wake_if_free: bool = False, coming_live: bool = False
    ) -> None:
        """Set every watch ``watch`` needs: its bell, and the lease (a race watcher, the
        head of a queue) or the candidate before its own. With ``wake_if_free``, a head
        that finds the lease free is woken (its predecessor went, or a reconnection may
        have hidden that)."""
        if watch.closed:
            return
        backend = self.backend
        client = backend.client
        generation = self.generation
        with self.lock:
            self._unwatch(watch)
        bell = backend._bell_path(watch.name, watch.identity)
        backend._ensure(client, bell)
        self._arm_one(watch, ("exists", bell), _BELL)
        lease = ("children", backend._name_path(watch.name))
        if watch.identity is None:
            self._arm_one(watch, lease, _LEASE)
        else:
            nodes = backend._queue(client, watch.name)
            prefix = candidate_prefix(watch.identity)
            mine = next((i for i, node in enumerate(nodes) if node.startswith(prefix)), None)
            if mine is not None and mine > 0:
                before = ("exists", f"{backend._queue_path(watch.name)}/{nodes[mine - 1]}")
                if not self._arm_one(watch, before, _PREDECESSOR):
                    self._arm(watch, wake_if_free=True)  # gone before we could watch it
                    return
            elif (
                mine == 0
                and not self._arm_one(watch, lease, _LEASE)
                and wake_if_free
                and self._first(watch)
            ):
                self._call(watch)  # the head, and the lease is free
            # (not queued yet: only its bell, until it joins: ZooKeeperBackend.announce)
        if coming_live and watch.identity is None:
            # A release between its owner's last look and now was missed: as with every
            # store's wake-ups, a race watcher is woken once as it comes live.
            self._call(watch)
        watch.armed_in = generation
