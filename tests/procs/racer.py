"""A contender that calls ``acquire`` on the store's backend (``DatabaseBackend``,
``CacheBackend`` or ``ZooKeeperBackend``, see :mod:`.common`) once per ``race`` command, at
the wall-clock instant the parent names, so that several processes hit the store together.

Each ``raced`` report comes after the backend's history was flushed (``history_flushed``):
Redis and ZooKeeper write it to the database asynchronously, from a thread of this process.

Commands: ``{"cmd": "race", "name": ..., "at": <time.time()>, "ttl": ...}``,
``{"cmd": "exit"}``.
"""

from __future__ import annotations

import os
import time

from tests.procs.common import commands, emit, lease_fields, make_backend, setup_django

#: Seconds to wait for the history of an attempt to be written.
PATIENCE = 10.0


def main() -> None:
    setup_django()
    from django_leader import BackendUnavailable

    identity = os.environ["DL_MP_IDENTITY"]
    backend = make_backend()
    backend.read("warm-up")  # open the connection now, not inside the race
    emit("ready", identity=identity)
    for command in commands():
        if command["cmd"] == "exit":
            break
        if command["cmd"] != "race":
            emit("error", error=f"unknown command {command!r}")
            continue
        # Sleep until shortly before the start instant, then spin to it: all contenders
        # leave the barrier within a few hundred microseconds of each other.
        while (left := command["at"] - time.time()) > 0.005:
            time.sleep(left - 0.005)
        while time.time() < command["at"]:
            pass
        started = time.time()
        try:
            acquired, current = backend.acquire(command["name"], identity, command["ttl"])
        except BackendUnavailable as exc:
            emit("raced", name=command["name"], started=started, won=False, error=str(exc))
            continue
        # After the race: the history of this attempt is in the database before the report.
        flushed = backend.flush_history(PATIENCE)
        emit(
            "raced",
            name=command["name"],
            started=started,
            history_flushed=flushed,
            won=acquired is not None,
            acquired=None if acquired is None else lease_fields(acquired),
            current=None if current is None else lease_fields(current),
        )
    backend.close()
    os._exit(0)


if __name__ == "__main__":
    main()
