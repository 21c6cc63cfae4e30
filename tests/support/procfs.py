"""A process's (or thread's) state letter from /proc: ``T`` stopped, ``Z`` a zombie."""

from __future__ import annotations

from pathlib import Path


def state(stat: str | Path) -> str:
    """The state letter in ``stat`` (``/proc/PID/stat`` or ``/proc/PID/task/TID/stat``),
    or ``gone`` when the process or thread no longer exists."""
    try:
        text = Path(stat).read_text()
    except OSError:
        return "gone"
    # The command name, in parentheses, may hold spaces and parentheses itself.
    return text.rsplit(")", 1)[1].split()[0]
