"""``manage.py leader``: inspect and operate leases from the shell.

    leader status [NAME] [--json]        who holds what (exit 3: nobody holds NAME; a NAME
                                         never seen is reported as unknown)
    leader history NAME [--limit N] [--json]
    leader release NAME                  force-release (recorded in the history)
    leader prune [--days N]              delete history older than N days

Exit codes: 0 ok, 1 error, 2 usage, 3 nobody holds NAME (``status NAME``, ``release NAME``).
"""

from __future__ import annotations

import difflib
import getpass
import json
import sys
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Max
from django.db.models.functions import Now

from django_leader.backends import get_backend
from django_leader.conf import get_settings, validate_name
from django_leader.exceptions import BackendUnavailable
from django_leader.lease import Lease

NOBODY = 3


def lease_dict(name: str, lease: Lease | None, candidates: list[str] | None) -> dict[str, Any]:
    """One lease as ``leader status --json`` gives it. ``candidates``: the Electors waiting
    to take over (campaigning, not holding), or None if the store does not track them."""
    if candidates is not None and lease is not None:
        candidates = [identity for identity in candidates if identity != lease.holder]
    if lease is None:
        return {
            "name": name,
            "state": "free",
            "holder": None,
            "token": None,
            "acquired_at": None,
            "renewed_at": None,
            "expires_at": None,
            "expires_in": None,
            "transitions": None,
            "candidates": candidates,
        }
    return {
        "name": name,
        "state": "held",
        "holder": lease.holder,
        "token": lease.token,
        "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at else None,
        "renewed_at": lease.renewed_at.isoformat() if lease.renewed_at else None,
        "expires_at": lease.expires_at.isoformat() if lease.expires_at else None,
        "expires_in": round(lease.expires_in, 3) if lease.expires_in is not None else None,
        "transitions": lease.transitions,
        "candidates": candidates,
    }


def candidates_of(backend: Any, name: str) -> list[str] | None:
    """The candidates of ``name``, or None when unknown (best effort, as they are kept)."""
    try:
        found = backend.candidates(name)
    except BackendUnavailable:
        return None
    return None if found is None else [candidate.identity for candidate in found]


class Command(BaseCommand):
    help = "Inspect and operate django-leader leases: status, history, release, prune."

    #: The exit status of the last run (3: nobody holds NAME). Only the command line
    #: exits with it; ``call_command()`` returns normally and leaves it here.
    exit_code = 0

    def run_from_argv(self, argv: list[str]) -> None:
        super().run_from_argv(argv)
        if self.exit_code:
            sys.exit(self.exit_code)

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=CommandParser)
        status = sub.add_parser("status", help="who holds NAME (or every lease)")
        status.add_argument("name", nargs="?")
        status.add_argument("--json", action="store_true")
        history = sub.add_parser("history", help="the history of NAME, newest first")
        history.add_argument("name")
        history.add_argument("--limit", type=int, default=20)
        history.add_argument("--json", action="store_true")
        release = sub.add_parser("release", help="force-release NAME (recorded in history)")
        release.add_argument("name")
        release.add_argument("--reason", default="", help="recorded as the event's detail")
        prune = sub.add_parser("prune", help="delete history older than --days")
        prune.add_argument("--days", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        name = options.get("name")
        if name is not None:
            try:
                validate_name(name)
            except (TypeError, ValueError) as exc:
                raise CommandError(str(exc), returncode=2) from None
        try:
            self.exit_code = getattr(self, f"do_{action}")(options)
        except BackendUnavailable as exc:
            raise CommandError(str(exc)) from None

    def do_status(self, options: dict[str, Any]) -> int:
        backend = get_backend()
        names = [options["name"]] if options["name"] else backend.names()
        rows = [
            lease_dict(name, backend.read(name), candidates_of(backend, name)) for name in names
        ]
        if options["name"]:
            rows[0]["known"] = rows[0]["state"] == "held" or self._known(backend, names[0])
        if options["json"]:
            self.stdout.write(json.dumps(rows[0] if options["name"] else rows, indent=2))
        elif not rows:
            self.stdout.write("no leases yet")
        for row in rows if not options["json"] else []:
            if not row.get("known", True):
                self.stdout.write(f"{row['name']}: unknown — {self._unknown(backend, row)}")
            elif row["state"] == "free":
                self.stdout.write(f"{row['name']}: free")
            else:
                self.stdout.write(
                    f"{row['name']}: held by {row['holder']} (token {row['token']}), "
                    f"expires in {row['expires_in']:.1f}s, since {row['acquired_at']}, "
                    f"{row['transitions']} transitions"
                )
            if row["candidates"]:
                self.stdout.write(f"  candidates waiting: {', '.join(row['candidates'])}")
        return NOBODY if options["name"] and rows[0]["state"] == "free" else 0

    def _known(self, backend: Any, name: str) -> bool:
        """Whether ``name`` was ever seen: a lease the store lists, any history, or an
        Elector campaigning for it. A name never seen is most likely a typo."""
        from django_leader.models import LeaseEvent

        if name in backend.names() or candidates_of(backend, name):
            return True
        database = backend.history_database or get_settings().database
        return LeaseEvent.objects.using(database).filter(name=name).exists()

    def _unknown(self, backend: Any, row: dict[str, Any]) -> str:
        text = "no lease of that name was ever taken (no history, no candidates)"
        close = difflib.get_close_matches(row["name"], backend.names(), n=3)
        if close:
            text += f"; did you mean {', '.join(close)}?"
        return text

    def do_history(self, options: dict[str, Any]) -> int:
        from django_leader.models import LeaseEvent

        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1", returncode=2)
        database = get_backend().history_database or get_settings().database
        events = LeaseEvent.objects.using(database).filter(name=options["name"])
        events = events.order_by("-at", "-id")[: options["limit"]]
        rows = [
            {
                "at": e.at.isoformat(),
                "kind": e.kind,
                "holder": e.holder,
                "token": e.token,
                "previous_holder": e.previous_holder,
                "actor": e.actor,
                "detail": e.detail,
            }
            for e in events
        ]
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return 0
        if not rows:
            self.stdout.write(f"no history for {options['name']!r}")
        for row in rows:
            extra = " ".join(
                part
                for part in (
                    f"previous={row['previous_holder']}" if row["previous_holder"] else "",
                    f"by={row['actor']}" if row["actor"] else "",
                    row["detail"],
                )
                if part
            )
            line = f"{row['at']}  {row['kind']:<14} {row['holder']}  token={row['token']}"
            self.stdout.write(f"{line}  {extra}".rstrip())
        return 0

    def do_release(self, options: dict[str, Any]) -> int:
        actor = f"manage.py leader release ({getpass.getuser()})"
        released = get_backend().force_release(
            options["name"], actor=actor, detail=options["reason"]
        )
        if released is None:
            self.stdout.write(f"{options['name']}: nobody holds it")
            return NOBODY
        self.stdout.write(
            f"{options['name']}: released {released.holder} (token {released.token}); "
            "it steps down at its next renewal"
        )
        return 0

    def do_prune(self, options: dict[str, Any]) -> int:
        from django_leader.models import LeaseCandidate, LeaseEvent

        conf = get_settings()
        days = conf.history_retention if options["days"] is None else options["days"]
        if days < 0:
            raise CommandError("--days must be 0 or more", returncode=2)
        database = get_backend().history_database or conf.database
        events = LeaseEvent.objects.using(database)
        # Keep the event with the greatest token of every name: the database backend
        # continues fencing tokens from it should a lease row ever be lost.
        keep = [
            events.filter(name=name, token=top).latest("id").id
            for name, top in events.values("name")
            .annotate(top=Max("token"))
            .values_list("name", "top")
        ]
        old = events.filter(at__lt=Now() - timedelta(days=days)).exclude(id__in=keep)
        deleted, _ = old.delete()
        self.stdout.write(f"deleted {deleted} history events older than {days} days")
        # Candidacies of names nobody campaigns for any more (each announcement removes
        # the expired ones of its own name only). A day late: MySQL's NOW() is local time.
        stale = LeaseCandidate.objects.using(database).filter(
            expires_at__lt=Now() - timedelta(days=1)
        )
        gone, _ = stale.delete()
        if gone:
            self.stdout.write(f"deleted {gone} expired candidacies")
        return 0
