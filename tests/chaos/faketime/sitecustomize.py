"""Imported at start-up by every Python process of a chaos run under libfaketime (the
harness puts this directory first on ``PYTHONPATH`` with ``--clocks``): candidates,
``manage.py runleader``, its guard and its payload.

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails ``clock_nanosleep()`` on
``CLOCK_MONOTONIC`` with ``TIMER_ABSTIME`` (EINVAL), which is how Python >= 3.11 sleeps:
every ``time.sleep()`` would raise ``OSError(22)``. The same wait through ``select()``
(which retries with the time left after a signal, PEP 475): a defect of the tool, not a
change of what is measured. (``tests/procs/clock_candidate.py`` does the same.)
"""

from __future__ import annotations

import os
import select
import time
from typing import SupportsIndex

if "faketime" in os.environ.get("LD_PRELOAD", ""):

    def _sleep(seconds: float | SupportsIndex) -> None:
        select.select([], [], [], max(0.0, float(seconds)))

    time.sleep = _sleep
