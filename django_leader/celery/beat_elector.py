"""The elector of one :class:`~django_leader.celery.LeaderScheduler`: it logs the beat's
leadership changes and is the ``sender`` of their signals."""

from __future__ import annotations

import logging
from typing import Any

from celery.beat import Scheduler

from ..elector import Elector
from ..lease import Lease, LossReason

logger = logging.getLogger("django_leader.celery")


class BeatElector(Elector):
    """The elector of one :class:`LeaderScheduler`.

    It is the ``sender`` of the ``leader_elected``, ``leader_lost`` and ``lease_released``
    signals for the beat's leadership changes (``sender.scheduler`` is the scheduler).
    """

    def __init__(self, scheduler: Scheduler, name: str, **kwargs: Any) -> None:
        self.scheduler = scheduler
        super().__init__(name, **kwargs)

    def on_elected(self, lease: Lease) -> None:
        logger.info(
            "celery beat %s elected for %r (token %s): this beat sends the schedule",
            self.identity,
            self.name,
            lease.token,
        )

    def on_lost(self, lease: Lease) -> None:
        stopped = lease.lost_cause is LossReason.STOPPED
        logger.log(
            logging.INFO if stopped else logging.WARNING,
            "celery beat %s no longer leads %r (token %s, %s): it sends nothing%s",
            self.identity,
            self.name,
            lease.token,
            lease.lost_reason or "lost",
            "" if stopped else " and campaigns again",
        )

    def on_new_leader(self, lease: Lease) -> None:
        if lease.holder != self.identity:
            logger.info(
                "celery beat %s stands by: %r is led by %s (token %s)",
                self.identity,
                self.name,
                lease.holder,
                lease.token,
            )
