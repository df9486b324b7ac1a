"""tools/mock_engine.py's render cache: one run of the program per stack, config and secrets while the suite has it
on; each caller gets its own deep copy; other inputs, `uncached()` and the cache turned off run the program again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PLACEHOLDER_SECRETS, stack_objects
from tools import mock_engine


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stacks the program really ran for (the cache is on: this test turns it on itself, as the suite does)."""
    ran: list[str] = []
    real = mock_engine._run_program

    def run(stack: str, *args: Any) -> mock_engine.RunResult:
        ran.append(stack)
        return real(stack, *args)

    monkeypatch.setattr(mock_engine, "_run_program", run)
    monkeypatch.setattr(mock_engine, "_renders", {})  # none of the suite's renders: this test's own
    mock_engine.cache_renders(True)
    return ran


SECRETS = dict(PLACEHOLDER_SECRETS)


def config(stack: str, **changes: Any) -> dict[str, Any]:
    objects = {**stack_objects(stack), **changes}
    return {f"ml-dev-env:{k}": v for k, v in objects.items()}


def test_one_run_per_input_each_caller_gets_a_copy(counted: list[str]) -> None:
    first = mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    second = mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    assert counted == ["barcelona"] and first.error is None
    assert first is not second and first.resources is not second.resources
    assert [r.name for r in first.resources] == [r.name for r in second.resources] and first.outputs == second.outputs
    first.resources.clear()
    first.outputs.clear()
    third = mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    assert third.resources and third.outputs, "a caller's changes do not reach the next caller"


def test_other_inputs_run_the_program_again(counted: list[str]) -> None:
    mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    mock_engine.run_program("barcelona", config("barcelona"), {**SECRETS, "hfToken": "other"})
    mock_engine.run_program("barcelona", config("barcelona", network={"mode": "tcp"}), SECRETS)
    assert counted == ["barcelona"] * 3


def test_uncached_and_off_run_the_program(counted: list[str]) -> None:
    mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    with mock_engine.uncached():
        mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    mock_engine.cache_renders(False)
    mock_engine.run_program("barcelona", config("barcelona"), SECRETS)
    assert counted == ["barcelona"] * 3


def test_a_test_using_monkeypatch_renders_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py turns the cache off for a test that patches (its renders would not be the program's)."""
    assert mock_engine._cache is None
