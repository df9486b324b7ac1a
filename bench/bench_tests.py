"""How long the suite takes: `make test-fast` and `make test`, each run --runs times (default 3), the median wall
time with its spread (min–max), and pytest's 20 slowest tests of the last run (--durations=20).

    python -m bench.bench_tests                     # both targets, 3 runs each
    python -m bench.bench_tests --target test-fast --runs 1

A benchmark, not a test: it prints numbers and fails only when a run fails. CONTRIBUTING.md records its figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("test-fast", "test")


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float

    def line(self, target: str, runs: int) -> str:
        return f"make {target}: median {self.median:.0f} s over {runs} run(s), spread {self.low:.0f}–{self.high:.0f} s"


def summarize(times: list[float]) -> Summary:
    if not times:
        raise ValueError("no runs to summarize")
    return Summary(statistics.median(times), min(times), max(times))


def slowest(output: str) -> str:
    """pytest's `slowest N durations` section of a run's output ('' when the run printed none)."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))
    return "\n".join(lines[start:end]).rstrip()


def run_once(target: str) -> tuple[float, str]:
    # as from a shell in the checkout: no flags of the make that runs this benchmark (`make bench-tests` passes them
    # down; with them, and with -C, a make started by a test prints "Entering directory" lines into what it reads)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    started = time.monotonic()
    proc = subprocess.run(["make", target, "PYTEST_ARGS=--durations=20"], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"make {target} failed (exit {proc.returncode}) after {took:.0f} s")
    return took, proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, action="append", help="a make target (default: both)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs; {args.runs} run(s) per target", flush=True)
    for target in args.target or TARGETS:
        times: list[float] = []
        output = ""
        for i in range(args.runs):
            took, output = run_once(target)
            times.append(took)
            print(f"make {target} run {i + 1}: {took:.0f} s", flush=True)
        print(summarize(times).line(target, args.runs))
        print(slowest(output) or "(no durations section)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
