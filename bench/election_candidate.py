"""One candidate process of ``bench/elections.py``: one or more Electors (threads) of one
lease name, and a trace of what they ask the store, on stdout.

    python bench/election_candidate.py NAME --ttl 3 --renew 1 --retry 1 --mode race
        [--electors 1] [--no-wakeups] [--wait] [--trace] [--rejoin] [--commands]

The test project's settings pick the store (``DJANGO_LEADER_BACKEND``,
``DJANGO_LEADER_DATABASE``, ``DJANGO_LEADER_CACHE``, ``DATABASE_URL``, ``REDIS_URL``).
Lines printed, one event each, times from ``time.time()``:

* ``loaded PID`` — Django is set up; with ``--wait`` the process then waits for ``go`` on
  stdin before it campaigns (a spare, loaded ahead so that its start-up does not compete
  with a measured handover for the CPU);
* ``ready IDENTITY T`` — announced in the registry, and its wake-up watch is live (or it
  has none);
* ``elected IDENTITY PID T``;
* with ``--trace``: ``T KIND IDENTITY START END [GRANTED]``, for each ``acquire``
  (``acq``), ``release`` (``rel``), ``wake`` (``wake``: the NOTIFY or PUBLISH),
  ``candidates`` (``cands``) and ``announce`` (``ann``) call, each wake-up received
  (``woken``: START = END = when the watch's callback ran), and ``term`` (SIGTERM
  received).

``--no-wakeups``: the store's ``watch()`` returns None, as a store that cannot push does:
the candidates poll every ``retry_interval``. A bench switch, not a setting.

``--rejoin`` (one elector): after SIGTERM has stopped the elector (the lease released, the
next one woken: all a process does before it exits), print ``stopped IDENTITY T``, wait
for ``go``, and campaign again as a new candidate (a new identity), as a replacement
process would, without a start-up between two trials.

``--commands`` (implied by ``--electors`` > 1): the electors campaign in threads, and stdin
takes commands: ``stop IDENTITY`` stops that elector (it releases the lease if it holds
it, and wakes the next: a graceful handover) and prints ``stopped IDENTITY T``;
``start IDENTITY`` makes it campaign again (it joins at the tail); ``quit`` stops them all
and exits.
SIGTERM: every elector stops (releasing the lease), then the process exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_print_lock = threading.Lock()


def emit(*parts: object) -> None:
    line = " ".join(str(part) for part in parts) + "\n"
    with _print_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class Ready:
    """Says ``ready IDENTITY`` once that elector has announced itself and its watch is live."""

    def __init__(self) -> None:
        self.announced: set[str] = set()
        self.watches: dict[str, Any] = {}
        self.owners: dict[int, str] = {}  # id() of an Elector's wake-up Event -> identity
        self.said: set[str] = set()
        self.wakeups = True
        self.lock = threading.Lock()

    def check(self, identity: str) -> None:
        with self.lock:
            if identity in self.said or identity not in self.announced:
                return
            watch = self.watches.get(identity)
            if self.wakeups and (watch is None or not watch.live):
                return
            self.said.add(identity)
        emit("ready", identity, f"{time.time():.6f}")


def instrument(backend: Any, ready: Ready, trace: bool, wakeups: bool) -> None:
    """Wrap the (shared, per process) backend instance's methods: trace each call, turn
    wake-ups off. Instance attributes, so every Elector of the process goes through them."""
    if getattr(backend, "_bench_instrumented", False):
        return
    backend._bench_instrumented = True
    ready.wakeups = wakeups
    acquire, release, wake = backend.acquire, backend.release, backend.wake
    candidates, announce, watch = backend.candidates, backend.announce, backend.watch

    def traced_acquire(name: str, holder: str, ttl: float) -> Any:
        start = time.time()
        result = acquire(name, holder, ttl)
        if trace:
            emit(
                "T", "acq", holder, f"{start:.6f}", f"{time.time():.6f}", int(result[0] is not None)
            )
        return result

    def traced_release(lease: Any) -> Any:
        start = time.time()
        result = release(lease)
        if trace:
            emit("T", "rel", lease.holder, f"{start:.6f}", f"{time.time():.6f}", int(bool(result)))
        return result

    def traced_wake(name: str, identity: str | None = None) -> Any:
        start = time.time()
        result = wake(name, identity)
        if trace:
            emit("T", "wake", identity or "*", f"{start:.6f}", f"{time.time():.6f}")
        return result

    def traced_candidates(name: str) -> Any:
        start = time.time()
        result = candidates(name)
        if trace:
            emit("T", "cands", os.getpid(), f"{start:.6f}", f"{time.time():.6f}")
        return result

    def traced_announce(name: str, candidate: Any, ttl: float) -> Any:
        start = time.time()
        result = announce(name, candidate, ttl)
        if trace:
            emit("T", "ann", candidate.identity, f"{start:.6f}", f"{time.time():.6f}")
        ready.announced.add(candidate.identity)
        ready.check(candidate.identity)
        return result

    def traced_watch(name: str, callback: Any, *, identity: str | None = None) -> Any:
        if not wakeups:
            return None
        # A race candidate watches the name's channel (identity None): who it is comes from
        # the Event whose set() the Elector passes as the callback.
        who = identity or ready.owners.get(id(getattr(callback, "__self__", None)), "?")

        def woken() -> None:
            if trace:
                now = f"{time.time():.6f}"
                emit("T", "woken", who, now, now)
            callback()
            ready.check(who)

        handle = watch(name, woken, identity=identity)
        ready.watches[who] = handle
        return handle

    backend.acquire, backend.release, backend.wake = traced_acquire, traced_release, traced_wake
    backend.candidates, backend.announce = traced_candidates, traced_announce
    backend.watch = traced_watch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--renew", type=float, required=True)
    parser.add_argument("--retry", type=float, required=True)
    parser.add_argument("--mode", default="race")
    parser.add_argument("--electors", type=int, default=1)
    parser.add_argument("--no-wakeups", action="store_true")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--rejoin", action="store_true")
    parser.add_argument("--commands", action="store_true")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django_leader import Elector

    ready = Ready()
    host = socket.gethostname()
    electors: list[Elector] = []

    def make(identity: str) -> Elector:
        elector = Elector(
            args.name,
            ttl=args.ttl,
            renew_interval=args.renew,
            retry_interval=args.retry,
            mode=args.mode,
            identity=identity,
            on_elected=lambda lease: emit(
                "elected", lease.holder, os.getpid(), f"{time.time():.6f}"
            ),
        )
        ready.owners[id(elector._follow)] = identity
        instrument(elector.backend, ready, args.trace, not args.no_wakeups)
        return elector

    electors.extend(make(f"{host}-{os.getpid()}-{n}") for n in range(args.electors))

    # A watch goes live a moment after it is opened (the listening thread subscribes):
    # look again until every elector said it is ready.
    def poll_ready() -> None:
        while True:
            for elector in list(electors):
                ready.check(elector.identity)
            time.sleep(0.02)

    emit("loaded", os.getpid())
    if args.wait and sys.stdin.readline().strip() != "go":
        return
    threading.Thread(target=poll_ready, daemon=True).start()

    done = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        if args.trace:
            now = f"{time.time():.6f}"
            emit("T", "term", os.getpid(), now, now)
        done.set()
        for elector in electors:
            elector.stop(timeout=0)  # from the campaign thread (run() below): only asks

    signal.signal(signal.SIGTERM, on_term)
    if args.electors == 1 and not args.commands:
        # As a real single candidate: the campaign in the main thread, which the signal
        # handler interrupts (Elector.stop() then only asks, and run() returns).
        generation = 0
        while True:
            electors[0].run()
            if not args.rejoin:
                return
            # --rejoin: stopped like a process that exits, then, when told, a new
            # candidate of this (warm) process joins: no start-up between two trials.
            emit("stopped", electors[0].identity, f"{time.time():.6f}")
            if sys.stdin.readline().strip() != "go":
                return
            generation += 1
            electors[0] = make(f"{host}-{os.getpid()}-{generation}")

    by_identity = {elector.identity: elector for elector in electors}

    def commands() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["stop"] and len(words) == 2 and words[1] in by_identity:
                by_identity[words[1]].stop(timeout=30)
                emit("stopped", words[1], f"{time.time():.6f}")
            elif words[:1] == ["start"] and len(words) == 2 and words[1] in by_identity:
                by_identity[words[1]].start()
            elif words[:1] == ["quit"]:
                break
        done.set()

    for elector in electors:
        elector.start()
    threading.Thread(target=commands, daemon=True).start()
    while not done.wait(0.5):
        pass
    for elector in electors:
        elector.stop(timeout=10)


if __name__ == "__main__":
    main()
