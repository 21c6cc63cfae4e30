"""The tutorial (docs/tutorial.md) and the HA beat how-to (docs/howto/ha-beat.md), followed
to the letter by a newcomer's terminals.

A wheel and an sdist are built from this checkout and checked (``twine check``, the
classifiers); a fresh virtualenv gets the wheel with the extras the tutorial names, its
dependencies from the package index, as the README says to install before the first
release; ``django-admin startproject mysite`` makes a fresh project. Then every command,
settings block, file and ``>>>`` example is taken from the pages' own code blocks
(``tests/support/newcomer.py`` reads them) and run: migrate, check and ``leader status``;
two shells electing a leader, one killed with ``kill -9`` and the other taking over, the
history; a lock; ``runleader`` twice and ``Ctrl-C``; a worker and two ``celery beat`` of
which exactly one sends, on Redis (with a ``kill -9`` failover) and on RabbitMQ; and the
how-to's django-celery-beat ``DatabaseScheduler``. What the pages' prose promises (a log
line, who prints what) is checked to be said there, then checked against what happens.

Timing is the tutorial's own (the default ``LEASE_TTL`` of 15 s): the module takes about
two minutes, one virtualenv and pip's cache shared by all its tests. Redis
(127.0.0.1:6379) and RabbitMQ (127.0.0.1:5672) are the pages' brokers: a test whose broker,
or the package index, is unreachable is skipped with the reason, or fails when
``DJANGO_LEADER_REQUIRE_SERVICES=1`` or ``CI`` is set. Each project's worker and beats use a
queue of their own, the one line the test adds to the pages' settings, so that runs sharing
a broker do not see each other's tasks.
"""

from __future__ import annotations

import doctest
import email
import fcntl
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.celeryprocs import STARTUP, CeleryProcess
from tests.support import waiting
from tests.support.newcomer import (
    ROOT,
    Page,
    Site,
    clean_environment,
    package_index,
    pattern,
    run,
    succeed,
    unreachable,
)
from tests.support.stores import REQUIRE_SERVICES

pytestmark = [pytest.mark.multiprocess, pytest.mark.newcomer]

TUTORIAL = Page(ROOT / "docs" / "tutorial.md")
HOWTO = Page(ROOT / "docs" / "howto" / "ha-beat.md")
TASKS_HOWTO = Page(ROOT / "docs" / "howto" / "django-tasks.md")
README = (ROOT / "README.md").read_text()

#: The tutorial's timing (its settings block shows the defaults).
_timing = TUTORIAL.section("1.").of("python")[0].text
TTL = float(re.search(r'"LEASE_TTL": ([\d.]+)', _timing).group(1))
RETRY = float(re.search(r'"RETRY_INTERVAL": ([\d.]+)', _timing).group(1))
#: Slack for a loaded 2-core machine, on top of the times the pages promise.
SLACK = 15.0

#: Commands run, with what each printed.
Ran = list[tuple[str, subprocess.CompletedProcess[str]]]

#: Celery's log line of a beat that sends, and the worker's of the task printing "tick".
SENT = r"Sending due task tick-every-5s \(mysite\.celery\.tick\)"
TICKED = r"\] tick$"


def require(what: str, problem: str | None) -> None:
    """Skip with the reason, or fail where services are required (CI)."""
    if problem is None:
        return
    if REQUIRE_SERVICES or os.environ.get("CI"):
        pytest.fail(f"required service missing: {what}: {problem}")
    pytest.skip(f"service unavailable: {what}: {problem}")


def wait_until(condition: Callable[[], bool], timeout: float, what: str, site: Site) -> None:
    """:func:`tests.support.waiting.wait_until`, failing with the state of the site."""
    waiting.wait_until(condition, timeout=timeout, interval=0.1, message=lambda: (
        f"no {what}\n{site.describe()}"
    ))  # fmt: skip


# -- the distributions and the virtualenv -----------------------------------------------------
@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tutorial")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the pytest workers of this run share (the run's own without xdist): the
    distributions and the virtualenv are made once per run, not once per worker (four
    builds and four virtualenvs at once took a minute of each worker's setup)."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tutorial-shared"
    path.mkdir(exist_ok=True)
    return path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock between the pytest workers (``flock`` of ``path``)."""
    with open(path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module")
def dist(shared: Path) -> dict[str, Path]:
    """The sdist and the wheel of this checkout (``python -m build``, as ``make dist``),
    built once per run."""
    require("package index", unreachable(package_index(), 443))
    out = shared / "dist"
    # One build at a time: python -m build stages the sdist in the checkout itself, and two
    # runs building at once clobbered each other's staging directory.
    lock_path = Path(tempfile.gettempdir()) / f"django-leader-build-{os.getuid()}.lock"
    with locked(shared / "dist.lock"), locked(lock_path):
        if not list(out.glob("*.whl")):
            staging = shared / "dist.staging"
            shutil.rmtree(staging, ignore_errors=True)
            succeed(run([sys.executable, "-m", "build", "--outdir", str(staging), str(ROOT)],
                        ROOT, ENV))  # fmt: skip
            staging.rename(out)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


#: This run's environment, for the tools of the checkout's own .venv.
ENV = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def venv(shared: Path, tmp: Path, dist: dict[str, Path]) -> Iterator[Path]:
    """A fresh virtualenv with the wheel and the extras of the tutorial's ``pip install``,
    made once per run. A test that installs more into it (a how-to's ``pip install``) does
    so under :func:`venv_lock`."""
    path = shared / "venv"
    with venv_lock(shared):
        if not (path / "ready").exists():
            shutil.rmtree(path, ignore_errors=True)
            succeed(run([sys.executable, "-m", "venv", str(path)], tmp, ENV))
            (command,) = TUTORIAL.section("1.").of("console")[0].commands()
            succeed(run(from_wheel(command, dist["wheel"]), tmp, clean_environment(path)))
            (path / "ready").touch()
    yield path


def venv_lock(shared: Path) -> Any:
    return locked(shared / "venv.lock")


def from_wheel(command: str, wheel: Path) -> list[str]:
    """A documented ``pip install "django-leader[extras]" ...`` with the name replaced by the
    wheel, as the README says to install before the first release."""
    argv = shlex.split(command, comments=True)
    assert argv[:2] == ["pip", "install"], command
    named = [index for index, arg in enumerate(argv) if re.match(r"django-leader\b", arg)]
    assert len(named) == 1, command
    argv[named[0]] = str(wheel) + argv[named[0]][len("django-leader") :]
    return argv


def test_the_distributions_pass_twine_check_and_say_what_ci_tests(dist: dict[str, Path]) -> None:
    """``twine check --strict`` passes; the wheel holds every file of the package; the
    classifiers are PyPI's and name every Django and Python version CI tests."""
    from trove_classifiers import classifiers as known

    result = succeed(
        run(
            [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.values())],
            ROOT,
            ENV,
        )
    )
    assert result.stdout.count("PASSED") == 2, result.stdout

    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(wheel.read(metadata))
    tracked = subprocess.run(
        ["git", "ls-files", "django_leader"], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode == 0:  # a git checkout: every tracked file of the package ships
        assert set(tracked.stdout.split()) <= names, set(tracked.stdout.split()) - names
    with tarfile.open(dist["sdist"]) as sdist:
        shipped = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"README.md", "LICENSE", "pyproject.toml", "django_leader/py.typed"} <= shipped
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names

    classifiers = meta.get_all("Classifier") or []
    assert set(classifiers) <= known, set(classifiers) - known
    makefile = (ROOT / "Makefile").read_text()
    django = {
        f"{major}.{minor}" for major, minor in re.findall(r'DJANGO="Django>=(\d+)\.(\d+)', makefile)
    }
    import django as this_django

    django.add(".".join(map(str, this_django.VERSION[:2])))
    for version in django:
        assert f"Framework :: Django :: {version}" in classifiers, version
    oldest = re.search(r"3\.(\d+)", meta["Requires-Python"]).group(1)
    for minor in range(int(oldest), sys.version_info.minor + 1):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers, minor
    # The README tells how to install this very wheel before the first release.
    assert f'pip install "dist/{dist["wheel"].name}[' in README
    assert "celery-redis" in (meta.get_all("Provides-Extra") or [])
    # Issue 28, item 2: "celery,redis", the phrase everyone types, brings what kombu's Redis
    # transport imports (the tutorial installs it: its Redis beats and worker run on it).
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("packaging") and 'extra == "redis"' in r for r in requires), requires
    assert TUTORIAL.section("1.").of("console")[0].commands() == [
        'pip install "django-leader[celery,redis]"'
    ]


# -- the tutorial's project -----------------------------------------------------------------
@pytest.fixture(scope="module")
def site(venv: Path, tmp: Path) -> Iterator[Site]:
    """``mysite``, with the settings of the tutorial's first section."""
    site = Site(venv, tmp / "tutorial")
    for block in TUTORIAL.section("1.").of("python"):
        site.apply(block)
    try:
        yield site
    finally:
        site.close()


@pytest.fixture(scope="module")
def migrated(site: Site) -> Ran:
    """The commands of "Install and migrate", run in order, with what they printed."""
    return [
        (command, site.run(command))
        for command in TUTORIAL.section("1.").of("console")[1].commands()
    ]


def test_install_migrate_and_check(site: Site, migrated: Ran) -> None:
    section = TUTORIAL.section("1.")
    (migrate, result), (_, checked), (_, listed) = migrated
    for _command, outcome in migrated:
        succeed(outcome)
    assert migrate == "python manage.py migrate"
    assert "Applying django_leader.0001_initial... OK" in result.stdout
    # The tables the page names are the tables migrate made.
    documented = set(re.findall(r"`(django_leader_\w+)`", section.text))
    with sqlite3.connect(site.dir / "db.sqlite3") as db:
        made = {
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master"
                " WHERE type = 'table' AND name LIKE 'django_leader_%'"
            )
        }
    assert documented == made
    assert "W002" not in result.stdout + result.stderr  # no warning of the tables it creates
    section.says("prints `System check identified no issues (0 silenced).`")
    assert "System check identified no issues (0 silenced)." in checked.stdout
    section.says("`leader status` prints `no leases yet`")
    assert listed.stdout.strip() == "no leases yet"


def test_two_shells_elect_and_hand_over(site: Site, migrated: Ran) -> None:
    section = TUTORIAL.section("2.")
    first_session, who_leads, stop = section.of("pycon")
    command, examples = first_session.session()
    assert command == "python manage.py shell"
    first = site.shell("shell-1", command)
    for example in examples:
        first.type(example)
    section.says("waits five seconds, then prints `leading with token 1`")
    first.wait_background("leading with token 1", 5 + SLACK)

    section.says('with `identity="second"`', "`elector.wait_for_leadership(5)` returns `False`")
    second = site.shell("shell-2", command)
    for example in examples:
        source, want = example.source.replace('identity="first"', 'identity="second"'), example.want
        if source.startswith("elector.wait_for_leadership("):
            source, want = "elector.wait_for_leadership(5)\n", "False\n"
        second.type(doctest.Example(source, want))
    for example in who_leads.session()[1]:
        second.type(example)

    section.says("`kill -9 %1`", "starts printing `leading with token 2`")
    first.kill()
    killed = time.monotonic()
    seen = second.wait_background("leading with token 2", TTL + RETRY + 5 + SLACK)
    assert "leading with token 1" not in second.background()
    # Elected within TTL + RETRY of the kill, and printing five seconds later.
    assert seen - killed <= TTL + RETRY + 5 + SLACK
    for example in stop.session()[1]:
        second.type(example)

    ((history, shown),) = section.of("console")[0].transcript()
    printed = succeed(site.run(history)).stdout.splitlines()
    assert len(printed) == len(shown), printed
    for want, line in zip(shown, printed, strict=True):
        assert re.fullmatch(pattern(want), line), f"{line!r} is not like {want!r}"


def test_a_lock(site: Site, migrated: Ran) -> None:
    (session,) = TUTORIAL.section("3.").of("pycon")
    shell = site.shell("shell-lock", "python manage.py shell")
    for example in session.session()[1]:
        shell.type(example)


def test_runleader_runs_the_function_on_one_host(site: Site, migrated: Ran) -> None:
    section = TUTORIAL.section("4.")
    (jobs,) = section.of("python")
    site.apply(jobs)
    (command,) = section.of("console")[0].commands()
    elected = "… (elector of 'heartbeat') acquired the lease (token 1)"
    running = "still leading 'heartbeat' with token 1"
    waiting = "'heartbeat' is led by … (token 1)"
    stopping = "signal received: stopping the payload, then releasing 'heartbeat'"
    taken = "… acquired the lease (token 2)"
    section.says(*(f"`{line}`" for line in (elected, running, waiting, stopping, taken)))
    section.says("exits 0", "takes over within `RETRY_INTERVAL`")

    leader = site.start("runleader-1", command)
    leader.wait_log(pattern(elected), STARTUP)
    follower = site.start("runleader-2", command)
    follower.wait_log(pattern(waiting), STARTUP)
    leader.wait_log(pattern(running), 2 + SLACK)
    leader.signal_group(2)  # Ctrl-C: SIGINT to the terminal's foreground job
    assert leader.proc.wait(timeout=SLACK) == 0, leader.tail()
    assert re.search(pattern(stopping), leader.log()), leader.tail()
    follower.wait_log(pattern(taken), RETRY + SLACK)
    follower.signal_group(2)
    assert follower.proc.wait(timeout=SLACK) == 0, follower.tail()


# -- a highly available beat ----------------------------------------------------------------
def beat_site(venv: Path, tmp: Path, label: str, rabbitmq: bool = False) -> Site:
    """A new ``mysite`` with every file and setting of the tutorial (RabbitMQ's broker URL
    only if asked), and a queue of its own."""
    site = Site(venv, tmp / label)
    for title in ("1.", "5."):
        for block in TUTORIAL.section(title).of("python"):
            if rabbitmq or "amqp://" not in block.text:
                site.apply(block)
    site.queue = f"tutorial-{label}-{uuid.uuid4().hex[:8]}"
    site.add_setting(f"CELERY_TASK_DEFAULT_QUEUE = {site.queue!r}  # not in the tutorial")
    return site


def broker_url(site: Site) -> str:
    urls = re.findall(r'^CELERY_BROKER_URL = "(.+)"$', site.settings.read_text(), re.M)
    return urls[-1]


def delete_queue(site: Site) -> None:
    """Remove the project's queue from the shared broker (RabbitMQ keeps it otherwise)."""
    from kombu import Connection

    try:
        with Connection(broker_url(site), connect_timeout=5) as connection:
            connection.default_channel.queue_delete(site.queue)
    except Exception:  # cleanup only: a broker gone by now keeps nothing
        pass


def elected_line(lease: str, token: int) -> str:
    section = TUTORIAL.section("5.")
    shown = "celery beat … elected for 'celery-beat:mysite' (token 1): this beat sends the schedule"
    section.says(f"`{shown}`", "the other logs that it stands by")
    return pattern(
        shown.replace("celery-beat:mysite", lease).replace("(token 1)", f"(token {token})")
    )


def one_sends(
    site: Site, worker: CeleryProcess, beats: list[CeleryProcess], lease: str
) -> tuple[CeleryProcess, CeleryProcess, str]:
    """One beat elected and sending (twice), the other standing by; returns them and the
    sender's identity."""
    elected = re.compile(elected_line(lease, 1), re.M)
    wait_until(
        lambda: any(elected.search(beat.log()) for beat in beats), STARTUP, "elected beat", site
    )
    sender, standby = sorted(beats, key=lambda beat: not elected.search(beat.log()))
    identity = re.search(r"celery beat (\S+) elected", sender.log()).group(1)
    standby.wait_log(r"stands by: " + re.escape(f"'{lease}' is led by {identity}"), STARTUP)
    TUTORIAL.section("5.").says("The worker prints `tick` every five seconds")
    wait_until(
        lambda: sender.count(SENT) >= 2 and worker.count(TICKED) >= 2, 10 + SLACK, "two ticks", site
    )
    assert standby.count(SENT) == 0, standby.tail()
    return sender, standby, identity


def start(
    site: Site, worker_command: str, beat_commands: list[str]
) -> tuple[CeleryProcess, list[CeleryProcess]]:
    worker = site.start("worker", worker_command)
    worker.wait_log(r"\bready\.", STARTUP, "ready")
    return worker, [site.start(f"beat-{n}", command) for n, command in enumerate(beat_commands, 1)]


def migrate(site: Site) -> None:
    for command in TUTORIAL.section("1.").of("console")[1].commands():
        succeed(site.run(command))


def no_errors(site: Site, *beats: CeleryProcess) -> None:
    for beat in beats:
        for line in beat.log().splitlines():
            assert not re.search(r"ERROR|Traceback|does not exist|no such table", line), (
                f"{beat.label}: {line}\n{site.describe()}"
            )


def test_two_beats_on_redis_one_sends_and_a_kill_hands_over(venv: Path, tmp: Path) -> None:
    section = TUTORIAL.section("5.")
    site = beat_site(venv, tmp, "beat-redis")
    require("Redis broker", unreachable(broker_url(site), 6379))
    try:
        migrate(site)
        worker, beats = start(site, *_split(section.of("console")[0].commands()))
        sender, standby, _ = one_sends(site, worker, beats, "celery-beat:mysite")

        section.says(
            "Kill the sending beat with `kill -9`",
            "within `LEASE_TTL + RETRY_INTERVAL` the other is elected",
            "never two for one slot",
        )
        sent = sender.count(SENT)
        wait_until(lambda: worker.count(TICKED) >= sent, SLACK, "the last tick", site)
        killed = time.monotonic()
        sender.kill()
        standby.wait_log(elected_line("celery-beat:mysite", 2), TTL + RETRY + SLACK)
        assert time.monotonic() - killed <= TTL + RETRY + SLACK
        # The catch-up send and a regular one; every send reached the worker once.
        wait_until(lambda: standby.count(SENT) >= 2, 10 + SLACK, "sends of the new leader", site)
        wait_until(
            lambda: worker.count(TICKED) >= sent + standby.count(SENT), SLACK, "their ticks", site
        )
        assert worker.count(TICKED) == sent + standby.count(SENT), site.describe()
        no_errors(site, standby)

        ((status, shown),) = section.of("console")[1].transcript()
        identity = re.search(r"celery beat (\S+) elected", standby.log()).group(1)
        printed = succeed(site.run(status)).stdout.splitlines()
        assert re.fullmatch(pattern(shown[0]), printed[0]), (printed, shown)
        assert f"held by {identity} " in printed[0]
        # Another change of `leader status` may add or drop this line: not the tutorial's.
        assert all(line.startswith("  candidates waiting:") for line in printed[1:]), printed
    finally:
        site.close()
        delete_queue(site)


def test_two_beats_on_rabbitmq_one_sends(venv: Path, tmp: Path) -> None:
    section = TUTORIAL.section("5.")
    section.says('`pip install "django-leader[celery]"` is enough')
    # ... because kombu requires amqp whatever the extras: the `celery` extra brings it.
    requires = succeed(
        run(
            ["python", "-c", "import importlib.metadata as m; print(m.requires('kombu'))"],
            tmp,
            clean_environment(venv),
        )
    ).stdout
    assert re.search(r"'amqp[^';]*'", requires), requires
    site = beat_site(venv, tmp, "beat-rabbitmq", rabbitmq=True)
    assert broker_url(site) == "amqp://guest:guest@127.0.0.1:5672//"
    require("RabbitMQ broker", unreachable(broker_url(site), 5672))
    try:
        migrate(site)
        worker, beats = start(site, *_split(section.of("console")[0].commands()))
        one_sends(site, worker, beats, "celery-beat:mysite")
        no_errors(site, *beats)
    finally:
        site.close()
        delete_queue(site)


def test_howto_two_beats_with_django_celery_beat(
    venv: Path, tmp: Path, dist: dict[str, Path]
) -> None:
    """docs/howto/ha-beat.md on the tutorial's project: django-celery-beat's
    DatabaseScheduler wrapped, its tables migrated, one beat sending."""
    steps = HOWTO.section("With `LeaderScheduler`")
    install, migrate_and_check, beat, status = steps.of("console")
    settings = steps.of("python")  # the settings, and SQLite's transaction mode
    site = beat_site(venv, tmp, "beat-dcb")
    require("Redis broker", unreachable(broker_url(site), 6379))
    try:
        (command,) = install.commands()
        with venv_lock(venv.parent):
            succeed(run(from_wheel(command, dist["wheel"]), site.dir, site.env))
        for block in settings:
            site.apply(block)
        outcomes = [succeed(site.run(command)) for command in migrate_and_check.commands()]
        assert "System check identified no issues" in outcomes[-1].stdout
        with sqlite3.connect(site.dir / "db.sqlite3") as db:
            migrated = db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'django_celery_beat_crontabschedule'"
            ).fetchone()
        # Without it the elected beat fails at every tick while it holds the lease.
        assert migrated, "the how-to's migrate left django-celery-beat's tables out"

        (beat_command,) = [c.replace("myproject", "mysite") for c in beat.commands()]
        worker_command = TUTORIAL.section("5.").of("console")[0].commands()[0]
        worker, beats = start(site, worker_command, [beat_command, beat_command])
        sender, _, identity = one_sends(site, worker, beats, "myproject-beat")
        assert "DatabaseScheduler" in sender.log()
        no_errors(site, *beats)
        (command,) = status.commands()
        printed = succeed(site.run(command)).stdout.splitlines()
        assert printed[0].startswith(f"myproject-beat: held by {identity} (token 1)"), printed
    finally:
        site.close()
        delete_queue(site)


def _split(commands: list[str]) -> tuple[str, list[str]]:
    """The tutorial's worker and beats: ``celery -A mysite worker …``, then the beats."""
    worker, *beats = commands
    assert " worker " in worker and len(beats) == 2 and all(" beat " in c for c in beats)
    return worker, beats


# -- the django.tasks how-to ----------------------------------------------------------------
def test_howto_django_tasks_one_worker_runs_the_singleton_and_the_other_says_it_skipped(
    venv: Path, tmp: Path, dist: dict[str, Path]
) -> None:
    """docs/howto/django-tasks.md's install and "Try it" on a new ``mysite``: its ``pip
    install`` (issue 28, item 1: it once left out django-tasks-db, then the settings left out
    its app), its settings and task, two enqueues of one key and two ``db_worker``. One
    execution runs; the other skips, and its worker says so (it once said nothing)."""
    steps = TASKS_HOWTO.section("Install")
    install, migrate_command, try_it = steps.of("console")
    settings_block, task_file = steps.of("python")
    site = Site(venv, tmp / "tasks")
    try:
        (command,) = install.commands()
        with venv_lock(venv.parent):
            succeed(run(from_wheel(command, dist["wheel"]), site.dir, site.env))
        site.apply(settings_block)
        site.apply(task_file)
        (command,) = migrate_command.commands()
        succeed(site.run(command))
        enqueue, *workers = try_it.commands()
        assert workers == ["python manage.py db_worker"] * 2, workers
        succeed(site.run(enqueue))
        started = [site.start(f"db_worker-{n}", command) for n, command in enumerate(workers)]

        def results() -> list[tuple[str, Any]]:
            with sqlite3.connect(site.dir / "db.sqlite3") as db:
                (table,) = db.execute(
                    "SELECT name FROM sqlite_master WHERE name LIKE '%\\_dbtaskresult' ESCAPE '\\'"
                ).fetchone()
                rows = db.execute(f"SELECT status, return_value FROM {table}").fetchall()
            return [(status, json.loads(value) if value else None) for status, value in rows]

        wait_until(
            lambda: [s for s, _ in results()] == ["SUCCESSFUL"] * 2, 60, "both executions", site
        )
        values = sorted((value for _, value in results()), key=lambda v: v is None)
        assert isinstance(values[0], int) and values[1] is None, values  # the token; skipped
        steps.says("prints `build_report skipped: …`")
        said = [worker for worker in started if "build_report skipped: " in worker.log()]
        assert len(said) == 1, site.describe()
        assert "singleton:report-2026-11-27" in said[0].log()
    finally:
        site.close()


# -- the README's quickstart -----------------------------------------------------------------
def test_readme_quickstart_in_a_new_project(venv: Path, tmp: Path) -> None:
    """The README's Quickstart as written (issue 28: its code once named a model and
    functions it never defined): its settings and module in a new ``mysite``, ``migrate``,
    the lock's transcript, then ``lead()`` on two hosts, the leader killed with ``kill -9``
    and the other taking over."""
    section = Page(ROOT / "README.md").section("Quickstart")
    site = Site(venv, tmp / "quickstart")
    try:
        for block in section.of("python"):
            if block.path:  # the settings and the module; the sketches after them are not
                site.apply(block)
        migrate, sessions = section.of("console")[:2]
        for command in migrate.commands():
            succeed(site.run(command))
        (imported, shown), (lead, led) = sessions.transcript()
        printed = succeed(site.run(imported)).stdout.splitlines()
        # Django 5.2's shell first counts what it imported for you: not the README's output.
        assert [line for line in printed if line and "automatically" not in line] == shown
        assert led == ["leading with token 1"], led
        first = site.start("lead-1", lead)
        first.wait_log(r"leading with token 1\b", 10 + SLACK)
        second = site.start("lead-2", lead)
        section.says("the others wait and take over within `LEASE_TTL + RETRY_INTERVAL`")
        time.sleep(1.0)
        assert "leading with token" not in second.log(), site.describe()
        killed = first.kill()
        # Its first line comes one wait(10) after it is elected.
        second.wait_log(r"leading with token 2\b", TTL + RETRY + 10 + SLACK)
        assert time.time() - killed <= TTL + RETRY + 10 + SLACK
        assert "Traceback" not in second.log(), site.describe()
    finally:
        site.close()
