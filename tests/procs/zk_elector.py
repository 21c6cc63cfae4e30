"""An :class:`~django_leader.Elector` on a ZooKeeper backend of its own (its own session),
reporting every term it sees, for the ZooKeeper fault tests that need a real process
(a holder SIGSTOPped, electors spread over an ensemble's nodes).

Django is configured here, not from ``testproject.settings``: this child needs no database
(history off) and must start quickly.

Environment: ``DL_ZK_HOSTS`` (the connection string), ``DL_ZK_ROOT``, ``DL_ZK_LEASE`` (the
lease name), ``DL_ZK_IDENTITY``, ``DL_ZK_TTL``, ``DL_ZK_RENEW``, ``DL_ZK_RETRY`` and
``DL_ZK_SESSION`` (the session timeout asked for; default the ttl).

Events (JSON lines on stdout, see :func:`tests.procs.common.emit`; ``clock`` is the lease
clock, comparable between processes): ``ready``; ``elected`` (``token``, ``deadline``);
``lost`` (``token``, ``cause``, ``deadline``: the local deadline when it was lost);
``new_leader`` (``holder``, ``token``: a holder this candidate saw); replies to commands.

Commands (stdin, JSON lines):

``status``
    reply ``status``: ``is_leader``, the held ``token`` (or None).
``probe``
    with the lease of the last term lost: ``backend.renew`` it (a late renewal) and read
    who holds the name; reply ``probe`` (``renewed``: the renewed token or None, or
    ``error``; ``holder``, ``token`` of the store's lease).
``exit``
    ``elector.stop()`` (which releases the lease), end the sessions, exit 0.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from tests.procs.common import commands, emit


def setup() -> None:
    from django.conf import settings

    ttl = float(os.environ["DL_ZK_TTL"])
    settings.configure(
        INSTALLED_APPS=["django_leader"],
        DATABASES={},
        USE_TZ=True,
        DJANGO_LEADER={
            "BACKEND": "django_leader.backends.zookeeper.ZooKeeperBackend",
            "LEASE_TTL": ttl,
            "RENEW_INTERVAL": float(os.environ["DL_ZK_RENEW"]),
            "RETRY_INTERVAL": float(os.environ["DL_ZK_RETRY"]),
            "HISTORY": False,
            "LOCK_DELAY": 0,
            "ZOOKEEPER": {
                "HOSTS": os.environ["DL_ZK_HOSTS"],
                "ROOT": os.environ["DL_ZK_ROOT"],
                "SESSION_TIMEOUT": float(os.environ.get("DL_ZK_SESSION") or ttl),
            },
        },
    )
    import django

    django.setup()


def main() -> None:
    setup()
    from django_leader import BackendUnavailable, Elector
    from django_leader.backends.zookeeper import ZooKeeperBackend
    from django_leader.conf import get_settings

    timing = get_settings().timing
    backend = ZooKeeperBackend(timeout=timing.call_timeout)
    held: dict[str, Any] = {"lease": None, "lost": None}
    guard = threading.Lock()

    def on_elected(lease: Any) -> None:
        with guard:
            held["lease"] = lease
        emit("elected", token=lease.token, deadline=lease.deadline)

    def on_lost(lease: Any) -> None:
        with guard:
            held["lease"], held["lost"] = None, lease
        emit(
            "lost",
            token=lease.token,
            cause=str(lease.lost_cause and lease.lost_cause.name),
            reason=lease.lost_reason,
            deadline=lease.deadline,
        )

    def on_new_leader(lease: Any) -> None:
        emit("new_leader", holder=lease.holder, token=lease.token)

    elector = Elector(
        os.environ["DL_ZK_LEASE"],
        identity=os.environ["DL_ZK_IDENTITY"],
        backend=backend,
        on_elected=on_elected,
        on_lost=on_lost,
        on_new_leader=on_new_leader,
    )
    elector.start()
    emit("ready", identity=elector.identity)
    for command in commands():
        if command["cmd"] == "exit":
            break
        if command["cmd"] == "status":
            lease = elector.lease
            emit(
                "status",
                is_leader=elector.is_leader,
                token=None if lease is None else lease.token,
            )
        elif command["cmd"] == "probe":
            with guard:
                lost = held["lost"]
            reply: dict[str, Any] = {"token": None if lost is None else lost.token}
            try:
                renewed = None if lost is None else backend.renew(lost, timing.ttl)
                reply["renewed"] = None if renewed is None else renewed.token
                current = backend.read(lost.name) if lost is not None else None
            except BackendUnavailable as exc:
                reply["error"] = str(exc)
            else:
                reply["holder"] = None if current is None else current.holder
                reply["holder_token"] = None if current is None else current.token
            emit("probe", **reply)
        else:
            emit("error", error=f"unknown command {command!r}")
    elector.stop(timeout=10)
    backend.shutdown()
    emit("exited")
    os._exit(0)


if __name__ == "__main__":
    main()
