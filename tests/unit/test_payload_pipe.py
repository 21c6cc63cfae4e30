"""runleader's pipe to the guard, when the guard exits while a write is under way."""

from __future__ import annotations

import os

import pytest

from django_leader.payload import close_pipe


def test_closing_the_pipe_to_a_guard_that_is_gone_does_not_raise() -> None:
    """The write that met the guard's exit stays in the buffer; a bare ``close()`` flushes
    it again and raises BrokenPipeError, which ended runleader's payload loop as if the
    work had raised (seen: "payload stopped" never logged after a SIGTERM)."""
    read_end, write_end = os.pipe()
    pipe = os.fdopen(write_end, "wb")
    os.close(read_end)  # the guard is gone
    pipe.write(b"T\n")
    with pytest.raises(BrokenPipeError):
        pipe.flush()
    close_pipe(pipe)
    assert pipe.closed
    with pytest.raises(OSError):
        os.fstat(write_end)  # the descriptor is released, not leaked


def test_a_bare_close_would_raise() -> None:
    """What close_pipe() is for: the state above makes ``close()`` itself raise."""
    read_end, write_end = os.pipe()
    pipe = os.fdopen(write_end, "wb")
    os.close(read_end)
    pipe.write(b"T\n")
    with pytest.raises(BrokenPipeError):
        pipe.flush()
    with pytest.raises(BrokenPipeError):
        pipe.close()
    assert pipe.closed
