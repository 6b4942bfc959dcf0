"""Table creation racing another process's creation (kdq.spark.tables._retrying)."""

from __future__ import annotations

import pytest

from kdq.spark import tables


class Flaky:
    def __init__(self, failures: list[str]) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.failures:
            raise RuntimeError(self.failures.pop(0))


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(tables.time, "sleep", lambda _seconds: None)


@pytest.mark.parametrize(
    "message",
    [
        "[DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION] Cannot create table ('x'). The associated location is not empty",
        "io.delta.exceptions.ConcurrentAppendException: Files were added",
        "[TABLE_OR_VIEW_ALREADY_EXISTS] table kdq.window_counts already exists",
    ],
)
def test_a_creation_race_is_retried_until_the_winner_is_visible(message):
    action = Flaky([message, message])
    tables._retrying(action)
    assert action.calls == 3


def test_any_other_error_is_raised_at_once():
    action = Flaky(["[DELTA_INVALID_CHARACTERS_IN_COLUMN_NAME] bad column"])
    with pytest.raises(RuntimeError, match="INVALID_CHARACTERS"):
        tables._retrying(action)
    assert action.calls == 1


def test_a_race_that_never_ends_fails_after_the_last_attempt():
    action = Flaky(["DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION"] * 10)
    with pytest.raises(RuntimeError, match="NON_EMPTY_LOCATION"):
        tables._retrying(action, attempts=4)
    assert action.calls == 4
