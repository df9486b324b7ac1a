"""`make bench-why-idle`: what `ml-dev why`'s additions to `ml-dev run` (run id, progress relay, watchdog, Flight
Recorder paths) cost a launch when nothing stalls: `make bench-launch`'s "unchanged" case, A/B on one set of pods.

4 simulated pods from nerc-production's render (as bench-launch: 2 GPUs each, a per-pod workspace, a SIZE tree in a git
work tree on pod 0; root). A is `main`'s shipped programs, B this work tree's: the startup ConfigMap is swapped between
them before each run (the kubelet's atomic update, tests/podsim), A and B interleaved so both see the same load. A's
ConfigMap keeps B's extra modules (never imported by A's launcher) because the rendered volume lists them.

Prints every run, and for A and B the median with its spread (min–max, interquartile range: the middle half of the
runs); B's median minus A's is the idle cost (the issue's bar: at most 0.05 s), to be read against the spread. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import inpod
from bench.bench_launch import PROGRAM, WORKSPACE, one_run, parse_size
from tests.conftest import run_objects, stack_objects
from tests.podsim.pods import PodSim, missing_requirements

ROOT = Path(__file__).resolve().parent.parent


def shipped_at(ref: str, current: dict[str, str]) -> dict[str, str]:
    """The startup ConfigMap's data with every shipped file as `ref` has it (files `ref` lacks keep this tree's text)."""
    by_key = {s.key: s for s in inpod.SHIPPED}
    out = dict(current)
    for key in current:
        if key not in by_key:
            continue
        res = subprocess.run(
            ["git", "show", f"{ref}:inpod/{by_key[key].source}"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        if res.returncode == 0:
            out[key] = res.stdout
    return out


def spread(runs: list[float]) -> str:
    """One variant's runs in words: median, min–max and the interquartile range (statistics.quantiles' default method)."""
    text = f"{statistics.median(runs):.3f} s (min {min(runs):.3f}, max {max(runs):.3f}"
    if len(runs) >= 2:
        q1, _, q3 = statistics.quantiles(runs, n=4)
        text += f", IQR {q1:.3f}–{q3:.3f}"
    return text + ")"


def verdict(runs: dict[str, list[float]], size: int) -> str:
    """The closing line: both medians with their spread, B − A, and in how many pairs B was the slower."""
    a, b = statistics.median(runs["A"]), statistics.median(runs["B"])
    slower = sum(1 for x, y in zip(runs["A"], runs["B"], strict=True) if y > x)
    return (
        f"== unchanged tree, {size / 1e6:.0f} MB: median A {spread(runs['A'])}, B {spread(runs['B'])}, "
        f"B - A {b - a:+.3f} s (n={len(runs['A'])} each; B slower in {slower} of {len(runs['A'])} pairs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("200MB"))
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--base", default="main", help="the git ref of A (default main)")
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        print(f"bench-why-idle: cannot simulate pods here: {why}", file=sys.stderr)
        return 2
    objects = stack_objects("nerc-production")
    objects["nodes"] = {**objects["nodes"], "count": 4, "gpusPerPod": 2}
    objects["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": WORKSPACE, "size": "1Gi"}]}
    result = run_objects("nerc-production", objects)
    if result.error:
        raise SystemExit(f"render failed: {result.error}")
    c = PodSim(result)
    try:
        c.start()
        name = next(n for n, data in c.configmaps.items() if "ml-dev" in data)
        b_data = dict(c.configmaps[name])
        a_data = shipped_at(args.base, b_data)
        changed = sorted(k for k in b_data if a_data[k] != b_data[k])
        print(f"A = {args.base}, B = this tree; shipped files that differ: {', '.join(changed) or 'none'}", flush=True)
        files = max(1, -(-args.size // 2**20))  # the tree of bench-launch, made the same way
        for i in range(files):
            c.write(0, f"{WORKSPACE}/tree/data/blob-{i:04d}.bin", "").write_bytes(os.urandom(2**20))
        c.write(0, f"{WORKSPACE}/tree/prog.py", PROGRAM)
        c.write(0, f"{WORKSPACE}/tree/.gitignore", "__pycache__/\n")
        assert c.exec(0, "git init -q .", cwd=f"{WORKSPACE}/tree").returncode == 0
        for p in c.pods[0].path(f"{WORKSPACE}/tree").rglob("*"):
            os.chown(p, c.identity.uid, 0)
        c.swap_configmap(name, b_data)
        cold = one_run(c)
        print(f"first run (cold, B): {cold[0]:.2f} s", flush=True)
        runs: dict[str, list[float]] = {"A": [], "B": []}
        for k in range(args.pairs):
            for variant, data in (("A", a_data), ("B", b_data)) if k % 2 == 0 else (("B", b_data), ("A", a_data)):
                c.swap_configmap(name, data)
                time.sleep(0.5)
                took, _ = one_run(c)
                runs[variant].append(took)
                print(f"pair {k + 1}/{args.pairs} {variant}: {took:.3f} s", flush=True)
        print(verdict(runs, args.size))
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
