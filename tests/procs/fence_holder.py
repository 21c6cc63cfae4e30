"""A holder of a lease that writes through ``lease.fenced(using=...)``, for
tests/processes/test_fenced_row.py.

Environment (besides :mod:`.common`'s, which pick the store): ``DL_MP_IDENTITY``,
``DL_MP_LEASE``, ``DL_MP_TTL`` (the lease's time in the store) and ``DL_FENCE_USING``, the
database the fenced writes go to.

It takes the lease once (no renewer: it is to expire while this process is stopped) and
reports ``acquired`` (``token``). Commands (stdin, JSON lines):

``write``
    a ``FencedWrite`` row (``note``) through ``lease.fenced(using=DL_FENCE_USING)`` with
    the held lease (``fenced``), and the same with a copy whose local deadline is still
    ahead (``unaware``: a holder whose own clock did not catch the pause, so that only the
    database can refuse it); reply ``wrote`` with both outcomes (``committed`` or
    ``rejected: ...``).
"""

from __future__ import annotations

import dataclasses
import os
import threading

from tests.procs.common import clock, commands, emit, make_backend, setup_django


def main() -> None:
    setup_django()
    from django_leader import LeadershipLost, Lease
    from django_leader.conf import resolve_timing
    from django_leader.term import acquire_once
    from testproject.demoapp.models import FencedWrite

    backend = make_backend()
    using = os.environ["DL_FENCE_USING"]
    name = os.environ["DL_MP_LEASE"]
    identity = os.environ["DL_MP_IDENTITY"]
    lease, _ = acquire_once(backend, name, identity, resolve_timing(float(os.environ["DL_MP_TTL"])))
    if lease is None:
        emit("fatal", error=f"{name} is held already")
        os._exit(3)
    # Its history is written by a thread of its own: done before the parent stops this
    # process, which must hold no SQLite lock while stopped.
    backend.flush_history(10)
    emit("acquired", token=lease.token, identity=identity)

    def fenced_write(held: Lease, note: str) -> str:
        try:
            with held.fenced(using=using):
                FencedWrite.objects.using(using).create(writer=name, token=held.token, note=note)
        except LeadershipLost as exc:
            return f"rejected: {exc}"
        return "committed"

    for command in commands():
        if command["cmd"] == "write":
            unaware = dataclasses.replace(
                lease, lost=threading.Event(), lost_reason="", deadline=clock() + 60
            )
            note = command["note"]
            emit(
                "wrote",
                fenced=fenced_write(lease, note),
                unaware=fenced_write(unaware, f"{note}-unaware"),
            )
        else:
            emit("error", error=f"unknown command {command!r}")
    os._exit(0)


if __name__ == "__main__":
    main()
