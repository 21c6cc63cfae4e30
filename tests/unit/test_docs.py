"""The documentation covers the public surface of SPEC.md (issue 7's acceptance).

Every public Python name of the contract must be in the API reference page
(``docs/reference.md``), inside the autodoc directive that documents it, so that
``make docs`` renders it (and, with ``-W``, fails if it cannot be imported); settings keys,
management commands and check ids must be in their reference pages. The names are copied
from SPEC.md on purpose: a name removed from these pages, or renamed in the code, fails
here. ``make docs`` builds the pages with warnings as errors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Module-level public names of SPEC.md, with the module that documents them.
PUBLIC_NAMES = {
    "django_leader": [
        "Elector",
        "lock",
        "Lease",
        "current_lease",
        "LeaderError",
        "LeaseHeld",
        "LeadershipLost",
        "BackendUnavailable",
        "NotSupportedError",
    ],
    "django_leader.signals": ["leader_elected", "leader_lost", "lease_released"],
    "django_leader.celery": ["LeaderScheduler", "singleton_task"],
    "django_leader.backends.db": ["DatabaseBackend"],
    "django_leader.backends.cache": ["CacheBackend"],
    "django_leader.testing": ["MemoryBackend", "override_leader", "leader_backend"],
    "django_leader.views": ["has_leader", "leads_here", "metrics"],
    "django_leader.metrics": ["install"],
}

#: Modules SPEC.md and issue 7 name as public, documented with ``automodule``.
PUBLIC_MODULES = [
    "django_leader.signals",
    "django_leader.celery",
    "django_leader.testing",
    "django_leader.urls",
    "django_leader.views",
    "django_leader.metrics",
]

#: Members of the public classes named in SPEC.md.
MEMBERS = {
    "django_leader.Elector": [
        "run",
        "start",
        "stop",
        "is_leader",
        "lease",
        "leader",
        "wait_for_leadership",
        "on_elected",
        "on_lost",
        "on_new_leader",
    ],
    "django_leader.Lease": [
        "name",
        "holder",
        "token",
        "acquired_at",
        "renewed_at",
        "expires_at",
        "transitions",
        "lost",
        "check",
        "fenced",
    ],
}

#: page -> names that must appear in it (SPEC.md's settings, commands, checks).
PAGES = {
    "settings.md": [
        "BACKEND",
        "DATABASE",
        "CACHE",
        "LEASE_TTL",
        "RENEW_INTERVAL",
        "RETRY_INTERVAL",
        "IDENTITY",
        "HISTORY",
        "HISTORY_RETENTION",
        "BEAT_SCHEDULER",
        "ImproperlyConfigured",
    ],
    "commands.md": [
        "runleader",
        "--call",
        "--beat",
        "--ttl",
        "--renew-interval",
        "--retry-interval",
        "--identity",
        "SIGTERM",
        "SIGKILL",
        "leader status",
        "leader history",
        "leader release",
        "leader prune",
        "--json",
        "--limit",
        "--days",
    ],
    "checks.md": ["django_leader.E001", "django_leader.W001"],
    "celery.md": ["LeaderScheduler", "singleton_task", "on_locked", "current_lease"],
    "observability.md": [
        "leader/health/<name>/",
        "leader/health/<name>/here/",
        "leader/metrics/",
        "django_leader_is_leader",
        "django_leader_transitions_total",
        "django_leader_renew_seconds",
        "django_leader_renew_failures_total",
        "django_leader_leaderless_seconds",
    ],
    "testing-helpers.md": ["override_leader", "MemoryBackend", "leader_backend"],
}

DIRECTIVE = re.compile(r"^\.\. (auto\w+):: ([\w.]+)", re.MULTILINE)


def directives(text: str) -> dict[str, tuple[str, set[str]]]:
    """Autodoc directives of a page: target -> (directive, names in its ``:members:``)."""
    found: dict[str, tuple[str, set[str]]] = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = DIRECTIVE.match(line)
        if not match:
            continue
        members: set[str] = set()
        in_members = False
        for option in lines[index + 1 :]:
            if not option.startswith("   ") or not option.strip():
                break
            stripped = option.strip()
            if stripped.startswith(":"):
                in_members = stripped.startswith(":members:")
                if in_members:
                    stripped = stripped[len(":members:") :]
                else:
                    continue
            if in_members:
                members.update(part.strip() for part in stripped.split(",") if part.strip())
        found[match.group(2)] = (match.group(1), members)
    return found


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[str, set[str]]]:
    return directives((DOCS / "reference.md").read_text())


@pytest.mark.parametrize(
    "qualified",
    [f"{module}.{name}" for module, names in PUBLIC_NAMES.items() for name in names],
)
def test_public_name_is_in_the_reference(
    qualified: str, reference: dict[str, tuple[str, set[str]]]
) -> None:
    module, name = qualified.rsplit(".", 1)
    documented = qualified in reference or any(
        target == module and name in members for target, (_, members) in reference.items()
    )
    assert documented, f"{qualified} has no autodoc directive in docs/reference.md"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_module_is_in_the_reference(
    module: str, reference: dict[str, tuple[str, set[str]]]
) -> None:
    assert reference.get(module, ("", set()))[0] == "automodule", (
        f"docs/reference.md has no automodule for {module}"
    )


@pytest.mark.parametrize(
    "qualified", [f"{cls}.{member}" for cls, members in MEMBERS.items() for member in members]
)
def test_public_member_is_in_the_reference(
    qualified: str, reference: dict[str, tuple[str, set[str]]]
) -> None:
    cls, member = qualified.rsplit(".", 1)
    assert cls in reference, f"docs/reference.md has no autodoc directive for {cls}"
    assert member in reference[cls][1], f"{member} is not in the :members: of {cls}"


@pytest.mark.parametrize(
    ("page", "name"), [(page, name) for page, names in PAGES.items() for name in names]
)
def test_reference_page_names_it(page: str, name: str) -> None:
    assert name in (DOCS / page).read_text(), f"docs/{page} does not mention {name}"


def test_reference_targets_import() -> None:
    """Each autodoc target of the reference page imports (the build would fail later)."""
    import importlib

    for target, (directive, _) in directives((DOCS / "reference.md").read_text()).items():
        if directive == "automodule":
            importlib.import_module(target)
            continue
        module, _, attribute = target.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), target
