"""bench/bench_tests.py's report: median and spread of the runs, and pytest's slowest-durations section."""

from __future__ import annotations

import pytest

from bench.bench_tests import Summary, slowest, summarize

OUTPUT = """\
........                                                                 [100%]
============================= slowest 20 durations =============================
12.01s call     tests/podsim/test_pods.py::test_pods_start
3.50s setup    tests/components/test_gpu_cluster.py::test_render
(18 durations < 0.005s hidden.  Use -vv to show these durations.)
=========================== short test summary info ============================
8 passed in 20.00s
"""


def test_median_and_spread() -> None:
    assert summarize([300.0, 240.0, 250.0]) == Summary(250.0, 240.0, 300.0)
    assert summarize([200.0, 210.0]).line("test-fast", 2) == "make test-fast: median 205 s over 2 run(s), spread 200–210 s"
    with pytest.raises(ValueError):
        summarize([])


def test_the_slowest_section_is_cut_from_the_output() -> None:
    section = slowest(OUTPUT)
    assert section.splitlines()[0].startswith("=") and "slowest 20 durations" in section
    assert "12.01s call" in section and "3.50s setup" in section and "short test summary" not in section
    assert slowest("8 passed in 1.00s\n") == ""
