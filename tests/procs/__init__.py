"""Programs that ``tests/processes/test_multiprocess.py`` runs as child processes.

Each one is run as ``python -m tests.procs.<name>`` with the repository root on
``PYTHONPATH``, reads JSON commands from stdin and reports JSON events on stdout (one per
line, flushed, stamped with ``time.time()`` and ``time.monotonic()``). See :mod:`.common`.
"""
