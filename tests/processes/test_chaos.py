"""The short seeded chaos run of CI: 30 s of faults per store, and not one violation.

Each store is a private instance the harness starts itself (see tests/chaos/stores.py), so
the shared servers are never restarted or flushed. The long run is ``make chaos``
(docs/chaos.md).
"""

from __future__ import annotations

import shutil

import pytest

from tests.chaos import harness, report
from tests.chaos.stores import STORES
from tests.support.stores import REQUIRE_SERVICES

pytestmark = pytest.mark.multiprocess

DURATION = 30.0
SEED = 10


@pytest.mark.parametrize("store", ["sqlite", "postgresql", "mariadb", "redis"])
def test_no_violation_under_faults(store: str) -> None:
    reason = STORES[store].unavailable()
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(f"required service missing: {reason}")
        pytest.skip(f"service unavailable: {reason}")
    # A work directory of its own, kept if the run fails (the logs are the evidence).
    config = harness.Config(store=store, duration=DURATION, seed=SEED, keep=True)
    outcome = harness.run(config)
    summary = report.summarize(outcome)
    assert summary["faults"] >= 5, summary
    details = "\n".join(
        f"  {e['t']:.2f} s {e['check']} after {e['fault']}: {e['message']}"
        for e in summary["examples"]
    )
    assert outcome.result.ok, (
        f"{summary['violations']} violations in {summary['faults']} faults "
        f"{summary['violations_by_check']}; logs in {outcome.workdir}:\n{details}"
    )
    shutil.rmtree(outcome.workdir, ignore_errors=True)
