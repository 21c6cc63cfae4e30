"""The system checks as a new user meets them: a project made by ``django-admin
startproject``, one setting gone wrong, ``manage.py`` commands run as processes.

Each case is a mistake a user made following the docs. A check must report it, in words
that name the setting, and must never raise: Django runs the checks before ``migrate``,
``runserver`` and every management command, so a check that raises stops all of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("celery")

SITE = "mysite"
# django-celery-beat's scheduler behind LeaderScheduler, as the HA beat how-to sets it up.
DATABASE_SCHEDULER = """
INSTALLED_APPS += ["django_celery_beat"]
DJANGO_LEADER = {"BEAT_SCHEDULER": "django_celery_beat.schedulers:DatabaseScheduler"}
CELERY_BEAT_SCHEDULER = "django_leader.celery:LeaderScheduler"
"""
NO_ISSUES = "System check identified no issues (0 silenced).\n"

# A sitecustomize.py that makes ``import packaging`` fail as in a venv without it.
NO_PACKAGING = """
import sys

class NoPackaging:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "packaging":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoPackaging())
"""


def user_env(project: Path) -> dict[str, str]:
    """The environment of a user's shell: none of the test run's Django settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "DJANGO_SETTINGS_MODULE" and not key.startswith("DJANGO_LEADER_")
    }
    return {**env, "PYTHONPATH": str(project)}


def run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        env=user_env(project),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_first_migrate_does_not_warn_of_the_tables_it_creates(new_project: Path) -> None:
    """W002 (tables missing) belongs to ``check``, not to the ``migrate`` that creates them:
    it used to be the first thing a new user's ``migrate django_leader`` printed."""
    assert_clean_warning(run(new_project, "check"), "django_leader.W002")
    migrated = run(new_project, "migrate", "django_leader")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "W002" not in migrated.stdout + migrated.stderr
    assert "Applying django_leader.0001_initial... OK" in migrated.stdout
    checked = run(new_project, "check")
    assert (checked.returncode, checked.stdout) == (0, NO_ISSUES)


def test_runleader_and_the_beat_stop_with_the_fix_when_the_tables_are_missing(
    new_project: Path,
) -> None:
    """Issue 28, item 5: before ``migrate``, ``runleader`` and ``celery beat`` logged a
    failed campaign every RETRY_INTERVAL for ever. They now stop at once, saying W002's
    message and its fix."""
    ran = run(new_project, "runleader", "job", "--", "sleep", "30")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    (said,) = [line for line in ran.stderr.splitlines() if line.startswith("CommandError")]
    assert "django_leader_lease" in said and "missing in database 'default'" in said, said
    assert "Run `manage.py migrate django_leader --database default`." in said
    assert "campaign" not in ran.stderr  # it never campaigned

    (new_project / SITE / "celery.py").write_text(
        "from celery import Celery\n\n"
        f"app = Celery({SITE!r})\n"
        'app.config_from_object("django.conf:settings", namespace="CELERY")\n'
    )
    beat = subprocess.run(
        [sys.executable, "-m", "celery", "-A", SITE, "beat", "-S",
         "django_leader.celery:LeaderScheduler", "--loglevel", "INFO"],
        cwd=new_project, capture_output=True, text=True, timeout=60,
        env={**user_env(new_project), "DJANGO_SETTINGS_MODULE": f"{SITE}.settings"},
    )  # fmt: skip
    output = beat.stdout + beat.stderr
    assert beat.returncode != 0, output
    assert "missing in database 'default'" in output, output
    assert "campaign for" not in output


@pytest.fixture
def new_project(tmp_path: Path) -> Path:
    """A fresh project with django_leader in INSTALLED_APPS, nothing else configured."""
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", SITE, str(tmp_path)],
        check=True,
        env=user_env(tmp_path),
        timeout=60,
    )
    configure(tmp_path, 'INSTALLED_APPS += ["django_leader"]')
    return tmp_path


@pytest.fixture
def project(new_project: Path) -> Path:
    """The fresh project, migrated."""
    migrated = run(new_project, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    return new_project


def configure(project: Path, text: str) -> None:
    with open(project / SITE / "settings.py", "a") as settings:
        settings.write(f"\n{text}\n")


def assert_clean_warning(result: subprocess.CompletedProcess[str], check_id: str) -> str:
    """The command succeeded, reported ``check_id`` and printed no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    assert f"({check_id})" in output, output
    return output


def test_a_database_scheduler_without_its_app_is_w011_not_a_crash(project: Path) -> None:
    """The old check imported django-celery-beat's scheduler to look at it, which imports
    its models: Django raised RuntimeError ("doesn't declare an explicit app_label") out
    of ``check``, ``migrate`` and ``leader status`` alike."""
    pytest.importorskip("django_celery_beat")
    configure(
        project,
        'DJANGO_LEADER = {"BEAT_SCHEDULER": "django_celery_beat.schedulers:DatabaseScheduler"}\n'
        'CELERY_BEAT_SCHEDULER = "django_leader.celery:LeaderScheduler"',
    )
    output = assert_clean_warning(run(project, "check"), "django_leader.W011")
    assert "'django_celery_beat' is not in INSTALLED_APPS" in output
    assert_clean_warning(run(project, "migrate"), "django_leader.W011")
    status = run(project, "leader", "status")
    assert_clean_warning(status, "django_leader.W011")
    assert status.stdout == "no leases yet\n"


def test_beat_scheduler_set_without_celery_beat_scheduler_is_w013(project: Path) -> None:
    """The likeliest mistake: ``BEAT_SCHEDULER`` set, ``CELERY_BEAT_SCHEDULER`` forgotten.
    Beat then runs Celery's own scheduler and every beat sends; the old check said
    nothing, because it only looked at a ``CELERY_BEAT_SCHEDULER`` that was set."""
    configure(project, 'DJANGO_LEADER = {"BEAT_SCHEDULER": "celery.beat:PersistentScheduler"}')
    output = assert_clean_warning(run(project, "check"), "django_leader.W013")
    assert "CELERY_BEAT_SCHEDULER is not set (Celery's default)" in output
    assert "every one of them sends" in output

    configure(project, 'CELERY_BEAT_SCHEDULER = "django_leader.celery:LeaderScheduler"')
    result = run(project, "check")
    assert (result.returncode, result.stdout) == (
        0,
        NO_ISSUES,
    )


def test_a_redis_broker_whose_transport_cannot_load_is_w014(project: Path) -> None:
    """``pip install django-leader[celery,redis]`` once gave redis-py but not what kombu's
    Redis transport imports (``packaging``): every worker and beat died at start. Here the
    import of ``packaging`` is made to fail in the checked process, as it did then."""
    pytest.importorskip("redis")
    configure(project, 'CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"')
    result = run(project, "check")
    assert (result.returncode, result.stdout) == (
        0,
        NO_ISSUES,
    )

    blocker = project / "sitecustomize.py"  # runs at start-up, before Django
    blocker.write_text(NO_PACKAGING)
    output = assert_clean_warning(run(project, "check"), "django_leader.W014")
    assert "kombu's Redis transport cannot be imported" in output
    assert "No module named 'packaging'" in output
    assert 'pip install "celery[redis]"' in output


def test_a_database_scheduler_on_sqlite_without_immediate_transactions_is_w015(
    project: Path,
) -> None:
    """Two beats on SQLite with django-celery-beat's scheduler: now and then the elected
    beat could not save an entry ("database is locked": the other beat was writing to the
    lease table) and never sent it. IMMEDIATE transactions take the lock at their start."""
    pytest.importorskip("django_celery_beat")
    configure(project, DATABASE_SCHEDULER)
    assert_clean_warning(run(project, "migrate"), "django_leader.W015")
    output = assert_clean_warning(run(project, "check"), "django_leader.W015")
    assert "'database is locked'" in output
    import django

    if django.VERSION >= (5, 1):
        assert """DATABASES['default']["OPTIONS"]["transaction_mode"] = "IMMEDIATE".""" in output
        configure(project, 'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}')
        result = run(project, "check")
        assert (result.returncode, result.stdout) == (0, NO_ISSUES)


def test_a_database_scheduler_without_its_tables_is_w016(project: Path) -> None:
    """The HA beat how-to once migrated ``django_leader`` only: the elected beat then
    failed at every tick on django-celery-beat's missing tables, holding the lease."""
    pytest.importorskip("django_celery_beat")
    configure(project, DATABASE_SCHEDULER)
    import django

    if django.VERSION >= (5, 1):  # else W015 stays: no IMMEDIATE transactions before 5.1
        configure(project, 'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}')
    output = assert_clean_warning(run(project, "check"), "django_leader.W016")
    assert "django_celery_beat_crontabschedule" in output
    assert "the elected beat would fail at every tick" in output
    migrated = run(project, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "W016" not in migrated.stdout + migrated.stderr  # it is creating them
    assert "W016" not in run(project, "check").stderr
