"""``manage.py leader``: inspect and operate leases from the shell.

    leader status [NAME] [--json]        who holds what (exit 3: nobody holds NAME; a NAME
                                         never seen is reported as unknown)
    leader history NAME [--limit N] [--json]
    leader release NAME                  force-release (recorded in the history)
    leader handover NAME [--to IDENTITY] [--wait SECONDS] [--json]
                                         the holder steps down at its next renewal and
                                         only IDENTITY (default: the next in line) may
                                         take the lease (recorded in the history)
    leader prune [--days N]              forget names unused and history older than N days

Exit codes: 0 ok, 1 error, 2 usage, 3 nobody holds NAME (``status NAME``, ``release NAME``,
``handover NAME``), 4 ``handover --wait``: the candidate did not take the lease in time.
"""

from __future__ import annotations

import difflib
import getpass
import json
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from django_leader.backends import get_backend
from django_leader.conf import get_settings, shown, validate_name
from django_leader.election import Candidate, Mode
from django_leader.exceptions import BackendUnavailable, NotSupportedError
from django_leader.handover import (
    HandoverRefused,
    NobodyHolds,
    Waiting,
    ask_for_handover,
    election_mode,
    waiting,
)
from django_leader.lease import Lease

NOBODY = 3
#: ``handover --wait``: the candidate did not hold the lease within the wait.
NOT_HANDED_OVER = 4
#: How often ``handover --wait`` reads who holds the lease.
WAIT_POLL = 0.1


def lease_dict(name: str, lease: Lease | None, queue: list[Waiting] | None) -> dict[str, Any]:
    """One lease as ``leader status --json`` gives it. ``queue``: the Electors waiting to
    take over (campaigning, not holding) in the order they get their turn, or None if the
    store does not track them."""
    candidates = None if queue is None else [w.candidate.identity for w in queue]
    rows = None if queue is None else [w.as_dict() for w in queue]
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
            "queue": rows,
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
        "queue": rows,
    }


def candidates_of(backend: Any, names: list[str]) -> list[list[Candidate] | None]:
    """The candidates of each of ``names``, None where unknown (best effort, as they are
    kept)."""
    try:
        found: list[list[Candidate] | None] = backend.candidates_many(names)
    except BackendUnavailable:
        return [None] * len(names)
    return found


def waiting_line(entry: Waiting) -> str:
    """One candidate of ``leader status``: place, identity, priority, host, pid, last seen."""
    c = entry.candidate
    parts = [f"priority {c.priority}"]
    if c.host or c.pid:
        parts.append(f"{c.host or '?'} pid {c.pid or '?'}")
    if entry.seen_ago is not None:
        parts.append(f"seen {entry.seen_ago:.1f}s ago")
    return f"    {entry.place}. {c.identity}  ({', '.join(parts)})"


#: History events ``leader prune`` deletes per statement.
PRUNE_BATCH = 500


class Command(BaseCommand):
    help = (
        "Inspect and operate django-leader leases: status, history, release, handover, prune, init."
    )

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
        handover = sub.add_parser(
            "handover",
            help="the holder of NAME steps down at its next renewal and hands the lease to "
            "a candidate (recorded in history)",
        )
        handover.add_argument("name")
        handover.add_argument(
            "--to",
            metavar="IDENTITY",
            default=None,
            help="the live candidate to hand over to (default: the next in line)",
        )
        handover.add_argument("--reason", default="", help="recorded in the event's detail")
        handover.add_argument(
            "--wait",
            type=float,
            metavar="SECONDS",
            default=None,
            help="wait until the candidate holds the lease (exit 4 if it does not in time)",
        )
        handover.add_argument("--json", action="store_true")
        prune = sub.add_parser(
            "prune", help="forget the names unused for --days, and older history"
        )
        prune.add_argument("--days", type=int, default=None)
        sub.add_parser(
            "init",
            help="mark a store never used for leases as new, so that its first lock does "
            "not wait out the lock-delay (never after a flush, restart or restore)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        name = options.get("name")
        if name is not None:
            try:
                validate_name(name)
            except (TypeError, ValueError) as exc:
                raise CommandError(str(exc), returncode=2) from None
        self._now: datetime | None = None
        if not options.get("json"):
            self.stdout = _Shown(self.stdout)  # type: ignore[has-type]
        try:
            self.exit_code = getattr(self, f"do_{action}")(options)
        except BackendUnavailable as exc:
            raise CommandError(str(exc)) from None

    def _store_now(self, backend: Any) -> datetime:
        """The store's clock, read once per run."""
        if self._now is None:
            self._now = backend.now()
        return self._now

    def _queue(
        self, backend: Any, found: list[Candidate] | None, lease: Lease | None, mode: Mode
    ) -> list[Waiting] | None:
        """The candidates ``found`` waiting, in queue order, each last seen how long ago
        by the store's clock (the lease's reading, else the store's now)."""
        if found is None:
            return None
        now = None
        if found:
            now = lease.read_at if lease is not None and lease.read_at else None
            now = now or self._store_now(backend)
        return waiting(found, mode, holder=lease.holder if lease else None, now=now)

    def do_status(self, options: dict[str, Any]) -> int:
        backend = get_backend()
        mode = election_mode()
        names = [options["name"]] if options["name"] else backend.names()
        rows, queues = [], []
        # Every name in a few round trips (a batch each), not a few per name: with
        # thousands of names, one by one took longer than a lease lasts.
        found = candidates_of(backend, names)
        for name, lease, members in zip(names, backend.read_many(names), found, strict=True):
            queue = self._queue(backend, members, lease, mode)
            rows.append(lease_dict(name, lease, queue))
            queues.append(queue or [])
        if options["name"]:
            rows[0]["known"] = rows[0]["state"] == "held" or self._known(backend, names[0])
        if options["json"]:
            self.stdout.write(json.dumps(rows[0] if options["name"] else rows, indent=2))
            return NOBODY if options["name"] and rows[0]["state"] == "free" else 0
        if not rows:
            self.stdout.write("no leases yet")
        for row, queue in zip(rows, queues, strict=True):
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
            if queue:
                self.stdout.write(f"  candidates waiting: {', '.join(row['candidates'])}")
                for entry in queue:
                    self.stdout.write(waiting_line(entry))
        return NOBODY if options["name"] and rows[0]["state"] == "free" else 0

    def _known(self, backend: Any, name: str) -> bool:
        """Whether ``name`` was ever seen: a lease the store lists, any history, or an
        Elector campaigning for it. A name never seen is most likely a typo."""
        from django_leader.models import LeaseEvent

        if name in backend.names() or candidates_of(backend, [name])[0]:
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
        from django_leader.models import LeaseEvent, from_orm

        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1", returncode=2)
        database = get_backend().history_database or get_settings().database
        events = LeaseEvent.objects.using(database).filter(name=options["name"])
        events = events.order_by("-at", "-id")[: options["limit"]]
        rows = [
            {
                "at": from_orm(e.at, database).isoformat(),  # aware, whatever USE_TZ
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

    def do_handover(self, options: dict[str, Any]) -> int:
        name, wait = options["name"], options["wait"]
        if wait is not None and not 0 < wait < float("inf"):
            raise CommandError("--wait must be a number of seconds > 0", returncode=2)
        backend = get_backend()
        actor = f"manage.py leader handover ({getpass.getuser()})"
        try:
            asked = ask_for_handover(
                backend, name, options["to"], actor=actor, reason=options["reason"]
            )
        except NobodyHolds:
            known = self._known(backend, name)
            text = (
                "nobody holds it"
                if known
                else f"unknown — {self._unknown(backend, {'name': name})}"
            )
            if options["json"]:
                self.stdout.write(
                    json.dumps({"name": name, "holder": None, "known": known}, indent=2)
                )
            else:
                self.stdout.write(f"{name}: {text}")
            return NOBODY
        except (HandoverRefused, NotSupportedError) as exc:
            raise CommandError(f"cannot hand {name!r} over: {exc}") from None
        lease = asked.holder
        result: dict[str, Any] = {
            "name": name,
            "holder": lease.holder,
            "token": lease.token,
            "to": asked.to,
            "window": round(asked.window, 3),
            "actor": actor,
            "held": asked.held,
            # With --wait: whether ``to`` holds it now, who does, after how many seconds.
            "handed_over": None,
            "now": None,
            "waited": None,
        }
        if asked.queue is None:
            self.stderr.write(
                f"the store keeps no candidate registry: {asked.to} was not checked to be "
                "a live candidate"
            )
        if asked.outranked_by is not None:
            first = asked.outranked_by
            self.stderr.write(
                f"ELECTION_MODE is 'priority': {first.identity} (priority {first.priority}) "
                f"outranks {asked.to}, which hands the lease on to it at its next renewal"
            )
        if not options["json"]:
            if asked.held:
                self.stdout.write(
                    f"{name}: {lease.holder} (token {lease.token}) hands over to {asked.to} at "
                    f"its next renewal; only {asked.to} may take it for {asked.window:.1f}s"
                )
            else:
                self.stdout.write(
                    f"{name}: {lease.holder} let it go meanwhile; only {asked.to} may take "
                    f"it for {asked.window:.1f}s"
                )
        if wait is None:
            if options["json"]:
                self.stdout.write(json.dumps(result, indent=2))
            return 0
        started = time.monotonic()
        give_up = started + wait
        while True:
            current = backend.read(name)
            left = give_up - time.monotonic()
            if (current is not None and current.holder == asked.to) or left <= 0:
                break
            time.sleep(min(WAIT_POLL, left))
        waited = time.monotonic() - started
        done = current is not None and current.holder == asked.to
        result["handed_over"] = done
        result["now"] = (
            None if current is None else {"holder": current.holder, "token": current.token}
        )
        result["waited"] = round(waited, 3)
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=2))
        elif done:
            assert current is not None
            self.stdout.write(
                f"{name}: held by {current.holder} (token {current.token}) after {waited:.1f}s"
            )
        else:
            now = "nobody holds it" if current is None else f"held by {current.holder}"
            self.stderr.write(f"{name}: {asked.to} did not take it within {wait:g}s; {now}")
        return 0 if done else NOT_HANDED_OVER

    def do_init(self, options: dict[str, Any]) -> int:
        backend = get_backend()
        written = backend.initialize()
        if written is None:
            self.stdout.write(f"{backend.describe()}\nIt keeps no store marker: nothing to do.")
        elif written:
            self.stdout.write("wrote the store marker: the first lock will not wait")
        else:
            self.stdout.write("the store marker was there already: nothing to do")
        return 0

    def do_prune(self, options: dict[str, Any]) -> int:
        from django_leader.models import LeaseCandidate, LeaseEvent, to_orm

        conf = get_settings()
        days = conf.history_retention if options["days"] is None else options["days"]
        if days < 0:
            raise CommandError("--days must be 0 or more", returncode=2)
        backend = get_backend()
        # The names nobody used for as long: their state in the store (and, on a
        # database, their rows and history), without lowering any name's tokens.
        forgotten = backend.prune(timedelta(days=days), batch=PRUNE_BATCH)
        self.stdout.write(f"forgot {forgotten} names unused for {days} days")
        database = backend.history_database or conf.database
        events = LeaseEvent.objects.using(database)
        # The cutoffs are instants (this host's clock: the retention is in days) given to
        # the ORM as such. Django's Now() is the session's local time on MySQL, compared
        # there with columns of naive UTC: off by the session's offset.
        now = timezone.now()
        old = events.filter(at__lt=to_orm(now - timedelta(days=days), database))
        if backend.rows_database is not None:
            # Keep the event with the greatest token of every name (the latest of those):
            # the database backend continues fencing tokens from it should a lease row ever
            # be lost. An old event goes when its name has a greater (token, id). (Other
            # stores continue tokens from their own clock.)
            above = events.filter(name=OuterRef("name")).filter(
                Q(token__gt=OuterRef("token")) | Q(token=OuterRef("token"), id__gt=OuterRef("id"))
            )
            old = old.filter(Exists(above))
        # In batches: two statements each, however many names, and never more parameters
        # than a batch (SQLite and the drivers have limits).
        deleted = 0
        while ids := list(old.values_list("id", flat=True)[:PRUNE_BATCH]):
            deleted += events.filter(id__in=ids).delete()[0]
        self.stdout.write(f"deleted {deleted} history events older than {days} days")
        # Candidacies of names nobody campaigns for any more (each announcement removes
        # the expired ones of its own name only), a day after they expired.
        stale = LeaseCandidate.objects.using(database).filter(
            expires_at__lt=to_orm(now - timedelta(days=1), database)
        )
        gone, _ = stale.delete()
        if gone:
            self.stdout.write(f"deleted {gone} expired candidacies")
        return 0


class _Shown(OutputWrapper):
    """Text output with every control character escaped: holders, actors and details come
    from the store, written by whoever can write there (JSON output is escaped already)."""

    def write(self, msg: str = "", style_func: Any = None, ending: str | None = None) -> None:
        super().write(shown(msg), style_func, ending)
