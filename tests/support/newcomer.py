"""What a newcomer has: the pages of docs/ as text, a fresh virtualenv, a fresh Django
project and its terminals (``tests/processes/test_tutorial.py``).

The pages are read, not paraphrased: :class:`Page` splits a Markdown page into its
sections and fenced code blocks, and the test takes every command, setting, file and
``>>>`` example it runs from there, so that a page that drifts from the code fails.
"""

from __future__ import annotations

import contextlib
import doctest
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from tests.celeryprocs import STARTUP, CeleryProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("doc_console.py")
MARKER = "\x1edoc-console "

#: ``# mysite/settings.py`` (and anything after the path) on the first line of a Python
#: block: the block is that file, or (settings) lines to add to it.
FILE_BLOCK = re.compile(r"^# ([\w./-]+\.py)\b")
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.M | re.S)
#: An ISO timestamp as ``leader history`` / ``leader status`` print it.
TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00"
#: A default identity, ``<hostname>:<pid>:<random>``.
IDENTITY = r"[\w.-]+:\d+:[0-9a-f]{8}"


# -- the pages ------------------------------------------------------------------------------
@dataclass
class Block:
    lang: str
    text: str

    @property
    def path(self) -> str | None:
        """The file a Python block is, from its first line (``# mysite/jobs.py``)."""
        found = FILE_BLOCK.match(self.text)
        return found.group(1) if found else None

    def commands(self) -> list[str]:
        """The commands of a console block: its ``$ `` lines, or every line when it has
        none (a block of commands only)."""
        lines = [line for line in self.text.splitlines() if line.strip()]
        prompted = [line[2:] for line in lines if line.startswith("$ ")]
        return prompted or lines

    def transcript(self) -> list[tuple[str, list[str]]]:
        """``(command, output lines)`` of a console block with ``$ `` prompts."""
        pairs: list[tuple[str, list[str]]] = []
        for line in self.text.splitlines():
            if line.startswith("$ "):
                pairs.append((line[2:], []))
            elif pairs:
                pairs[-1][1].append(line)
        return pairs

    def session(self) -> tuple[str | None, list[doctest.Example]]:
        """The command a ``pycon`` block starts with (``$ python manage.py shell``), if
        any, and its ``>>>`` examples."""
        first = self.text.splitlines()[0]
        command = first[2:] if first.startswith("$ ") else None
        return command, doctest.DocTestParser().get_examples(self.text)


@dataclass
class Section:
    title: str
    text: str
    blocks: list[Block] = field(default_factory=list)

    def of(self, lang: str) -> list[Block]:
        return [block for block in self.blocks if block.lang == lang]

    def says(self, *phrases: str) -> None:
        """Fail unless the section's prose says each phrase (whitespace-insensitive): the
        claim the test is about to check must be the page's."""
        flat = " ".join(self.text.split())
        for phrase in phrases:
            assert " ".join(phrase.split()) in flat, f"{self.title!r} no longer says {phrase!r}"


class Page:
    """A Markdown page of docs/, by ``## `` section."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text()
        self.sections: list[Section] = []
        for chunk in re.split(r"^(?=## )", self.text, flags=re.M):
            title = chunk.splitlines()[0].lstrip("# ").strip() if chunk.strip() else ""
            blocks = [
                Block(match.group(2), _dedent(match.group(3), len(match.group(1))))
                for match in FENCE.finditer(chunk)
            ]
            self.sections.append(Section(title, chunk, blocks))

    def section(self, start: str) -> Section:
        """The section whose title starts with ``start``."""
        found = [section for section in self.sections if section.title.startswith(start)]
        assert len(found) == 1, f"{self.path.name}: no single section {start!r}"
        return found[0]


def _dedent(text: str, indent: int) -> str:
    return "".join(line[indent:] if line.strip() else line for line in text.splitlines(True))


def pattern(sample: str) -> str:
    """A regex from a line the docs show: ``…`` stands for anything; a timestamp, a default
    identity and a decimal number (seconds) for any other. Whole numbers (tokens, counts)
    stay as shown."""
    parts = re.split(f"(…|{TIMESTAMP}|{IDENTITY}|\\d+\\.\\d+)", sample)
    out = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            out.append(re.escape(part))
        elif part == "…":
            out.append(".*?")
        elif re.fullmatch(TIMESTAMP, part):
            out.append(TIMESTAMP)
        elif re.fullmatch(IDENTITY, part):
            out.append(IDENTITY)
        else:
            out.append(r"\d+\.\d+")
    return "".join(out)


def check_output(example: doctest.Example, got: str) -> None:
    """``got`` is what ``example`` shows (doctest's rules, ``...`` for anything)."""
    checker = doctest.OutputChecker()
    if not checker.check_output(example.want, got, doctest.ELLIPSIS):
        raise AssertionError(
            checker.output_difference(example, got, doctest.ELLIPSIS)
            + f"(the example: >>> {example.source.strip()})"
        )


# -- services -------------------------------------------------------------------------------
def unreachable(url: str, default_port: int) -> str | None:
    """Why the server of ``url`` does not accept a TCP connection, or None."""
    import socket

    parts = urlparse(url)
    if parts.scheme not in ("http", "https", "redis", "amqp"):
        return None  # a local index (file://): nothing to reach
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc.strerror or exc})"


def package_index() -> str:
    """The index pip installs from here (``PIP_INDEX_URL``, pip's configuration, or PyPI)."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    found = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() if found.returncode == 0 else "https://pypi.org/simple"


# -- a virtualenv and a project -------------------------------------------------------------
def clean_environment(venv: Path) -> dict[str, str]:
    """The environment of a terminal with ``venv`` activated: none of this test run's
    Django, Python, Celery or coverage variables (``DJANGO_SETTINGS_MODULE`` above all)."""
    dropped = ("DJANGO", "PYTHON", "CELERY", "COV_CORE", "COVERAGE", "PYTEST", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``argv`` (its program looked up on ``env``'s PATH, as a shell would) to completion."""
    program = shutil.which(argv[0], path=env["PATH"])
    assert program, f"{argv[0]} not found on the PATH of the virtualenv"
    return subprocess.run(
        [program, *argv[1:]],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def succeed(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{shlex.join(result.args)} exited {result.returncode}\n"
        f"--- stdout:\n{result.stdout[-4000:]}\n--- stderr:\n{result.stderr[-4000:]}"
    )
    return result


class Site:
    """A project made by ``django-admin startproject``, in a directory of its own."""

    def __init__(self, venv: Path, directory: Path, name: str = "mysite") -> None:
        self.venv = venv
        self.env = clean_environment(venv)
        directory.mkdir(parents=True)
        succeed(run(["django-admin", "startproject", name], directory, self.env))
        self.dir = directory / name
        self.name = name
        self.settings = self.dir / name / "settings.py"
        #: The Celery queue of this project's worker and beats, if it has one of its own.
        self.queue = ""
        self.processes: list[CeleryProcess] = []
        self.shells: list[Shell] = []

    def apply(self, block: Block) -> None:
        """Do what a file block says: add a settings block to settings.py (a ``# ...``
        inside ``NAME = [`` stands for what the list already holds), write any other file."""
        path = block.path
        assert path, f"not a file block:\n{block.text}"
        if Path(path).name == "settings.py":
            with self.settings.open("a") as settings:
                settings.write("\n" + _existing_items(block.text))
        else:
            target = self.dir / path
            assert target.parent.is_dir(), f"{path}: no such directory in the project"
            target.write_text(block.text)

    def add_setting(self, text: str) -> None:
        with self.settings.open("a") as settings:
            settings.write("\n" + text + "\n")

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run(shlex.split(command, comments=True), self.dir, self.env, timeout)

    def start(self, label: str, command: str) -> CeleryProcess:
        """``command`` in a terminal of its own (a process group, as a shell's job)."""
        argv = shlex.split(command, comments=True)
        program = shutil.which(argv[0], path=self.env["PATH"])
        assert program, f"{argv[0]} not found on the PATH of the virtualenv"
        process = CeleryProcess(label, [program, *argv[1:]], self.env, self.dir / f"{label}.log")
        self.processes.append(process)
        return process

    def shell(self, label: str, command: str) -> Shell:
        shell = Shell(self, label, command)
        self.shells.append(shell)
        return shell

    def describe(self) -> str:
        return "\n".join(
            f"--- {process!r} log:\n{process.tail(30)}" for process in self.processes
        ) + "".join(
            f"\n--- shell {shell.label} stderr:\n{shell.background()}" for shell in self.shells
        )

    def close(self) -> None:
        for shell in self.shells:
            shell.close()
        for process in reversed(self.processes):
            process.stop(timeout=15)


def _existing_items(text: str) -> str:
    lines, current = [], None
    for line in text.splitlines():
        opened = re.match(r"^(\w+) = \[$", line)
        if opened:
            current = opened.group(1)
        elif line.startswith("]"):
            current = None
        elif current and line.strip() == "# ...":
            line = line.replace("# ...", f"*{current},")
        lines.append(line)
    return "\n".join(lines) + "\n"


class Shell:
    """``python manage.py shell`` in a terminal of its own, typed into one example at a
    time (by ``tests/support/doc_console.py`` inside it). What other threads print, and
    stderr, go to ``<label>.log``."""

    def __init__(self, site: Site, label: str, command: str) -> None:
        self.label = label
        self.log_path = site.dir / f"{label}.log"
        argv = shlex.split(command)
        boot = f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')"
        program = shutil.which(argv[0], path=site.env["PATH"])
        assert program
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [program, *argv[1:], "-c", boot],
                cwd=site.dir,
                env=site.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._answer(STARTUP) == "ready"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARKER):
                self.answers.put(json.loads(line[len(MARKER) :]))
        self.answers.put(None)

    def _answer(self, timeout: float) -> str:
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"shell {self.label}: no answer within {timeout:.0f}s\n{self.background()}"
            ) from None
        if answer is None:
            raise AssertionError(
                f"shell {self.label} exited ({self.proc.wait()}):\n{self.background()}"
            )
        return answer

    def type(self, example: doctest.Example, timeout: float = 60) -> None:
        """Type ``example`` and check that the shell prints what the page shows."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(example.source) + "\n")
        self.proc.stdin.flush()
        check_output(example, self._answer(timeout))

    def background(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_background(self, text: str, timeout: float) -> float:
        """Wait until a thread of the session printed ``text``; returns when it was seen."""

        def seen() -> bool:
            assert self.proc.poll() is None, f"shell {self.label} ended:\n{self.background()}"
            return text in self.background()

        wait_until(seen, timeout=timeout, interval=0.1, message=lambda: (
            f"shell {self.label}: no {text!r}:\n{self.background()}"
        ))  # fmt: skip
        return time.monotonic()

    def kill(self) -> None:
        """``kill -9`` (the process group: the shell and nothing else it started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # end of input: the shell exits
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
