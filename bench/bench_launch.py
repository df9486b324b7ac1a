"""`make bench-launch`: how long `ml-dev run` takes until every rank runs, on 4 simulated pods.

The pods are the test suite's (tests/podsim: started from nerc-production's render with 4 pods of 2 GPUs
and a per-pod workspace; real sshd/ssh/rsync, own namespaces and pod IP per pod; needs root). A tree of SIZE bytes (default 200 MB, in
1 MiB files) sits in a git work tree on pod 0. Measured, from the moment `ml-dev run` is started on
pod 0 to the moment the last rank's program is running (each rank records time.time() first thing):

* unchanged: nothing changed since the last run (rsync finds nothing to send; hashes come from the cache);
* one file changed: one 1 MiB file rewritten before each run (rsync sends only that file).

Prints the median, min and max of REPEAT runs each, and the bytes rsync sent per run, and writes them as
a markdown report with the raw runs (JSON) and a plot of every run (SVG) to --out (bench-out/
bench-launch-<size>.{md,json,svg}). Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from inpod.home import svgplot
from tests.conftest import run_objects, stack_objects
from tests.podsim.pods import PodSim, missing_requirements

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = "/workspace"

PROGRAM = """import json, os, sys, time
t = time.time()
os.makedirs("/tmp/ml-dev-env/bench", exist_ok=True)
path = "/tmp/ml-dev-env/bench/rank-%s.json" % os.environ["NODE_RANK"]
with open(path + ".tmp", "w") as f:
    json.dump({"started": t}, f)
os.replace(path + ".tmp", path)
"""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(MB|MiB|GB|GiB|)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 200MB")
    scale = {"": 1, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}[m.group(2)]
    return int(m.group(1)) * scale


def one_run(c: PodSim) -> tuple[float, int]:
    for pod in c.pods:
        for f in pod.path("/tmp/ml-dev-env/bench").glob("*.json"):
            f.unlink()
    t0 = time.time()
    res = c.exec(0, "python3 /opt/ml-dev-env/ml-dev run -- python3 prog.py", cwd=f"{WORKSPACE}/tree", timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"ml-dev run failed:\n{res.stdout}\n{res.stderr}")
    starts = [json.loads(pod.path(f"/tmp/ml-dev-env/bench/rank-{pod.index}.json").read_text())["started"] for pod in c.pods]
    sent = re.search(r"(\d+) bytes sent", res.stdout)
    return max(starts) - t0, int(sent.group(1)) if sent else -1


def summary(name: str, samples: list[tuple[float, int]]) -> str:
    times = [s for s, _ in samples]
    sent = statistics.median(b for _, b in samples)
    return (
        f"{name:<28} median {statistics.median(times):6.2f} s   min {min(times):5.2f} s   max {max(times):5.2f} s"
        f"   rsync sent (median, 3 pods) {sent / 1e6:8.2f} MB   n={len(times)}"
    )


def report(size: int, cold: tuple[float, int], runs: dict[str, list[tuple[float, int]]]) -> str:
    lines = [
        f"`ml-dev run` on 4 simulated pods: time until every rank runs, tree of {size / 1e6:.0f} MB (1 MiB files); "
        f"{os.cpu_count()} CPUs; medians, spread = min–max",
        "",
        "| case | median s | spread s | runs (s) | rsync sent, median (3 pods) |",
        "|---|---:|---:|---|---:|",
        f"| first run (cold, full copy) | {cold[0]:.2f} | – | {cold[0]:.2f} | {cold[1] / 1e6:.2f} MB |",
    ]
    for name, samples in runs.items():
        times = [t for t, _ in samples]
        lines.append(
            f"| {name} | {statistics.median(times):.2f} | {min(times):.2f}–{max(times):.2f} | "
            f"{', '.join(f'{t:.2f}' for t in times)} | {statistics.median(b for _, b in samples) / 1e6:.2f} MB |"
        )
    return "\n".join(lines) + "\n"


def plot(size: int, cold: tuple[float, int], runs: dict[str, list[tuple[float, int]]]) -> str:
    series: list[dict[str, object]] = [{"label": "first run (cold)", "points": [(0, cold[0])]}]
    series += [{"label": name, "points": [(i + 1, t) for i, (t, _) in enumerate(samples)]} for name, samples in runs.items()]
    return svgplot.line_chart(
        series, title=f"ml-dev run, 4 pods, {size / 1e6:.0f} MB tree: time until every rank runs", x_label="run", y_label="seconds"
    )


def write_report(out: Path, size: int, cold: tuple[float, int], runs: dict[str, list[tuple[float, int]]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench-launch-{size // 10**6}mb"
    stem.with_suffix(".md").write_text(report(size, cold, runs))
    data = {"size": size, "cpus": os.cpu_count(), "cold": cold, "runs": runs}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    stem.with_suffix(".svg").write_text(plot(size, cold, runs))
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("200MB"))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out", help="where the report (markdown, JSON, SVG) is written")
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        print(f"bench-launch: cannot simulate pods here: {why}", file=sys.stderr)
        return 2
    objects = stack_objects("nerc-production")
    objects["nodes"] = {**objects["nodes"], "count": 4, "gpusPerPod": 2}
    objects["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": WORKSPACE, "size": "1Gi"}]}
    result = run_objects("nerc-production", objects)
    if result.error:
        raise SystemExit(f"render failed: {result.error}")
    c = PodSim(result)
    try:
        started = time.monotonic()
        c.start()
        print(f"4 simulated pods up in {time.monotonic() - started:.1f} s")
        files = max(1, -(-args.size // 2**20))
        for i in range(files):
            c.write(0, f"{WORKSPACE}/tree/data/blob-{i:04d}.bin", "").write_bytes(os.urandom(2**20))
        c.write(0, f"{WORKSPACE}/tree/prog.py", PROGRAM)
        c.write(0, f"{WORKSPACE}/tree/.gitignore", "__pycache__/\n")
        assert c.exec(0, "git init -q .", cwd=f"{WORKSPACE}/tree").returncode == 0
        for p in c.pods[0].path(f"{WORKSPACE}/tree").rglob("*"):
            os.chown(p, c.identity.uid, 0)
        print(f"tree: {files} files of 1 MiB + prog.py on pod 0 ({files * 2**20 / 1e6:.0f} MB)")
        cold = one_run(c)
        print(f"{'first run (cold, full copy)':<28} {cold[0]:6.2f} s   rsync sent {cold[1] / 1e6:8.2f} MB")
        unchanged = [one_run(c) for _ in range(args.repeat)]
        changed = []
        for n in range(args.repeat):
            target = c.pods[0].path(f"{WORKSPACE}/tree/data/blob-{n % files:04d}.bin")
            target.write_bytes(os.urandom(2**20))
            changed.append(one_run(c))
        print(summary("unchanged tree", unchanged))
        print(summary("one 1 MiB file changed", changed))
        stem = write_report(args.out, args.size, cold, {"unchanged tree": unchanged, "one 1 MiB file changed": changed})
        print(f"report written to {stem}.md / .json / .svg (plot of every run)")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
