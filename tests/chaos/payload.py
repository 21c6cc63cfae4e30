"""The payload of a chaos run's ``manage.py runleader NAME -- python -m tests.chaos.payload``.

Standard library only. It runs only while its runleader leads (that is what is tested), so
every line it logs is an act: ``elected`` first, then ``act`` every :data:`ACT_EVERY`
seconds with ``DJANGO_LEADER_TOKEN``, as ``who`` = ``DJANGO_LEADER_HOLDER`` (its runleader's
identity), to ``CHAOS_LOG_DIR/<holder>.payload-<pid>.jsonl``. ``ppid`` is its guard.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

ACT_EVERY = 0.05


def clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def main() -> None:
    who = os.environ["DJANGO_LEADER_HOLDER"]
    token = int(os.environ["DJANGO_LEADER_TOKEN"])
    path = os.path.join(os.environ["CHAOS_LOG_DIR"], f"{who}.payload-{os.getpid()}.jsonl")
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def log(ev: str, **fields: Any) -> None:
        record = {"ev": ev, "t": clock(), "who": who, "pid": os.getpid(),
                  "ppid": os.getppid(), "role": "payload", "token": token, **fields}  # fmt: skip
        out.write(json.dumps(record) + "\n")

    def on_term(signum: int, frame: Any) -> None:
        log("stepped_down", reason="SIGTERM")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    log("elected")
    while True:
        log("act")
        time.sleep(ACT_EVERY)


if __name__ == "__main__":
    main()
