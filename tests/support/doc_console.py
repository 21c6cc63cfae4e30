"""The keyboard of a documented ``python manage.py shell`` session
(``tests/processes/test_tutorial.py``).

Run inside the shell of a fresh project, ``python manage.py shell -c "import runpy;
runpy.run_path('<this file>', run_name='__main__')"``, with nothing but the standard
library: it must not import the test suite. It reads one JSON string per line on stdin, the
source of one statement of a ``>>>`` example, runs it as the interactive interpreter does
(compiled in ``"single"`` mode: the value of an expression is printed) in one namespace
for the whole session, and answers one line on stdout: :data:`MARKER` and a JSON string
with what the statement printed, a traceback included if it raised.

What other threads print while the session goes on (an ``Elector``'s work, say) is not the
statement's output: it goes to stderr at once, where the test waits for it.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from io import StringIO
from typing import Any, TextIO

MARKER = "\x1edoc-console "


class Router:
    """``sys.stdout`` of the session: the statement's thread writes to its capture, any
    other thread straight to stderr."""

    def __init__(self, background: TextIO) -> None:
        self.main = threading.get_ident()
        self.capture = StringIO()
        self.background = background

    def write(self, text: str) -> int:
        if threading.get_ident() == self.main:
            return self.capture.write(text)
        written = self.background.write(text)
        self.background.flush()
        return written

    def flush(self) -> None:
        self.background.flush()

    def take(self) -> str:
        text = self.capture.getvalue()
        self.capture = StringIO()
        return text


def run(source: str, namespace: dict[str, Any], out: Router) -> str:
    try:
        exec(compile(source, "<stdin>", "single"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        out.write("Traceback (most recent call last):\n")
        out.write("".join(traceback.format_exception_only(type(exc), exc)))
    return out.take()


def main() -> None:
    protocol = sys.__stdout__
    assert protocol is not None
    router = Router(sys.stderr)
    sys.stdout = router
    namespace: dict[str, Any] = {"__name__": "__console__", "__builtins__": __builtins__}
    protocol.write(MARKER + json.dumps("ready") + "\n")
    protocol.flush()
    for line in sys.stdin:
        output = run(json.loads(line), namespace, router)
        protocol.write(MARKER + json.dumps(output) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
