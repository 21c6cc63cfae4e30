"""Every interactive example of the pages can be pasted into a shell as shown: a compound
statement (``def``, ``with``, ``for``…) continued on ``...`` lines and followed by another
``>>>`` statement is ended by an empty line (or an empty ``...`` line, which ruff's
formatter removes), which is what ends the block at Python's prompt. Without it, the next
statement pasted is taken as part of the block: a ``SyntaxError`` (issue 28, item 5: the
tutorial's ``def work`` did that)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PYCON = re.compile(r"^```pycon\n(.*?)^```", re.M | re.S)


def unterminated(block: str) -> list[str]:
    """The first line of each compound statement of ``block`` that the next statement
    follows at once (no empty line, no empty ``...`` line between them)."""
    found, opened = [], None
    for line in block.splitlines():
        if opened is not None and not line.startswith("... "):
            if line.startswith(">>> "):
                found.append(opened)
            opened = None
        if line.startswith(">>> ") and line.rstrip().endswith(":"):
            opened = line
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_compound_example_ends_with_an_empty_continuation_line(page: Path) -> None:
    blocks = PYCON.findall(page.read_text())
    bad = [line for block in blocks for line in unterminated(block)]
    assert not bad, f"{page.name}: paste these and the next line joins the block: {bad}"


def test_the_rule_catches_the_tutorials_old_example() -> None:
    old = '>>> def work(lease):\n...     pass\n>>> elector = Elector("tutorial")\n'
    assert unterminated(old) == [">>> def work(lease):"]
    assert unterminated(old.replace("pass\n", "pass\n...\n")) == []
    assert unterminated(old.replace("pass\n", "pass\n\n")) == []
    assert unterminated(">>> with lock():\n...     print(1)\n1\n") == []  # its output
