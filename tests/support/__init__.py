"""Support code of the test suite: the stores under test and helpers for them
(``stores``), a backend with injected faults (``faults``), the toy backend of
docs/howto/write-a-backend.md (``toy_backend``), waiting for something with a deadline
(``waiting``). Fixtures stay in ``tests/conftest.py``."""
