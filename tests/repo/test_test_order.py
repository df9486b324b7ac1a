"""The order pytest-xdist hands out the test modules (tests/conftest.py LONGEST_FIRST, longest_first): the listed
long modules first, in their order, then the others with the most tests first; each module's tests together and in
their order; and the Makefile keeps xdist from re-sorting them (--no-loadscope-reorder) and from replacing a crashed
worker (--max-worker-restart 0)."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from tests.conftest import LONGEST_FIRST, ROOT, longest_first


def fake(nodeid: str) -> Any:
    return SimpleNamespace(nodeid=nodeid)


def test_each_longest_first_entry_is_a_test_module_once() -> None:
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST), LONGEST_FIRST
    for module in LONGEST_FIRST:
        path = ROOT / module
        assert path.is_file() and path.name.startswith("test_") and path.suffix == ".py", f"{module}: no such test module"


def test_long_modules_go_first_then_the_most_tests_and_each_module_stays_whole() -> None:
    first, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    collected = [
        "tests/core/test_a.py::test_1",
        f"{second}::test_x",
        "tests/core/test_b.py::test_1",
        "tests/core/test_b.py::test_2[p]",
        "tests/core/test_a.py::test_2",
        f"{first}::test_y",
        "tests/core/test_b.py::test_3",
        f"{second}::test_w",
    ]
    items = [fake(n) for n in collected]
    longest_first(items)
    assert [i.nodeid for i in items] == [
        f"{first}::test_y",
        f"{second}::test_x",
        f"{second}::test_w",
        "tests/core/test_b.py::test_1",
        "tests/core/test_b.py::test_2[p]",
        "tests/core/test_b.py::test_3",
        "tests/core/test_a.py::test_1",
        "tests/core/test_a.py::test_2",
    ]


def test_the_makefile_keeps_xdist_from_reordering() -> None:
    found = re.search(r"^XDIST\s*=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "Makefile: no XDIST line"
    flags = found.group(1).split()
    assert "--no-loadscope-reorder" in flags and flags[flags.index("--dist") + 1] == "loadfile", flags
    # a crashed worker ends the run (its replacement would hang: xdist loadscope.py remove_node re-queues finished work)
    assert flags[flags.index("--max-worker-restart") + 1] == "0", flags
