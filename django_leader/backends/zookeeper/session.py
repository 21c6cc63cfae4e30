"""One ZooKeeper session: a kazoo client, the session timeout the ensemble granted, and a
session handshake bounded in time (a server that lost its data refuses clients that saw
newer transactions: the client then connects again as a new one)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...conf import ZooKeeperSettings
from ...lease import clock as lease_clock

logger = logging.getLogger("django_leader")

#: The session timeout asked for when ``SESSION_TIMEOUT`` is None (or ``LEASE_TTL`` if
#: longer). A lease expires by its own ttl, so a longer session costs no failover time; it
#: only has to cover every ttl granted in it (ZooKeeper's default maxSessionTimeout is 40 s).
DEFAULT_SESSION_TIMEOUT = 30.0
#: Seconds a session handshake may take before the client gives up on that server and
#: tries again (kazoo's own bound is the whole session timeout).
HANDSHAKE_TIMEOUT = 2.0
#: Session handshakes in a row that may fail before the client forgets the newest
#: transaction it has seen (which a server that lost its data refuses for ever). Forgetting
#: it costs nothing that matters here: a server behind the others may then answer reads
#: with older data, but every decision is a conditional write, made by the ensemble's
#: leader on its current data.
HANDSHAKES_REFUSED = 1


def kazoo_module() -> Any:
    try:
        import kazoo.client
    except ImportError:  # pragma: no cover - depends on the environment
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "django_leader's ZooKeeper backend needs kazoo: pip install 'django-leader[zookeeper]'"
        ) from None
    return kazoo


def acl_of(conf: ZooKeeperSettings) -> list[Any] | None:
    from kazoo.security import ACL, CREATOR_ALL_ACL, Id, make_acl

    if conf.acl is None:
        return None
    if conf.acl == "creator":
        return list(CREATOR_ALL_ACL)
    acls = []
    for entry in conf.acl:
        scheme_id, perms = entry.rsplit(":", 1)
        scheme, ident = scheme_id.split(":", 1)
        flags = {
            "read": "r" in perms,
            "write": "w" in perms,
            "create": "c" in perms,
            "delete": "d" in perms,
            "admin": "a" in perms,
        }
        acls.append(make_acl(scheme, ident, **flags))
    assert all(isinstance(acl, ACL) and isinstance(acl.id, Id) for acl in acls)
    return acls


class Session:
    """One kazoo client (one ZooKeeper session) and the session timeout it was granted."""

    def __init__(self, conf: ZooKeeperSettings, timeout: float, on_state: Callable) -> None:
        kazoo = kazoo_module()
        self.requested = timeout
        #: Seconds the ensemble granted (None until the first connection).
        self.granted: float | None = None
        #: The newest zxid the client had seen when a refused handshake made it forget it
        #: (0: none): a later write with a lower zxid shows the store went back.
        self.forgotten = 0
        #: When (lease clock) the first such refusal was seen: the store went back before.
        self.refused_at = 0.0
        self.client = kazoo.client.KazooClient(
            hosts=conf.hosts,
            timeout=timeout,
            auth_data=list(conf.auth) or None,
            default_acl=acl_of(conf),
            # Reconnect forever, in the background; each call has its own bound.
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 0.5},
            command_retry=None,
            **({} if conf.tls is None else conf.tls.kazoo_options()),
        )
        self._wrap_connect(conf)
        self.client.add_listener(on_state)
        self.started = self.client.start_async()

    def _wrap_connect(self, conf: ZooKeeperSettings) -> None:
        """Learn the session timeout the ensemble granted (it may clamp the one asked to its
        min/maxSessionTimeout): kazoo keeps it only as the read timeout, 2/3 of it."""
        connection = getattr(self.client, "_connection", None)
        connect = getattr(connection, "_connect", None)
        if connection is None or connect is None:  # pragma: no cover - another kazoo
            return

        def recording(*args: Any, **kwargs: Any) -> Any:
            result = connect(*args, **kwargs)
            self.granted = result[0] * 1.5 / 1000.0
            return result

        connection._connect = recording
        invoke = getattr(connection, "_invoke", None)
        if invoke is None:  # pragma: no cover - another kazoo
            return
        from kazoo.protocol.serialization import Connect

        client = self.client
        refused = [0]
        session = self

        def handshake(timeout: float, request: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(request, Connect):
                return invoke(timeout, request, *args, **kwargs)
            # kazoo waits up to the whole session timeout for the session handshake: a
            # server that accepted the connection but does not answer yet (starting,
            # frozen) would keep us SUSPENDED that long. Give up sooner and try again.
            try:
                result = invoke(min(timeout, HANDSHAKE_TIMEOUT), request, *args, **kwargs)
            except Exception:
                refused[0] += 1
                if refused[0] >= HANDSHAKES_REFUSED and client.last_zxid:
                    # A server that lost its data (wiped, restored from an older snapshot)
                    # refuses every client that has seen a newer transaction than its own,
                    # for ever. The store's loss is then noticed like any other (its marker
                    # is missing: the lock-delay); to get there, connect as a new client.
                    logger.warning(
                        "zookeeper %r refused %d session handshake(s) in a row: if it lost "
                        "its data it refuses clients that saw newer transactions; "
                        "connecting again as a new client",
                        conf.hosts,
                        refused[0],
                    )
                    if not session.forgotten:
                        session.refused_at = lease_clock()
                    session.forgotten = max(session.forgotten, int(client.last_zxid))
                    client.last_zxid = 0
                    refused[0] = 0
                raise
            refused[0] = 0
            return result

        connection._invoke = handshake


def granted_ms(session: Session) -> int:
    """The session timeout granted to ``session`` in milliseconds (0 if not known yet)."""
    return round(session.granted * 1000) if session.granted else 0


def default_zookeeper() -> ZooKeeperSettings:
    from ...conf import validate_zookeeper

    settings = validate_zookeeper({})
    assert settings is not None
    return settings
