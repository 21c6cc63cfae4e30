"""wait_until(), the suite's one way to wait for something it can only look at."""

from __future__ import annotations

import time

import pytest

from tests.support.waiting import wait_until


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, "", ["found"]])
    assert wait_until(lambda: next(answers), timeout=5, interval=0.001) == ["found"]


def test_fails_at_the_deadline_with_the_message_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: [], timeout=0.2, interval=0.01, message="nobody came")
    assert time.monotonic() - started >= 0.2
    assert "nobody came" in str(failed.value)
    assert "not within 0.2 s; last value: []" in str(failed.value)


def test_a_callable_message_describes_the_state_at_the_deadline() -> None:
    calls: list[int] = []

    def poll() -> bool:
        calls.append(len(calls))
        return False

    with pytest.raises(AssertionError, match=r"polled \d+ times"):
        wait_until(poll, timeout=0.1, interval=0.01, message=lambda: f"polled {len(calls)} times")
    assert len(calls) >= 2  # polled again, not only once


def test_an_error_in_the_predicate_is_not_swallowed() -> None:
    def broken() -> bool:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        wait_until(broken, timeout=5)
