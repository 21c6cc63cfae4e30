"""Leases in ZooKeeper: acquire (one ``multi`` conditional on the versions just read),
release, force-release, read, and what the backend knows of the lease znodes it wrote.
Renewal, pipelined for many leases at once, is :mod:`.renewal`'s."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from ...exceptions import BackendUnavailable
from ...lease import EventKind, Lease
from .clock import EnsembleClock
from .layout import Held, failed_operation, standing_handover, to_ms, to_time
from .losses import create_marker, lost_marker, mark_session, rolled_back, vanished
from .session import granted_ms

logger = logging.getLogger("django_leader")


class Leases(EnsembleClock):
    """The lease operations of :class:`~.backend.ZooKeeperBackend` but renewal."""

    def initialize(self) -> bool:
        """Write the store marker of a ``ROOT`` never used before, **without** the
        lock-delay a missing marker otherwise costs (nobody can hold a lease in a store that
        never had one). True if this call wrote it, False if it was there. Only for a new
        ``ROOT``: after a wipe or a restore, let the first acquisition notice the loss."""
        return create_marker(self, self.client, 0)[1]

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
            acquired_at=to_time(stat.ctime),
            renewed_at=to_time(stat.mtime),
            expires_at=to_time(expires),
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
        store = marker[0] if marker is not None else lost_marker(self, client, ttl)

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
                lease.read_at = to_time(now)
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
        if current is None and vanished(self, client, name, record_found, ttl):
            return None, None  # deleted by hand: the lock-delay runs
        to, until = record.get("handover_to"), int(record.get("handover_until") or 0)
        if to and to != holder and until and not self._passed(until)[0]:
            return None, None
        # A write of the clock before each grant: its zxid tells a rolled-back store.
        clock = self._clock_stat()
        if marker is not None and rolled_back(self, client, session, marker, clock, ttl):
            return None, None
        owner = mark_session(self, client) if ephemeral else None
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
        lease_data = {"holder": holder, "token": token, "ttl": to_ms(ttl)}
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
        failed = failed_operation(results)
        if failed is not None:
            if isinstance(failed[1], BadVersionError | NodeExistsError | NoNodeError):
                return None, self.read(name)  # another candidate (or request) came first
            raise BackendUnavailable(f"zookeeper: acquisition of {name!r}: {failed[1]!r}")
        stat = results[-2]
        self._seen(stat.mtime)
        self._versions[(name, holder, token)] = Held(
            version=0,
            mtime=int(stat.mtime),
            ttl=to_ms(ttl),
            granted=granted_ms(session) if ephemeral else 0,
            record_version=int(stat.version),
            record=new_record,
        )
        lease = Lease(
            name=name,
            holder=holder,
            token=token,
            transitions=new_record["transitions"],
            acquired_at=to_time(stat.mtime),
            renewed_at=to_time(stat.mtime),
            expires_at=to_time(stat.mtime + to_ms(ttl)),
            previous_holder=previous,
        )
        self._record_grant(lease, bool(previous) and not released)
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
        record_result, lease_result = self._record_and_lease_async(client, name)
        return self._read_result(record_result), self._read_result(lease_result)

    def _record_and_lease_async(self, client: Any, name: str) -> tuple[Any, Any]:
        """:meth:`_record_and_lease` sent, not waited for."""
        return client.get_async(self._name_path(name)), client.get_async(self._lease_path(name))

    def _held(
        self, client: Any, lease: Lease, *, fresh: bool = False
    ) -> tuple[Held, dict[str, Any]] | None:
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
    ) -> tuple[Held, dict[str, Any]] | None:
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
            owner = granted_ms(session) if session and ours == stat.ephemeralOwner else -1
        held = Held(
            version=int(stat.version),
            mtime=int(stat.mtime),
            ttl=int(data["ttl"]),
            granted=owner,
            record_version=int(record_found[1].version),
            record=record_found[0],
        )
        self._versions[key] = held
        return held, record_found[0]

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
            failed = failed_operation(results)
            if failed is None:
                self._versions.pop(key, None)
                self._seen(results[1].mtime)
                self._record(EventKind.RELEASED, lease, to_time(results[1].mtime))
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
            failed = failed_operation(results)
            if failed is not None:
                if isinstance(failed[1], BadVersionError | NoNodeError):
                    continue
                raise BackendUnavailable(f"zookeeper: force release of {name!r}: {failed[1]!r}")
            self._seen(results[0].mtime)
            self._versions.pop((name, lease.holder, lease.token), None)
            self._record(
                EventKind.FORCED_RELEASE,
                lease,
                to_time(results[0].mtime),
                detail=detail,
                actor=actor,
            )
            return lease
        raise BackendUnavailable(f"zookeeper: force release of {name!r} kept conflicting")

    def read(self, name: str) -> Lease | None:
        """Read-only (two reads, no write: a health probe changes nothing); expiry by
        ``_read_only_now()``."""
        return self._read_lease(name, *self._record_and_lease(self.client, name))

    def read_many(self, names: Sequence[str]) -> list[Lease | None]:
        """Every name's two reads sent before any answer is awaited."""
        client = self.client
        sent = [self._record_and_lease_async(client, name) for name in names]
        return [
            self._read_lease(name, self._read_result(record), self._read_result(lease))
            for name, (record, lease) in zip(names, sent, strict=True)
        ]

    def _read_lease(
        self,
        name: str,
        record_found: tuple[dict[str, Any], Any] | None,
        found: tuple[dict[str, Any], Any] | None,
    ) -> Lease | None:
        """The unexpired lease a read of the name's record and lease znode found, or None."""
        if found is None or not found[0].get("holder"):
            return None
        data, stat = found
        now = self._read_only_now(int(stat.mtime))
        if now >= self._expiry(data, stat):
            return None
        lease = self._lease(name, data, stat, record_found and record_found[0])
        lease.read_at = to_time(now)
        lease.handover_to = standing_handover(record_found[0] if record_found else {}, now)
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
