"""The lease contract as a test suite a backend runs: ``django_leader.testing.contract``.

Every store django-leader ships runs it (``tests/contract/test_conformance.py``), and so can a
backend of your own::

    # test_my_backend.py
    import pytest
    from django_leader.testing.contract import BackendContract

    # if your store, or its history, uses the database:
    pytestmark = pytest.mark.django_db(transaction=True)

    class TestMyBackend(BackendContract):
        def make_backend(self):
            return MyBackend()

Run it with pytest and pytest-django (``pip install "django-leader[dev]"`` has both) in a
project whose settings include ``django_leader``. Each test gets a fresh backend from
:meth:`BackendContract.make_backend` and a lease name of its own. Two hooks are optional:

* :meth:`BackendContract.forget` — make the store lose everything it knows of a name,
  as a restart without persistence or a row deleted by hand would. Without it the
  "store that forgets" test is not collected.
* :meth:`BackendContract.history_of` — the history events of a name; by default read
  from ``LeaseEvent`` in the backend's ``history_database``, and not checked when that
  is None.

The tests wait for real expiries of :attr:`BackendContract.ttl` (1 s): the whole suite
takes about half a minute per store. See docs/howto/write-a-backend.md.

The suite has two parts: ``LeaseContract`` (``django_leader.testing.lease_contract``),
what every store must do, and one class per optional capability
(``django_leader.testing.capabilities``: batch renewal, the candidate registry,
hand-over, wake-ups), each of which a store without it passes by declining as the contract
says. ``BackendContract`` is all of them; a store may also run only some.
``RetentionContract`` (``prune``) stands apart: it forgets every unused name of the
store, so run it on a store of its own.
"""

from __future__ import annotations

from typing import Any

from .capabilities import (
    BatchRenewalContract,
    HandoverContract,
    RegistryContract,
    RetentionContract,
    WakeUpContract,
)
from .lease_contract import LeaseContract, wait_until_expired

__all__ = [
    "BackendContract",
    "BatchRenewalContract",
    "HandoverContract",
    "LeaseContract",
    "RegistryContract",
    "RetentionContract",
    "WakeUpContract",
    "wait_until_expired",
]


class BackendContract(BatchRenewalContract, RegistryContract, HandoverContract, WakeUpContract):
    """The tests every lease store must pass (``LeaseContract``) and those of each
    optional capability, which a store that lacks it passes by declining as the contract
    says. Subclass it as ``Test…`` and implement ``make_backend()``; pytest collects the
    ``test_*`` methods of the subclass."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.forget is LeaseContract.forget:
            # A store that cannot be made to forget has nothing for this test to check.
            cls.test_store_that_forgets_a_lease_waits_out_its_term_and_never_repeats_a_token = (  # type: ignore[method-assign]
                None
            )
