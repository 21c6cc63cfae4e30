"""``manage.py democandidate NAME``: one candidate of the demo (see ``testproject/demo.py``).

It campaigns for lease ``NAME`` with an :class:`~django_leader.Elector`. While it leads, it
writes a :class:`~testproject.demoapp.models.FencedWrite` row every ``--write-interval``
seconds through ``lease.fenced()``, so each row carries the fencing token it was written
under. SIGTERM or SIGINT stops the elector, which releases the lease, and the command exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_leader import BackendUnavailable, Elector, LeadershipLost, Lease
from testproject.demoapp.models import FencedWrite

logger = logging.getLogger("demo")


class Command(BaseCommand):
    help = "Campaign for a lease and, while leader, write fenced rows (the demo's candidate)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="lease name to campaign for")
        parser.add_argument(
            "--identity", default=None, help='holder identity (default "<hostname>:<pid>:<random>")'
        )
        parser.add_argument("--ttl", type=float, default=3.0)
        parser.add_argument("--renew-interval", type=float, default=1.0)
        parser.add_argument("--retry-interval", type=float, default=0.5)
        parser.add_argument(
            "--write-interval",
            type=float,
            default=0.5,
            help="seconds between two fenced writes while leading",
        )

    def say(self, message: str) -> None:
        logger.info(message)

    def handle(self, *args: Any, **options: Any) -> None:
        write_interval: float = options["write_interval"]
        if not logger.handlers:
            # The same format and stream as django_leader's own log lines in testproject.
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        elector = Elector(
            options["name"],
            ttl=options["ttl"],
            renew_interval=options["renew_interval"],
            retry_interval=options["retry_interval"],
            identity=options["identity"],
            on_elected=lambda lease: self.say(
                f"on_elected: I lead now, writing every {write_interval:g}s"
            ),
            on_lost=lambda lease: self.say(
                f"on_lost: leadership with token {lease.token} ended: "
                f"{lease.lost_reason or 'stopped'}"
            ),
        )

        def work(lease: Lease) -> None:
            writes = 0
            try:
                while not lease.lost.is_set():
                    try:
                        with lease.fenced():
                            FencedWrite.objects.create(
                                writer=lease.holder, token=lease.token, note=f"write {writes + 1}"
                            )
                        writes += 1
                        self.say(f"fenced write #{writes} committed under token {lease.token}")
                    except LeadershipLost as exc:
                        self.say(f"fenced write refused: {exc}")
                        return
                    except (BackendUnavailable, DatabaseError) as exc:
                        self.say(f"fenced write failed, will retry: {exc}")
                    lease.lost.wait(write_interval)
            finally:
                connections.close_all()  # this thread's connections only

        # The handler only records the signal; the main loop below calls stop(), outside
        # the handler, so the handler can never wait on a lock the interrupted code holds.
        received: list[int] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            received.append(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        self.say(
            f"{elector.identity} (pid {os.getpid()}) campaigning for {elector.name!r} "
            f"(ttl {elector.timing.ttl:g}s, renew every {elector.timing.renew_interval:g}s, "
            f"retry every {elector.timing.retry_interval:g}s)"
        )
        thread = elector.start(work)
        while thread.is_alive() and not received:
            thread.join(0.2)
        if not received:
            raise CommandError("the elector stopped by itself; see the log above")
        self.say(f"got {signal.Signals(received[0]).name}: stopping (a held lease is released)")
        elector.stop()
        self.say("stopped")
