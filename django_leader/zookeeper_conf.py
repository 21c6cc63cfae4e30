"""``DJANGO_LEADER["ZOOKEEPER"]``: the ZooKeeper backend's connection, validated key by key
(:func:`validate_zookeeper`, called by :func:`django_leader.conf.get_settings`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def with_defaults(raw: dict[str, Any], defaults: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` over ``defaults``; ImproperlyConfigured naming ``where`` for a key that
    ``defaults`` does not have (the settings' keys are checked so, at every level)."""
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown key(s) {', '.join(unknown)}; known keys are {', '.join(defaults)}"
        )
    return {**defaults, **raw}


#: What ``DJANGO_LEADER["ZOOKEEPER"]`` may hold (the ZooKeeper backend's connection), and
#: the defaults of each key.
ZOOKEEPER_DEFAULTS: dict[str, Any] = {
    "HOSTS": "127.0.0.1:2181",
    "ROOT": "/django-leader",
    "SESSION_TIMEOUT": None,
    "CONNECT_TIMEOUT": None,
    "AUTH": (),
    "ACL": None,
    "TLS": None,
}


@dataclass(frozen=True)
class ZooKeeperSettings:
    """``DJANGO_LEADER["ZOOKEEPER"]``, validated (see docs/zookeeper-backend.md)."""

    #: kazoo's connection string: ``host:port[,host:port…][/chroot]``.
    hosts: str
    #: The znode under which every lease, candidate and marker lives.
    root: str
    #: Seconds asked of the ensemble for the session; None: 30 s, or ``LEASE_TTL`` if
    #: longer. A lease's ttl must not exceed the timeout the ensemble grants (the session's
    #: end frees the lease).
    session_timeout: float | None
    #: Seconds a call waits for the connection while there is none (at the start, after
    #: a drop) before it reports the store unavailable (None: the call timeout); the
    #: client keeps trying in the background.
    connect_timeout: float | None
    #: ``(scheme, credential)`` pairs sent when connecting, e.g. ``("digest", "app:secret")``.
    auth: tuple[tuple[str, str], ...]
    #: The ACL of the znodes created: None (open, ZooKeeper's default),
    #: ``"creator"`` (only the authenticated creator: needs AUTH), or a list of
    #: ``"scheme:id:perms"`` strings (perms from ``rwcda``).
    acl: str | tuple[str, ...] | None
    #: The TLS of the connection (None: plain TCP): see :class:`ZooKeeperTLS`.
    tls: ZooKeeperTLS | None = None


#: What ``DJANGO_LEADER["ZOOKEEPER"]["TLS"]`` may hold, and the defaults of each key.
TLS_DEFAULTS: dict[str, Any] = {
    "CA": None,
    "CERTFILE": None,
    "KEYFILE": None,
    "KEYFILE_PASSWORD": None,
    "VERIFY": True,
    "CHECK_HOSTNAME": True,
}


@dataclass(frozen=True)
class ZooKeeperTLS:
    """``DJANGO_LEADER["ZOOKEEPER"]["TLS"]``, validated: kazoo's ``use_ssl`` and its
    options. The ensemble must serve a ``secureClientPort`` (HOSTS names it)."""

    #: PEM file of the certificate authorities to trust (None: the system's).
    ca: str | None
    #: PEM files of this client's certificate and key, for an ensemble that asks for one.
    certfile: str | None
    keyfile: str | None
    keyfile_password: str | None = field(default=None, repr=False)
    #: Verify the ensemble's certificate, and that it names the host connected to.
    verify: bool = True
    check_hostname: bool = True

    def kazoo_options(self) -> dict[str, Any]:
        """The keyword arguments of ``KazooClient`` for this TLS."""
        return {
            "use_ssl": True,
            "ca": self.ca,
            "certfile": self.certfile,
            "keyfile": self.keyfile,
            "keyfile_password": self.keyfile_password,
            "verify_certs": self.verify,
            "check_hostname": self.verify and self.check_hostname,
        }


def _seconds_or_none(key: str, value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['ZOOKEEPER']['{key}'] must be None or a number of seconds > 0, "
            f"got {value!r}"
        )
    return float(value)


def validate_zookeeper(raw: Any) -> ZooKeeperSettings | None:
    """``DJANGO_LEADER["ZOOKEEPER"]`` checked key by key (None stays None: the backend then
    uses the defaults)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['ZOOKEEPER'] must be a dict, got {type(raw).__name__}"
        )
    conf = with_defaults(raw, ZOOKEEPER_DEFAULTS, "DJANGO_LEADER['ZOOKEEPER']")
    hosts = conf["HOSTS"]
    if isinstance(hosts, (list, tuple)):
        hosts = ",".join(str(host) for host in hosts)
    if not isinstance(hosts, str) or not hosts.strip():
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['HOSTS'] must be a non-empty 'host:port,…' string "
            f"or a list of 'host:port', got {conf['HOSTS']!r}"
        )
    root = conf["ROOT"]
    parts = root.split("/")[1:] if isinstance(root, str) and root.startswith("/") else [""]
    if any(part in ("", ".", "..") for part in parts) or parts[0] == "zookeeper":
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['ROOT'] must be an absolute znode path such as "
            f"'/django-leader' (not '/', no trailing '/', not under /zookeeper), got {root!r}"
        )
    auth = conf["AUTH"]
    if not isinstance(auth, (list, tuple)) or not all(
        isinstance(pair, (list, tuple))
        and len(pair) == 2
        and all(isinstance(part, str) and part for part in pair)
        for pair in auth
    ):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['AUTH'] must be a list of (scheme, credential) "
            f"pairs such as [('digest', 'app:secret')], got {_shape(auth)} (its values are "
            "not shown: they are secrets)"
        )
    acl = conf["ACL"]
    if isinstance(acl, (list, tuple)):
        acl = tuple(acl)
        for entry in acl:
            parts = entry.rsplit(":", 1) if isinstance(entry, str) else []
            if (
                len(parts) != 2
                or ":" not in parts[0]
                or not parts[1]
                or set(parts[1]) - set("rwcda")
            ):
                raise ImproperlyConfigured(
                    "DJANGO_LEADER['ZOOKEEPER']['ACL'] entries must be 'scheme:id:perms' "
                    f"strings (perms from 'rwcda'), got {entry!r}"
                )
    elif acl not in (None, "creator"):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['ACL'] must be None (open), 'creator' or a list of "
            f"'scheme:id:perms' strings, got {acl!r}"
        )
    if acl == "creator" and not auth:
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['ACL'] = 'creator' needs AUTH (the creator is the "
            "authenticated identity)"
        )
    return ZooKeeperSettings(
        hosts=hosts.strip(),
        root=root,
        session_timeout=_seconds_or_none("SESSION_TIMEOUT", conf["SESSION_TIMEOUT"]),
        connect_timeout=_seconds_or_none("CONNECT_TIMEOUT", conf["CONNECT_TIMEOUT"]),
        auth=tuple((str(scheme), str(credential)) for scheme, credential in auth),
        acl=acl,
        tls=_validate_tls(conf["TLS"]),
    )


def _shape(value: Any) -> str:
    """What ``value`` is made of, without any of its values (for an error about a secret)."""
    if isinstance(value, (list, tuple)):
        items = ", ".join(_shape(item) for item in value[:5])
        more = ", ..." if len(value) > 5 else ""
        return f"a {type(value).__name__} of [{items}{more}]"
    if isinstance(value, str):
        return f"a str of {len(value)} characters" if value else "an empty str"
    return f"a {type(value).__name__}"


def _validate_tls(raw: Any) -> ZooKeeperTLS | None:
    """``TLS``: None (plain TCP), True (TLS, the system's CAs) or a dict of
    :data:`TLS_DEFAULTS`' keys."""
    if raw is None or raw is False:
        return None
    if raw is True:
        raw = {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['TLS'] must be None, True or a dict of "
            f"{', '.join(TLS_DEFAULTS)}, got {type(raw).__name__}"
        )
    conf = with_defaults(raw, TLS_DEFAULTS, "DJANGO_LEADER['ZOOKEEPER']['TLS']")
    for key in ("CA", "CERTFILE", "KEYFILE"):
        path = conf[key]
        if path is not None and (not isinstance(path, str) or not os.path.isfile(path)):
            raise ImproperlyConfigured(
                f"DJANGO_LEADER['ZOOKEEPER']['TLS']['{key}'] must be None or the path of a "
                f"readable PEM file, got {path!r}"
            )
    if (conf["CERTFILE"] is None) != (conf["KEYFILE"] is None):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['TLS'] needs CERTFILE and KEYFILE together"
        )
    password = conf["KEYFILE_PASSWORD"]
    if password is not None and not isinstance(password, str):
        raise ImproperlyConfigured(
            "DJANGO_LEADER['ZOOKEEPER']['TLS']['KEYFILE_PASSWORD'] must be None or a str "
            f"(got {_shape(password)})"
        )
    for key in ("VERIFY", "CHECK_HOSTNAME"):
        if not isinstance(conf[key], bool):
            raise ImproperlyConfigured(
                f"DJANGO_LEADER['ZOOKEEPER']['TLS']['{key}'] must be True or False, "
                f"got {conf[key]!r}"
            )
    return ZooKeeperTLS(
        ca=conf["CA"],
        certfile=conf["CERTFILE"],
        keyfile=conf["KEYFILE"],
        keyfile_password=password,
        verify=conf["VERIFY"],
        check_hostname=conf["CHECK_HOSTNAME"],
    )
