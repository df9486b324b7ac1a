"""The enumeration the page tests rely on (tests/inpod/home/numbers.py): a number the page shows without a check fails,
so does a digit outside any marked value, and a marked value that is not the truth."""

from __future__ import annotations

from inpod.home.page import num
from tests.inpod.home.numbers import check, shown

PAGE = f'<div id="live"><p>{num("ssh:p-0", 2)} SSH, {num("ranks:p-0", 1)} ml-dev</p><svg><text>100</text></svg></div>'


def test_every_number_checked_and_true_passes() -> None:
    values, stray = shown(PAGE)
    assert (values, stray) == ({"ssh:p-0": ["2"], "ranks:p-0": ["1"]}, [])
    assert check(values, stray, {"ssh:p-0": "2", "ranks:p-0": "1"}) == []


def test_a_new_number_without_a_check_fails() -> None:
    values, stray = shown(PAGE)
    assert check(values, stray, {"ssh:p-0": "2"}) == [
        "values shown that the test does not check (add each to its ground truth): ['ranks:p-0']"
    ]


def test_a_digit_outside_a_marked_value_fails() -> None:
    values, stray = shown(PAGE.replace("</p>", " since 17:22</p>"))
    assert check(values, stray, {"ssh:p-0": "2", "ranks:p-0": "1"}) == ["numbers outside any marked value: ['17:22']"]


def test_a_value_that_is_not_the_truth_fails() -> None:
    values, stray = shown(PAGE)
    assert check(values, stray, {"ssh:p-0": "1", "ranks:p-0": "1"}) == ["ssh:p-0: shown ['2'], expected '1'"]
