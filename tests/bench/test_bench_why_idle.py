"""bench/bench_why_idle.py's closing line: both medians with their spread, so an idle cost is read against the noise."""

from __future__ import annotations

import re

from bench.bench_why_idle import spread, verdict

PAIR = re.compile(r"^pair \d+/\d+ ([AB]): ([\d.]+) s$")


def test_spread_names_median_range_and_quartiles() -> None:
    # quartiles at (n + 1)/4 and 3(n + 1)/4 of the sorted runs (1.5th and 4.5th of 5), interpolated
    assert spread([0.9, 0.5, 0.6, 0.7, 0.8]) == "0.700 s (min 0.500, max 0.900, IQR 0.550–0.850)"
    assert spread([0.25]) == "0.250 s (min 0.250, max 0.250)"  # one run: no quartiles


def test_verdict_line_of_a_run_log() -> None:
    """The runs of a log as the benchmark prints them (pair lines, A and B interleaved) give one closing line."""
    log = ["pair 1/3 A: 0.600 s", "pair 1/3 B: 0.650 s", "pair 2/3 B: 0.700 s", "pair 2/3 A: 0.500 s", "pair 3/3 A: 0.620 s"]
    log += ["pair 3/3 B: 0.600 s"]
    runs: dict[str, list[float]] = {"A": [], "B": []}
    for line in log:
        m = PAIR.match(line)
        assert m
        runs[m[1]].append(float(m[2]))
    line = verdict(runs, 200 * 10**6)
    assert line.startswith("== unchanged tree, 200 MB: median A 0.600 s (min 0.500, max 0.620, IQR ")
    assert ", B 0.650 s (min 0.600, max 0.700, IQR " in line
    assert line.endswith("B - A +0.050 s (n=3 each; B slower in 2 of 3 pairs)")
