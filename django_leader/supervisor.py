"""The former name of :mod:`django_leader.guard`, run by path.

A ``runleader`` started before an upgrade still launches ``.../supervisor.py`` for its next
term; this file runs the guard for it. New code uses ``guard.py``. Standard library only.
"""

import os
import runpy

if __name__ == "__main__":
    runpy.run_path(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py"), run_name="__main__"
    )
