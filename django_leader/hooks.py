"""Observation points for metrics.

Leadership changes travel as Django signals (:mod:`django_leader.signals`); the numbers
behind them (how long a renewal took, how long a name had no leader) come here. An
observer is called as ``observer(event, lease_name, value)`` in the thread that measured it
and must be quick; an exception in it is logged and ignored.

Events: ``renew`` (seconds a successful renewal took: the round trip of the
``renew_many`` batch it was renewed in, the same for every lease of the batch),
``renew_failed`` (1; the store answered with an error or not at all), ``renew_refused``
(1), ``leaderless`` (seconds the name had no leader before an Elector of this process
took it over after an expiry, by the store's clock: from the previous lease's expiry as
last seen to the takeover), ``store_callers`` (how many threads, each with its store
connection, run the store calls of the process's session now; ``lease_name`` is then the
store, ``repr(backend)``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("django_leader")

Observer = Callable[[str, str, float], None]
_observers: list[Observer] = []


def add_observer(observer: Observer) -> None:
    if observer not in _observers:
        _observers.append(observer)


def remove_observer(observer: Observer) -> None:
    if observer in _observers:
        _observers.remove(observer)


def notify(event: str, name: str, value: float = 1.0) -> None:
    for observer in list(_observers):
        try:
            observer(event, name, value)
        except Exception:
            logger.exception("observer %r failed on %s", observer, event)
