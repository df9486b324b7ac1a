"""`make bench-why`: does `ml-dev why` name the stalled rank, and how fast, on 4 simulated pods (nerc-production's
render, real sshd and py-spy; needs root).

Trials (TRIALS each, default 10), each a fresh `ml-dev run` of the barrier job of the tests
(tests/inpod/ml_dev/data/barrier_job.py):

* stalled: one rank, chosen at random, sleeps in `stall_here` before round 2; once every rank printed round 1,
  `ml-dev why` runs on another pod. Right when it names that rank and its pod; timed from the command's start to its
  end (the issue's bar: within 10 s).
* healthy: no stall; `ml-dev why` once the job runs. Right when it says "no straggler".
* watchdog: the stall of the first case under `lifecycle.stallVerdictSeconds: 10`; timed from the last output line
  to the watchdog's verdict line (the bar: within the set time + 10 s).

Prints one line per trial and the tally (right/total, median and max time). Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from inpod import contract
from tests.conftest import run_objects, stack_objects
from tests.podsim.pods import PodSim, missing_requirements

ROOT = Path(__file__).resolve().parent.parent
JOB = (ROOT / "tests" / "inpod" / "ml_dev" / "data" / "barrier_job.py").read_text()
JOB_DIR = "/tmp/why-job"
COUNT = 4
STALL = contract.STALL_MIN


def start(sim: PodSim, args: str) -> subprocess.Popen[str]:
    return sim.popen(0, f"cd {JOB_DIR} && exec ml-dev run --no-sync -- python3 barrier_job.py {args}")


def until_round(proc: subprocess.Popen[str], round_no: int, timeout: float = 90) -> float:
    """Read output until every rank printed round `round_no`; the time of the last line."""
    assert proc.stdout is not None
    want = {f"round {round_no} rank {r}" for r in range(COUNT)}
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while not want <= seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the job did not reach its round")
        line = proc.stdout.readline()
        last = time.monotonic()
        seen.add(line.split("] ", 1)[-1].strip())
    return last


def stop(sim: PodSim, proc: subprocess.Popen[str]) -> None:
    sim.interrupt(proc)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)


def stalled_trial(sim: PodSim, k: int) -> tuple[bool, float, str]:
    rank = random.randrange(COUNT)
    proc = start(sim, f"--stall {rank} --round 2")
    try:
        until_round(proc, 1)
        time.sleep(1)
        began = time.monotonic()
        res = sim.exec(1 if rank != 1 else 2, "ml-dev why", timeout=120)
        took = time.monotonic() - began
    finally:
        stop(sim, proc)
    first = (res.stdout.splitlines() or [""])[0]
    right = res.returncode == 3 and first.startswith(f"ml-dev why: rank {rank} ({sim.pods[rank].name}")
    return right, took, f"stalled rank {rank}: {first[:150]}"


def healthy_trial(sim: PodSim, k: int) -> tuple[bool, float, str]:
    proc = start(sim, "--work 0.3")
    try:
        until_round(proc, 1)
        began = time.monotonic()
        res = sim.exec(2, "ml-dev why", timeout=120)
        took = time.monotonic() - began
    finally:
        stop(sim, proc)
    first = (res.stdout.splitlines() or [""])[0]
    return res.returncode == 0 and "no straggler" in first, took, first[:150]


def watchdog_trial(sim: PodSim, k: int) -> tuple[bool, float, str]:
    rank = random.randrange(COUNT)
    proc = start(sim, f"--stall {rank} --round 2")
    assert proc.stdout is not None
    try:
        last = until_round(proc, 1)
        deadline = time.monotonic() + STALL + 60
        line = ""
        while not line.startswith("ml-dev why: ") and time.monotonic() < deadline:
            line = proc.stdout.readline()
        took = time.monotonic() - last
    finally:
        stop(sim, proc)
    right = line.startswith(f"ml-dev why: rank {rank} ({sim.pods[rank].name}")
    return right, took, f"stalled rank {rank}: {line.strip()[:150]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        print(f"bench-why: cannot simulate pods here: {why}", file=sys.stderr)
        return 2
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        print("bench-why: py-spy of the dev lock is not installed (make venv)", file=sys.stderr)
        return 2
    objects: dict[str, Any] = stack_objects("nerc-production")
    objects["access"] = {**objects["access"], "vscode": False, "jupyter": False, "tensorboard": False}
    objects["nodes"] = {**objects["nodes"], "count": COUNT, "gpusPerPod": 1}
    objects.setdefault("lifecycle", {})["stallVerdictSeconds"] = STALL
    result = run_objects("nerc-production", objects)
    if result.error:
        raise SystemExit(f"render failed: {result.error}")
    sim = PodSim(result, image_programs={"/usr/local/bin/py-spy": f'#!/bin/sh\nexec {py_spy} "$@"\n'})
    try:
        sim.start()
        for i in range(COUNT):
            sim.write(i, f"{JOB_DIR}/barrier_job.py", JOB)
        bars = {"stalled": 10.0, "healthy": 10.0, "watchdog": STALL + 10.0}
        for name, trial in (("stalled", stalled_trial), ("healthy", healthy_trial), ("watchdog", watchdog_trial)):
            rights, times = 0, []
            for k in range(args.trials):
                right, took, what = trial(sim, k)
                rights += right
                times.append(took)
                print(f"{name} {k + 1}/{args.trials}: {'right' if right else 'WRONG'} in {took:.1f} s  {what}", flush=True)
            within = sum(t <= bars[name] for t in times)
            print(
                f"== {name}: right {rights}/{args.trials}, within {bars[name]:.0f} s {within}/{args.trials}, "
                f"median {statistics.median(times):.1f} s, max {max(times):.1f} s",
                flush=True,
            )
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
