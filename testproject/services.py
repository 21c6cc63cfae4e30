"""Which database servers this machine can reach, for the test suite.

Each reachable server becomes an extra alias (``postgresql``, ``mysql``), Redis a cache
alias and ZooKeeper the ``ZOOKEEPER`` setting; an unreachable one is left out and its reason
kept in :data:`UNAVAILABLE`, so the tests skip it visibly (or, with
``DJANGO_LEADER_REQUIRE_SERVICES=1`` as in CI, fail).
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import unquote, urlparse

#: alias -> why it is not configured
UNAVAILABLE: dict[str, str] = {}

#: Test databases get this suffix so that concurrent test runs on one machine do not drop
#: each other's databases (processes started by a run get the run's names explicitly).
TEST_RUN_ID = os.environ.get("DJANGO_LEADER_TEST_RUN_ID", str(os.getpid()))

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"

DEFAULT_ZOOKEEPER_HOSTS = "127.0.0.1:2181"

DEFAULT_URLS = {
    "postgresql": "postgres://postgres@127.0.0.1:5432/django_leader",
    "mysql": "mysql://root@127.0.0.1:3306/django_leader",
}


def database_from_url(url: str | None) -> dict[str, Any] | None:
    """A DATABASES entry from ``postgres://``, ``mysql://`` or ``sqlite:///`` URLs."""
    if not url:
        return None
    parts = urlparse(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        path = unquote(parts.path)
        if path.startswith("//"):
            path = path[1:]
        name = path.lstrip("/") if not path.startswith("/") else path
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "TEST": {"NAME": name + ".test"},
        }
    engines = {
        "postgres": "django.db.backends.postgresql",
        "postgresql": "django.db.backends.postgresql",
        "mysql": "django.db.backends.mysql",
        "mariadb": "django.db.backends.mysql",
    }
    if scheme not in engines:
        raise ValueError(f"unsupported database URL scheme {parts.scheme!r}")
    entry: dict[str, Any] = {
        "ENGINE": engines[scheme],
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }
    entry["TEST"] = {"NAME": f"test_{entry['NAME']}_{TEST_RUN_ID}"}
    if engines[scheme].endswith("mysql"):
        entry["OPTIONS"] = {"charset": "utf8mb4"}
        entry["TEST"].update(CHARSET="utf8mb4", COLLATION="utf8mb4_unicode_ci")
    return entry


def _driver_missing(alias: str) -> str | None:
    module = {"postgresql": "psycopg", "mysql": "MySQLdb"}[alias]
    try:
        __import__(module)
    except ImportError:
        if alias == "postgresql":
            try:
                __import__("psycopg2")
                return None
            except ImportError:
                pass
        return f"Python driver {module!r} not installed"
    return None


def _reachable(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc.strerror or exc})"


def extra_databases() -> dict[str, dict[str, Any]]:
    if os.environ.get("DJANGO_LEADER_EXTRA_DATABASES", "1") == "0":
        return {}
    found: dict[str, dict[str, Any]] = {}
    for alias, default in DEFAULT_URLS.items():
        url = os.environ.get(f"DJANGO_LEADER_{alias.upper()}_URL", default)
        entry = database_from_url(url)
        assert entry is not None
        problem = _driver_missing(alias) or _reachable(
            entry["HOST"] or "127.0.0.1",
            int(entry["PORT"] or (5432 if alias == "postgresql" else 3306)),
        )
        if problem:
            UNAVAILABLE[alias] = f"{alias}: {problem}"
            continue
        found[alias] = entry
    return found


def redis_caches() -> dict[str, dict[str, Any]]:
    """Cache aliases for the Redis lease backend: Django's RedisCache, and django-redis."""
    if os.environ.get("DJANGO_LEADER_EXTRA_DATABASES", "1") == "0" and not os.environ.get(
        "REDIS_URL"
    ):
        return {}
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    parts = urlparse(url)
    problem = _reachable(parts.hostname or "127.0.0.1", parts.port or 6379)
    try:
        __import__("redis")
    except ImportError:
        problem = "Python package 'redis' not installed"
    if problem:
        UNAVAILABLE["redis"] = UNAVAILABLE["django_redis"] = f"redis: {problem}"
        return {}
    prefix = os.environ.get("DJANGO_LEADER_REDIS_PREFIX", "django_leader_test")
    found = {
        "redis": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": prefix,
        }
    }
    try:
        __import__("django_redis")
    except ImportError:
        UNAVAILABLE["django_redis"] = "django_redis: Python package 'django-redis' not installed"
    else:
        found["django_redis"] = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": prefix + "_dr",
        }
    return found


def four_letter_word(host: str, port: int, word: str = "srvr", timeout: float = 0.5) -> str:
    """ZooKeeper's answer to the four-letter ``word`` (the server closes the connection
    after it); an OSError if it does not answer within ``timeout`` seconds."""
    chunks = []
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(word.encode())
        while chunk := connection.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def zookeeper_mode(host: str, port: int, timeout: float = 0.5) -> str | None:
    """``standalone``, ``leader`` or ``follower`` from the server's ``srvr``; None if it
    does not answer or is not serving (a node of an ensemble without a quorum)."""
    try:
        return _mode(four_letter_word(host, port, "srvr", timeout))
    except OSError:
        return None


def _mode(srvr: str) -> str | None:
    for line in srvr.splitlines():
        if line.startswith("Mode: "):
            return line[len("Mode: ") :].strip()
    return None


def _zookeeper_problem(host: str, port: int) -> str | None:
    try:
        answer = four_letter_word(host, port, "srvr", timeout=0.5)
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc.strerror or exc})"
    if _mode(answer) is None:
        return f"{host}:{port} not serving (srvr: {answer.strip()[:80]!r})"
    return None


def zookeeper_hosts() -> str | None:
    """The ZooKeeper connection string for the tests (``DJANGO_LEADER_ZOOKEEPER_HOSTS``,
    default ``127.0.0.1:2181``) if one of its servers serves and kazoo is installed;
    otherwise None, with the reason in ``UNAVAILABLE["zookeeper"]``."""
    hosts = os.environ.get("DJANGO_LEADER_ZOOKEEPER_HOSTS")
    if os.environ.get("DJANGO_LEADER_EXTRA_DATABASES", "1") == "0" and not hosts:
        return None
    hosts = hosts or DEFAULT_ZOOKEEPER_HOSTS
    try:
        __import__("kazoo")
    except ImportError:
        UNAVAILABLE["zookeeper"] = "zookeeper: Python package 'kazoo' not installed"
        return None
    # "host:port,host:port/chroot": any one server that serves will do, as for kazoo.
    problems = []
    for server in hosts.split("/", 1)[0].split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon:  # a host without a port: ZooKeeper's 2181
            host, port = port, "2181"
        problem = _zookeeper_problem(host.strip("[]"), int(port))
        if problem is None:
            return hosts
        problems.append(problem)
    UNAVAILABLE["zookeeper"] = f"zookeeper: {'; '.join(problems)}"
    return None
