"""Electors started by a test and stopped after it: the ``electors`` fixture of
``tests/components/conftest.py`` collects them, :func:`start` starts one."""

from __future__ import annotations

from typing import Any

from django_leader import Elector

#: A generous bound for anything that should happen "soon".
WAIT = 10.0


def start(electors: list[Elector], elector: Elector, work: Any = None) -> Elector:
    """Start ``elector`` (with ``work``) and have the test's ``electors`` stop it after."""
    electors.append(elector)
    elector.start(work)
    return elector
