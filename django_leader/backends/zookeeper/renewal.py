"""Renewal in ZooKeeper: many leases at once, pipelined, each write conditional on its own
record's and lease znode's versions."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ...exceptions import BackendUnavailable, NotSupportedError
from ...lease import Lease
from .clock import ESTIMATE_SLACK
from .layout import Held, failed_operation, standing_handover, to_ms
from .leases import Leases

#: Leases renewed by one ``multi`` of :meth:`ZooKeeperBackend.renew_many` (two operations
#: each, well under the ensemble's request size limit, ``jute.maxbuffer``).
BATCH = 500


class BatchRenewal(Leases):
    """:meth:`renew` and :meth:`renew_many` of :class:`~.backend.ZooKeeperBackend`."""

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
            held: dict[tuple[str, str, int], Held] = {}
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
                if limit and to_ms(ttl) > limit:
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
            one.handover_to = standing_handover(record, stat.mtime)
            renewed.append(one)
        return renewed

    def _drop_expired(
        self, held: dict[tuple[str, str, int], Held], answers: dict[tuple[str, str, int], Any]
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
        held: dict[tuple[str, str, int], Held],
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
                    data = {"holder": holder, "token": token, "ttl": to_ms(ttl)}
                    transaction.set_data(
                        self._lease_path(name),
                        json.dumps(data).encode(),
                        version=held[(name, holder, token)].version,
                    )
                sent.append((group, transaction.commit_async()))
            groups = []
            for group, pending in sent:
                results = self._wait(pending, deadline)
                failed = failed_operation(results)
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
        known: Held,
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
        known.version, known.mtime, known.ttl = int(stat.version), int(stat.mtime), to_ms(ttl)
        self._versions[key] = known
        # The record is as we know it (the write was conditional on its version): its
        # hand-over request, if any, needs no reading.
        data = {"holder": holder, "token": token, "ttl": to_ms(ttl)}
        answers[key] = (data, stat, known.record)
