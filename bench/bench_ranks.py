"""`make bench-ranks`: warm ranks (`ml-dev ranks`) against a full relaunch, on simulated pods (barcelona's render, real
sshd; needs root). Not a test: it prints numbers.

On PODS pods (default 4), one rank each, every rank joined in the stand-in process group of the warm-rank tests
(tests/podsim/warmgroup.py GROUP: an all-reduce rank 0 serves on MASTER_ADDR:MASTER_PORT), TRIALS times each:

* round trip, no compute: a cell `pass` on every rank, from a client that stays (a notebook kernel's `%%ranks`: a Python
  on pod 0 calling ranks.run_cell in a loop) and from a terminal (`ml-dev ranks exec -c pass`, a new process each time);
* edited step, warm: a cell defining a training step anew (a changed constant, as an edit) and running it once: one
  all-reduce and STEP seconds of compute; the cost above the step's own compute is the wall time minus STEP;
* edited step, relaunched: the same step in a file of the synced tree, edited (so the tree differs on every other pod),
  then `ml-dev run --per-pod -- python3 train.py`: sync, rank start, interpreter, imports, the process group, the step.

Every command is timed inside pod 0 (its shell's clock around it). Prints one line per trial, then the medians and
maxima.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from tests.podsim.idlestop import no_dev_servers
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.podsim.warmgroup import GROUP

PROJECT = "/workspace/bench-ranks"
TRAIN = """import group, step
step.step(group.Group())
"""
STEP = """import time
EDIT = {edit}
def step(g):
    total = g.all_reduce(EDIT)
    time.sleep({compute})
    return total
"""
CLIENT = r"""
import json, sys, time
from inpod.ml_dev import ranks
times = []
for _ in range(int(sys.argv[1])):
    began = time.monotonic()
    end = ranks.run_cell("pass", None, lambda msg: None)
    assert end.get("state") == "ok", end
    times.append(time.monotonic() - began)
print(json.dumps(times))
"""


def timed(sim: PodSim, cmd: str) -> tuple[float, str]:
    """`cmd` in pod 0's shell, timed there (the simulation's own entry into the pod is not counted)."""
    wrapped = f's=$(date +%s%N); {cmd} >/tmp/bench-out 2>&1; rc=$?; e=$(date +%s%N); cat /tmp/bench-out; echo "TOOK $((e - s)) $rc"'
    res = sim.exec(0, wrapped, cwd=PROJECT, timeout=300)
    last = (res.stdout.splitlines() or ["TOOK 0 1"])[-1].split()
    if res.returncode != 0 or last[0] != "TOOK" or last[2] != "0":
        raise RuntimeError(f"{cmd}: failed\n{res.stdout}\n{res.stderr}")
    return int(last[1]) / 1e9, res.stdout


def report(name: str, times: list[float], minus: float = 0.0) -> None:
    above = f"; above the compute: median {statistics.median(times) - minus:.3f} s, max {max(times) - minus:.3f} s" if minus else ""
    print(f"== {name}: median {statistics.median(times):.3f} s, max {max(times):.3f} s, {len(times)} runs{above}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--step", type=float, default=0.5, help="the step's compute, seconds (a sleep)")
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        print(f"bench-ranks: cannot simulate pods here: {why}", file=sys.stderr)
        return 2

    def objects(o: dict[str, Any]) -> None:
        no_dev_servers(o)
        o["nodes"] = {**o["nodes"], "count": args.pods, "gpusPerPod": 1}

    sim = PodSim(render_stack("barcelona", objects), count=args.pods)
    try:
        sim.start()
        sim.write(0, f"{PROJECT}/group.py", GROUP)
        sim.write(0, f"{PROJECT}/train.py", TRAIN)
        relaunch = []
        for k in range(args.trials):
            sim.write(0, f"{PROJECT}/step.py", STEP.format(edit=k + 1, compute=args.step))
            took, _ = timed(sim, "ml-dev run --per-pod -- python3 train.py")
            relaunch.append(took)
            print(f"relaunch {k + 1}/{args.trials}: {took:.3f} s", flush=True)
        took, _ = timed(sim, "ml-dev ranks start --nproc-per-node 1")
        print(f"ranks start: {took:.3f} s", flush=True)
        try:
            timed(sim, "ml-dev ranks exec -c 'import group; g = group.Group()'")
            res = sim.exec(0, ["python3", "-c", CLIENT, str(args.trials)], env={"PYTHONPATH": "/opt/ml-dev-env"}, timeout=300)
            if res.returncode != 0:
                raise RuntimeError(f"the staying client: {res.stdout}\n{res.stderr}")
            kernel = [float(t) for t in json.loads(res.stdout.splitlines()[-1])]
            terminal, warm = [], []
            for k in range(args.trials):
                terminal.append(timed(sim, "ml-dev ranks exec -c pass")[0])
                cell = STEP.format(edit=k + 100, compute=args.step) + "step(g)\n"
                sim.write(0, "/tmp/bench-step.py", cell)
                warm.append(timed(sim, "ml-dev ranks exec -f /tmp/bench-step.py")[0])
                print(
                    f"trial {k + 1}/{args.trials}: round trip {kernel[k]:.3f} s (staying client), "
                    f"{terminal[k]:.3f} s (ranks exec); edited step {warm[k]:.3f} s warm, {relaunch[k]:.3f} s relaunched",
                    flush=True,
                )
        finally:
            timed(sim, "ml-dev ranks stop")
        print(f"== {args.pods} pods, 1 rank each, step compute {args.step} s", flush=True)
        report("round trip, no compute, staying client (%%ranks)", kernel)
        report("round trip, no compute, ml-dev ranks exec", terminal)
        report("edited step, warm (ml-dev ranks exec -f)", warm, args.step)
        report("edited step, full relaunch (ml-dev run)", relaunch, args.step)
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
