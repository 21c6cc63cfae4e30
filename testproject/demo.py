"""A five-step tour of django-leader: election, a crash, the takeover, a clean shutdown.

Run it with ``make demo`` (or ``python -m testproject.demo`` from the repository root). It
needs nothing but Python and Django: the leases live in a SQLite file under ``.demo/``.

1. migrate a fresh SQLite database;
2. start three candidate processes (``manage.py democandidate demo-leader``); one is
   elected and writes rows through ``lease.fenced()``;
3. SIGKILL the leader, so it cannot release its lease;
4. watch another candidate take over once the lease expires, with the next fencing token;
5. SIGTERM the rest (the leader releases its lease) and print the lease history.

Exits non-zero if the takeover does not happen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO / ".demo"
DATABASE = DEMO_DIR / "demo.sqlite3"
NAME = "demo-leader"
CANDIDATES = ("candidate-1", "candidate-2", "candidate-3")
TTL, RENEW_INTERVAL, RETRY_INTERVAL = 3.0, 1.0, 0.5

T = TypeVar("T")


class DemoFailed(Exception):
    pass


def demo_environment() -> dict[str, str]:
    """The environment of this process and of every process it starts."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # SQLite, whatever the caller's shell says
    env.update(
        DJANGO_SETTINGS_MODULE="testproject.settings",
        DJANGO_LEADER_SQLITE=str(DATABASE),
        DJANGO_LEADER_EXTRA_DATABASES="0",  # don't look for PostgreSQL or MariaDB
        DJANGO_LEADER_TTL=str(TTL),
        DJANGO_LEADER_RENEW=str(RENEW_INTERVAL),
        DJANGO_LEADER_RETRY=str(RETRY_INTERVAL),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    return env


def step(number: int, title: str) -> None:
    print(f"\n[{number}/5] {title}", flush=True)


def say(message: str) -> None:
    print(f"      {message}", flush=True)


def wait_for(probe: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T | None:
    """Call ``probe`` until it returns something other than None, or ``timeout`` passes."""
    give_up = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None or time.monotonic() >= give_up:
            return result
        time.sleep(interval)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join("      " + line.rstrip() for line in lines)


class Candidate:
    """One ``manage.py democandidate`` process, its output in ``.demo/<identity>.log``."""

    def __init__(self, identity: str, env: dict[str, str]) -> None:
        self.identity = identity
        self.log_path = DEMO_DIR / f"{identity}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "democandidate",
                NAME,
                "--identity",
                identity,
                "--ttl",
                str(TTL),
                "--renew-interval",
                str(RENEW_INTERVAL),
                "--retry-interval",
                str(RETRY_INTERVAL),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is for the demo, not for them
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def __str__(self) -> str:
        return f"{self.identity} (pid {self.pid})"

    def send(self, signum: signal.Signals) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


def fresh_database(env: dict[str, str]) -> None:
    DEMO_DIR.mkdir(exist_ok=True)
    for path in DEMO_DIR.glob("*"):
        if path.is_file():
            path.unlink()
    log = DEMO_DIR / "migrate.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        print(log.read_text(errors="replace"), file=sys.stderr)
        raise DemoFailed(f"manage.py migrate failed (exit {done.returncode}), see {log}")


def main() -> int:
    env = demo_environment()
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.db.models import Count, Max, Min

    from django_leader import Lease
    from django_leader.backends import get_backend
    from django_leader.models import LeaseEvent
    from testproject.demoapp.models import FencedWrite

    backend = get_backend()
    started = time.monotonic()

    print(f"django-leader demo: three processes campaign for the lease {NAME!r}.")
    print(
        f"The lease lives {TTL:g}s unless renewed; the leader renews it every "
        f"{RENEW_INTERVAL:g}s, followers retry every {RETRY_INTERVAL:g}s."
    )
    print(f"Store: SQLite file {DATABASE.relative_to(REPO)}.")

    step(1, "Fresh database")
    fresh_database(env)
    say(f"migrated {DATABASE.relative_to(REPO)}")

    def leader() -> Lease | None:
        return backend.read(NAME)

    def writes_by_token() -> list[tuple[str, int, int]]:
        rows = (
            FencedWrite.objects.values("writer", "token")
            .annotate(n=Count("id"))
            .order_by("token", "writer")
        )
        return [(row["writer"], row["token"], row["n"]) for row in rows]

    candidates: dict[str, Candidate] = {}
    try:
        step(2, "Three candidates campaign; one is elected")
        for identity in CANDIDATES:
            candidates[identity] = Candidate(identity, env)
        for candidate in candidates.values():
            say(f"started {candidate}, log: {candidate.log_path.relative_to(REPO)}")
        first = wait_for(leader, timeout=20)
        if first is None or first.holder not in candidates:
            raise DemoFailed("no candidate was elected within 20 seconds (see the logs)")
        chief = candidates[first.holder]
        say(f"{chief} is the leader, fencing token {first.token}")
        # Let the leader do some work: fenced writes every 0.5 s.
        wait_for(
            lambda: FencedWrite.objects.filter(token=first.token).count() >= 3 or None, timeout=10
        )
        count = FencedWrite.objects.filter(token=first.token).count()
        say(f"it has committed {count} fenced writes under token {first.token} so far")

        step(3, f"Crash: SIGKILL the leader, {chief}")
        chief.send(signal.SIGKILL)
        killed_at = time.monotonic()
        chief.wait(5)
        say(
            f"killed. It could not release its lease, so the others must wait for it to "
            f"expire (ttl {TTL:g}s)."
        )

        step(4, "Takeover")
        expired_at: float | None = None
        second: Lease | None = None
        give_up = killed_at + TTL + RETRY_INTERVAL + 10
        while second is None and time.monotonic() < give_up:
            lease = leader()
            if lease is None and expired_at is None:
                expired_at = time.monotonic()
                say(f"+{expired_at - killed_at:4.1f}s  the lease expired: nobody leads")
            elif lease is not None and lease.holder != chief.identity:
                second = lease
            time.sleep(0.05)
        if second is None:
            raise DemoFailed(f"no takeover within {give_up - killed_at:g}s of the crash")
        took = time.monotonic() - killed_at
        successor = candidates[second.holder]
        say(f"+{took:4.1f}s  {successor} took over with fencing token {second.token}")
        say(
            f"        (promised: within ttl + retry interval = {TTL + RETRY_INTERVAL:g}s "
            "of the dead leader's last renewal)"
        )
        if second.token != first.token + 1:
            raise DemoFailed(f"expected token {first.token + 1}, got {second.token}")
        say(
            f"token {first.token} -> {second.token}: a write still carrying token {first.token} "
            "would now be refused by lease.fenced()"
        )
        wait_for(
            lambda: FencedWrite.objects.filter(token=second.token).count() >= 2 or None, timeout=10
        )

        step(5, "Shutdown with SIGTERM: followers first, then the leader (it releases the lease)")
        survivors = [c for c in candidates.values() if c is not chief]
        survivors.sort(key=lambda c: c is successor)  # the leader last
        failures = []
        for candidate in survivors:
            candidate.send(signal.SIGTERM)
            code = candidate.wait(15)
            say(f"{candidate} exited with {code if code is not None else 'nothing (hung)'}")
            if code != 0:
                failures.append(f"{candidate} exited with {code}")
        after = leader()
        say(
            "the lease is free now"
            if after is None
            else f"the lease is still held by {after.holder}"
        )

        print(
            "\nFenced writes (table demoapp_fencedwrite): every token has exactly one writer",
            flush=True,
        )
        writes = writes_by_token()
        print(table(["writer", "token", "rows"], writes))
        tokens = [token for _, token, _ in writes]
        if len(tokens) != len(set(tokens)):
            failures.append("a fencing token was used by more than one writer")

        print(f"\nLease history of {NAME!r} (table django_leader_leaseevent, times UTC)")
        events = LeaseEvent.objects.filter(name=NAME).order_by("at", "id")
        print(
            table(
                ["at", "kind", "holder", "token", "previous holder"],
                [
                    (
                        e.at.strftime("%H:%M:%S.%f")[:-3],
                        e.kind,
                        e.holder,
                        e.token,
                        e.previous_holder or "-",
                    )
                    for e in events
                ],
            )
        )
        span = FencedWrite.objects.aggregate(first=Min("token"), last=Max("token"))
        if span["first"] != first.token or span["last"] != second.token:
            failures.append(f"unexpected tokens among the fenced writes: {span}")
        if after is not None:
            failures.append("the lease was not released on SIGTERM")
        if failures:
            raise DemoFailed("; ".join(failures))
    except DemoFailed as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
        for candidate in candidates.values():
            print(f"  log of {candidate}: {candidate.log_path}", file=sys.stderr)
        return 1
    finally:
        for candidate in candidates.values():
            candidate.close()

    print(
        f"\nDone in {time.monotonic() - started:.1f}s. Each candidate's own view of these "
        f"events is in .demo/candidate-*.log."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
