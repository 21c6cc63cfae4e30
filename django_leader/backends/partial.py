"""A batch renewal answered for some of its leases only (see :class:`RenewedInPart`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..exceptions import BackendUnavailable
from ..lease import Lease


class RenewedInPart(BackendUnavailable):
    """Raised by ``renew_many`` when it could decide the renewal of some leases only: the
    others' rows were locked by a transaction (their holder's own ``fenced()``, most
    often), and waiting for them would hold up the answers of the leases it did renew.

    ``results`` has one answer per lease, in the order given, as ``renew_many`` returns
    them (the renewed lease, or None if refused); the leases at the positions in
    ``pending`` were neither renewed nor refused (their entry is None) and are to be tried
    again. A caller that knows nothing of it sees ``BackendUnavailable``: nothing counted
    as renewed, everything tried again — safe, only slower.
    """

    def __init__(self, message: str, results: Sequence[Lease | None], pending: set[int]) -> None:
        super().__init__(message)
        self.results = list(results)
        self.pending = frozenset(pending)


def answers(
    store: str,
    leases: Sequence[Lease],
    results: list[Lease | None],
    locked: set[tuple[str, str, int]],
) -> list[Lease | None]:
    """``results``, the answers of a batch for ``leases``; :class:`RenewedInPart` if some
    were passed over, their row ``locked`` (keys: name, holder, token)."""
    pending = {
        i for i, lease in enumerate(leases) if (lease.name, lease.holder, lease.token) in locked
    }
    if not pending:
        return results
    raise RenewedInPart(
        f"{store}: {len(pending)} of {len(leases)} lease rows locked by a transaction "
        "(their holder's fenced()?), not renewed yet",
        results,
        pending,
    )
