"""Settings validation and system checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_leader.conf import get_settings, resolve_timing, validate_identity
from django_leader.locks import Lock
from tests.support.stores import ROOT


def test_defaults() -> None:
    with override_settings(DJANGO_LEADER={}):
        conf = get_settings()
    assert conf.backend == "django_leader.backends.db.DatabaseBackend"
    assert (conf.timing.ttl, conf.timing.renew_interval, conf.timing.retry_interval) == (15, 5, 2)
    assert conf.database == "default" and conf.history is True and conf.history_retention == 30
    assert conf.timing.call_timeout < conf.timing.ttl - conf.timing.safety_margin


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"LEASE_TTL": 0}, r"DJANGO_LEADER\['LEASE_TTL'\] must be greater than 0"),
        ({"LEASE_TTL": "15"}, r"DJANGO_LEADER\['LEASE_TTL'\] must be a number"),
        (
            {"RENEW_INTERVAL": 8},
            r"DJANGO_LEADER\['RENEW_INTERVAL'\] must be less than "
            r"DJANGO_LEADER\['LEASE_TTL'\] / 2",
        ),
        ({"RETRY_INTERVAL": -1}, r"DJANGO_LEADER\['RETRY_INTERVAL'\] must be greater than 0"),
        ({"DATABASE": "nope"}, r"DJANGO_LEADER\['DATABASE'\] must name an alias"),
        ({"BACKEND": ""}, r"DJANGO_LEADER\['BACKEND'\] must be a non-empty string"),
        ({"HISTORY": "yes"}, r"DJANGO_LEADER\['HISTORY'\] must be True or False"),
        ({"HISTORY_RETENTION": 0}, r"DJANGO_LEADER\['HISTORY_RETENTION'\]"),
        ({"IDENTITY": ""}, r"DJANGO_LEADER\['IDENTITY'\]"),
        ({"LOCK_DELAY": -1}, r"DJANGO_LEADER\['LOCK_DELAY'\] must be None or a number"),
        ({"LOCK_DELAY": "15"}, r"DJANGO_LEADER\['LOCK_DELAY'\] must be None or a number"),
        ({"LOCK_DELAY": float("inf")}, r"DJANGO_LEADER\['LOCK_DELAY'\]"),
        ({"TTL": 3}, r"unknown key\(s\) TTL"),
    ],
)
def test_bad_settings_name_key_and_rule(value: dict[str, Any], message: str) -> None:
    with override_settings(DJANGO_LEADER=value), pytest.raises(ImproperlyConfigured, match=message):
        get_settings()


def test_lock_delay_defaults_to_lease_ttl_and_covers_the_acquirers_ttl() -> None:
    from django_leader.conf import lock_delay

    with override_settings(DJANGO_LEADER={"LEASE_TTL": 12, "RENEW_INTERVAL": 4}):
        assert get_settings().lock_delay == 12.0
        assert lock_delay(3) == 12.0
        assert lock_delay(60) == 60.0  # a longer ttl: its peers may hold that long
    with override_settings(DJANGO_LEADER={"LOCK_DELAY": 0}):
        assert lock_delay(2.5) == 2.5


def test_bad_settings_reported_by_check() -> None:
    with override_settings(DJANGO_LEADER={"LEASE_TTL": 10, "RENEW_INTERVAL": 5}):
        ids = [m.id for m in run_checks()]
    assert "django_leader.E001" in ids


def test_unknown_backend_reported_by_check() -> None:
    for path in ("nowhere.Backend", "django_leader.conf.Timing"):
        with override_settings(DJANGO_LEADER={"BACKEND": path}):
            (found,) = [m for m in run_checks() if m.id == "django_leader.E002"]
        # Issue 28, item 5: the hint named two of the three backends that ship.
        for backend in ("db.DatabaseBackend", "redis.RedisBackend", "zookeeper.ZooKeeperBackend"):
            assert f"django_leader.backends.{backend}" in found.hint, found.hint


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nowhere.Backend", r"DJANGO_LEADER\['BACKEND'\] 'nowhere.Backend' cannot be imported"),
        ("django_leader.conf.Timing", r"'django_leader.conf.Timing' must name a .*Backend"),
    ],
)
def test_unknown_backend_raises_improperly_configured_at_use(path: str, message: str) -> None:
    from django_leader import Elector, lock

    with override_settings(DJANGO_LEADER={"BACKEND": path}):
        with pytest.raises(ImproperlyConfigured, match=message):
            Elector("any-name")
        with pytest.raises(ImproperlyConfigured, match=message), lock("any-name"):
            pass


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared"])
def test_in_memory_sqlite_warned(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from types import SimpleNamespace

    from django_leader import checks

    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": name}}
    monkeypatch.setattr(checks, "connections", SimpleNamespace(settings=databases))
    assert "django_leader.W001" in [m.id for m in checks.check_settings()]


def test_valid_settings_pass_checks() -> None:
    ids = [m.id for m in run_checks() if m.id and m.id.startswith("django_leader")]
    assert ids == []


@pytest.mark.django_db(transaction=True)
def test_missing_table_reported_by_plain_check() -> None:
    from django.db import connection

    ids = [m.id for m in run_checks()]
    assert "django_leader.W002" not in ids
    with connection.schema_editor() as editor:
        from django_leader.models import LeaseEvent

        editor.delete_model(LeaseEvent)
    try:
        messages = [m for m in run_checks() if m.id == "django_leader.W002"]
        assert len(messages) == 1
        assert "django_leader_leaseevent missing in database 'default'" in messages[0].msg
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(LeaseEvent)


@pytest.mark.django_db(transaction=True)
def test_unapplied_migration_reported_by_plain_check() -> None:
    from django.db.migrations.recorder import MigrationRecorder

    recorded = MigrationRecorder.Migration.objects.filter(
        app="django_leader", name="0006_leasecandidate"
    )
    assert recorded.exists()
    recorded.delete()
    try:
        messages = [m for m in run_checks() if m.id == "django_leader.W002"]
        assert [m.msg for m in messages] == [
            "django_leader migration(s) 0006_leasecandidate not applied in database 'default'"
        ]
        assert "manage.py migrate django_leader" in (messages[0].hint or "")
    finally:
        MigrationRecorder.Migration.objects.create(app="django_leader", name="0006_leasecandidate")


@pytest.mark.django_db
def test_unreachable_database_is_silent_in_plain_check_e003_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import DatabaseError

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("connection refused")

    monkeypatch.setattr(
        "django.db.migrations.recorder.MigrationRecorder.applied_migrations", unreachable
    )
    assert [m.id for m in run_checks() if m.id and m.id.startswith("django_leader")] == []
    assert [m.id for m in run_checks(databases=["default"]) if m.id == "django_leader.E003"] == [
        "django_leader.E003"
    ]


def test_resolve_timing_short_ttl_alone_is_valid() -> None:
    timing = resolve_timing(ttl=1.0)
    assert timing.renew_interval == pytest.approx(1 / 3)
    assert timing.safety_margin == pytest.approx(0.1)
    with pytest.raises(ValueError, match="renew_interval must be less than ttl / 2"):
        resolve_timing(ttl=1.0, renew_interval=0.5)


def test_settings_must_be_a_dict() -> None:
    with (
        override_settings(DJANGO_LEADER=[]),
        pytest.raises(ImproperlyConfigured, match="must be a dict"),
    ):
        get_settings()


def test_shared_backend_follows_settings() -> None:
    from django_leader.backends import get_backend

    with override_settings(DJANGO_LEADER={"HISTORY": False}):
        assert get_backend().history_database is None
    assert get_backend().history_database == "default"


@pytest.mark.parametrize("cache", ["default", "missing"])
def test_cache_backend_needs_a_redis_cache(cache: str) -> None:
    from django_leader.backends.cache import CacheBackend

    conf = {"BACKEND": "django_leader.backends.cache.CacheBackend", "CACHE": cache}
    with override_settings(DJANGO_LEADER=conf):
        assert "django_leader.E004" in [m.id for m in run_checks()]
        with pytest.raises(ImproperlyConfigured):
            CacheBackend()


def test_cache_backend_on_redis_passes_checks() -> None:
    from tests.support.stores import require

    require("redis", kind="cache")
    conf = {"BACKEND": "django_leader.backends.cache.CacheBackend", "CACHE": "redis"}
    with override_settings(DJANGO_LEADER=conf):
        assert [m.id for m in run_checks() if m.id and m.id.startswith("django_leader")] == []


def test_plain_check_of_a_new_project_reports_w002_and_creates_no_database(
    tmp_path: Path,
) -> None:
    """``manage.py check`` before the first ``migrate``, as a user runs it: the warning,
    and no SQLite file made by looking (nor any write)."""
    import os
    import subprocess
    import sys

    database = tmp_path / "new.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "DJANGO_LEADER_EXTRA_DATABASES": "0",
    }
    env.pop("REDIS_URL", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "django_leader.W002" in result.stderr + result.stdout
    assert "django_leader_lease," in result.stderr + result.stdout
    assert not database.exists()


def test_a_check_that_fails_reports_w000_instead_of_raising() -> None:
    from django_leader.checks import never_raises

    def check_something(app_configs: Any = None, **kwargs: Any) -> list[Any]:
        raise RuntimeError("Model class x doesn't declare an explicit app_label")

    [message] = never_raises(check_something)(None, databases=None)
    assert message.id == "django_leader.W000"
    assert message.msg == (
        "django_leader's check check_something() could not run: "
        "RuntimeError: Model class x doesn't declare an explicit app_label"
    )
    assert never_raises(lambda **kwargs: [])() == []


@pytest.mark.parametrize(
    "identity", ["a\nb", "host:1\x1b[2J", "csi\x9b31m", "left\u202eright", "tab\there"]
)
def test_identities_with_control_characters_are_refused(identity: str) -> None:
    """Logged, listed by ``leader status``, shown in the admin: a newline or an escape
    sequence in an identity would forge a log line or rewrite a terminal."""
    with pytest.raises(ValueError, match="control characters"):
        validate_identity(identity)
    with pytest.raises(ValueError, match="control characters"):
        Lock("name", identity=identity)
    assert validate_identity("web-1.example:4242:ab12") == "web-1.example:4242:ab12"


@pytest.mark.parametrize(
    "auth", ["digest:app:hunter22", ["digest:app:hunter22"], [("digest", "app:hunter22", "x")]]
)
def test_a_malformed_zookeeper_auth_is_reported_without_its_secret(auth: Any) -> None:
    """ImproperlyConfigured and check E001 say what is wrong with AUTH, not what it holds."""
    settings = {"ZOOKEEPER": {"AUTH": auth}}
    with override_settings(DJANGO_LEADER=settings):
        with pytest.raises(ImproperlyConfigured, match="AUTH") as raised:
            get_settings()
        messages = [str(message) for message in run_checks()]
    assert "hunter22" not in str(raised.value), raised.value
    assert messages and not any("hunter22" in message for message in messages), messages
