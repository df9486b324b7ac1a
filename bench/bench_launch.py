"""`make bench-launch PODS=2,4,8,16 SIZE=20MB`: how `ml-dev run` scales with the pod count, on simulated pods.

For every pod count N of PODS, N pods of the test suite's (tests/podsim: started from nerc-production's render with
a per-pod workspace; real sshd/ssh/rsync, a network namespace, veth and pod IP per pod; needs root) get a tree of
SIZE bytes (1 MiB files of random bytes, in a git work tree) on pod 0. Measured from the moment `ml-dev run` starts
on pod 0 to the moment the last rank's program runs (each rank records time.time() first thing), REPEAT times:

* unchanged: nothing changed since the last run;
* one file changed: one 1 MiB file rewritten before the run;
* first copy: the tree removed from every other pod (and their hash caches) before the run;
* one copy alone (this tree's launcher only): the tree removed from pod 1 only, `ml-dev sync`: one hop, the other
  pods idle — the unit of the critical-path bound.

Per run: the wall time, the bytes pod 0 sent out of its eth0 (the veth's tx counter, read in its network
namespace: SSH and rsync's own framing included), and (this tree's launcher) every hop of the sync
($ML_DEV_STATE_DIR/sync-last.json: source, receiver, round, seconds, and its way: rsync, or the rank agent's gate for
a small change). With `--baseline REF` the launcher of git
revision REF (its `inpod/` files swapped into the pods' startup ConfigMap, as a ConfigMap update reaches a pod)
runs in the same rounds, interleaved run by run with this tree's, so both see the same machine load; after each
baseline run an untimed `ml-dev sync` of this tree's launcher (nothing to copy) leaves pod 0's record of the tree
it sent last as it would be without the baseline (the fan-out's size estimate reads it).

The report (bench-out/bench-launch-<size>mb.{md,json,svg}) has the medians, spread (min–max) and every run, the
rounds and hop times, the goals of the fan-out checked per N, and an extrapolation to 32 and 64 pods from the
measured per-hop cost and the number of rounds (labelled as one: nothing ran at that scale). Not a test: it prints
numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import inpod
from inpod.lib import svgplot
from tests.conftest import run_objects, stack_objects
from tests.podsim.pods import PodSim, missing_requirements

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = "/workspace"
TREE = f"{WORKSPACE}/tree"
STATE = "/tmp/ml-dev-env"
CASES = ("unchanged", "one file changed", "first copy")
ALONE = "one copy alone"
NEW, OLD = "this tree", "baseline"
EXTRAPOLATE = (32, 64)

PROGRAM = """import json, os, sys, time
t = time.time()
os.makedirs("/tmp/ml-dev-env/bench", exist_ok=True)
path = "/tmp/ml-dev-env/bench/rank-%s.json" % os.environ["NODE_RANK"]
with open(path + ".tmp", "w") as f:
    json.dump({"started": t}, f)
os.replace(path + ".tmp", path)
"""

Sample = dict[str, Any]
"""One run: wall (s), tx (bytes out of pod 0's eth0), and for this tree's launcher rounds, hops, fan_out."""
Results = dict[str, dict[int, dict[str, list[Sample]]]]
"""variant -> pods -> case -> runs."""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(MB|MiB|GB|GiB|)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 200MB")
    scale = {"": 1, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}[m.group(2)]
    return int(m.group(1)) * scale


def parse_pods(text: str) -> list[int]:
    try:
        pods = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        pods = []
    if not pods or min(pods) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: pod counts of 2 or more, comma-separated (2,4,8,16)")
    return pods


# ------------------------------------------------------------------------------------------ the pods


def start(pods: int) -> PodSim:
    objects = stack_objects("nerc-production")
    objects["nodes"] = {**objects["nodes"], "count": pods, "gpusPerPod": 1}
    objects["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": WORKSPACE, "size": "1Gi"}]}
    result = run_objects("nerc-production", objects)
    if result.error:
        raise SystemExit(f"render failed: {result.error}")
    return PodSim(result).start(timeout=300)


def baseline_data(c: PodSim, ref: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(startup ConfigMap name, this tree's data, the data with REF's `inpod/` files in place of ours)."""
    name = next(n for n, d in c.configmaps.items() if "inpod.ml_dev.main.py" in d)
    ours = dict(c.configmaps[name])
    theirs = dict(ours)
    sources = {s.key: f"inpod/{s.source}" for s in inpod.SHIPPED if s.path.startswith("inpod/")}
    for key in ours:
        if key in sources:
            got = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{sources[key]}"], capture_output=True, text=True, check=False)
            if got.returncode == 0:
                theirs[key] = got.stdout
    return name, ours, theirs


def tx(c: PodSim) -> int:
    return int(c.pods[0].path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def forget(c: PodSim, pods: list[int]) -> None:
    """The tree and the hash caches gone from `pods`: what a first copy finds."""
    for i in pods:
        shutil.rmtree(c.pods[i].path(TREE), ignore_errors=True)
        shutil.rmtree(c.pods[i].path(f"{STATE}/tree-cache"), ignore_errors=True)


def timed_run(c: PodSim, command: str, env: dict[str, str], ranks: bool = True) -> Sample:
    for pod in c.pods:
        for f in pod.path(f"{STATE}/bench").glob("*.json"):
            f.unlink()
    last = c.pods[0].path(f"{STATE}/sync-last.json")
    last.unlink(missing_ok=True)
    before, t0 = tx(c), time.time()
    res = c.exec(0, command, cwd=TREE, timeout=600, env=env)
    done = time.time()
    if res.returncode != 0:
        raise SystemExit(f"{command} failed:\n{res.stdout}\n{res.stderr}")
    sent = re.search(r"(\d+) bytes sent", res.stdout)
    sample: Sample = {"tx": tx(c) - before, "sent": int(sent.group(1)) if sent else -1}
    if ranks:
        starts = [json.loads(p.path(f"{STATE}/bench/rank-{p.index}.json").read_text())["started"] for p in c.pods]
        sample["wall"] = max(starts) - t0
    else:
        sample["wall"] = done - t0
    if last.exists():
        record = json.loads(last.read_text())
        sample.update(rounds=record["rounds"], fan_out=record["fan_out"], hops=record["hops"])
    return sample


def one_run(c: PodSim) -> tuple[float, int]:
    """`ml-dev run` of the tree on pod 0 once (bench/bench_why_idle.py's unit): seconds until every rank runs and the
    bytes the sync said it sent."""
    sample = timed_run(c, "python3 /opt/ml-dev-env/ml-dev run -- python3 prog.py", {})
    return float(sample["wall"]), int(sample["sent"])


def measure(pods: int, size: int, repeat: int, baseline: str | None, results: Results, say: Any) -> None:
    started = time.monotonic()
    c = start(pods)
    try:
        say(f"{pods} simulated pods up in {time.monotonic() - started:.1f} s")
        files = max(1, -(-size // 2**20))
        for i in range(files):
            c.write(0, f"{TREE}/data/blob-{i:04d}.bin", "").write_bytes(os.urandom(2**20))
        c.write(0, f"{TREE}/prog.py", PROGRAM)
        c.write(0, f"{TREE}/.gitignore", "__pycache__/\n")
        assert c.exec(0, "git init -q .", cwd=TREE).returncode == 0
        for p in c.pods[0].path(TREE).rglob("*"):
            os.chown(p, c.identity.uid, 0)
        variants = [NEW] + ([OLD] if baseline else [])
        data = baseline_data(c, baseline) if baseline else None
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        run = "python3 /opt/ml-dev-env/ml-dev run -- python3 prog.py"
        timed_run(c, run, env)  # the first sync, and warm caches: not counted
        for n in range(repeat):
            for case in CASES:
                for variant in variants if n % 2 == 0 else variants[::-1]:
                    if data:
                        c.swap_configmap(data[0], data[1] if variant == NEW else data[2])
                    if case == "one file changed":
                        c.pods[0].path(f"{TREE}/data/blob-{n % files:04d}.bin").write_bytes(os.urandom(2**20))
                    if case == "first copy":
                        forget(c, list(range(1, pods)))
                    sample = timed_run(c, run, env)
                    results.setdefault(variant, {}).setdefault(pods, {}).setdefault(case, []).append(sample)
                    say(f"  {pods} pods, {case:<16} {variant:<10} {sample['wall']:6.2f} s  pod 0 sent {sample['tx'] / 1e6:7.2f} MB")
                    if data and variant == OLD:
                        # untimed, nothing to copy: this launcher's record of the tree it sent last (which the
                        # baseline does not keep) as it would be had it made the baseline's run
                        c.swap_configmap(data[0], data[1])
                        timed_run(c, "python3 /opt/ml-dev-env/ml-dev sync", env, ranks=False)
            if data:
                c.swap_configmap(data[0], data[1])
            forget(c, [1])
            sample = timed_run(c, "python3 /opt/ml-dev-env/ml-dev sync", env, ranks=False)
            sample["hop"] = max((h["seconds"] for h in sample.get("hops", [])), default=sample["wall"])
            results[NEW][pods].setdefault(ALONE, []).append(sample)
            say(f"  {pods} pods, {ALONE:<16} {NEW:<10} hop {sample['hop']:6.2f} s")
    finally:
        c.stop()


# ------------------------------------------------------------------------------------------ the report


def med(samples: list[Sample], key: str = "wall") -> float:
    return float(statistics.median(s[key] for s in samples)) if samples else float("nan")


def critical_path(sample: Sample) -> float:
    """The slowest hop of each round, summed."""
    slowest: dict[int, float] = {}
    for h in sample.get("hops") or []:
        slowest[h["round"]] = max(slowest.get(h["round"], 0.0), float(h["seconds"]))
    return sum(slowest.values())


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares a + b·x."""
    if len(points) < 2:
        return (points[0][1] if points else 0.0), 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs) or 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den
    return my - b * mx, b


def rounds(pods: int) -> int:
    return max(1, math.ceil(math.log2(pods)))


def extrapolate(size: int, results: Results) -> dict[str, dict[int, float]]:
    """Estimates at 32 and 64 pods (not measured), each continued from the largest pod count measured (M):
    * unchanged / one file changed: a line through the measured medians (pod 0's per-pod SSH cost);
    * first copy, this tree: the median at M, plus the unchanged line's growth from M, plus one hop (the median
      single copy measured alone) per round added beyond ceil(log2 M): on a cluster every pod has its own CPUs
      and link, so a round costs about one hop (here every pod shares two cores, and a round of k hops costs
      about k/2 hops);
    * first copy, baseline: the median at M plus the measured line's slope (pod 0 sends N − 1 copies);
    * pod 0's bytes: this tree one copy plus a line through the rest; the baseline N − 1 copies plus the rest."""
    out: dict[str, dict[int, float]] = {}
    for variant, by_pods in results.items():
        ns = sorted(by_pods)
        top = ns[-1]
        for case in CASES:
            a, b = fit([(n, med(by_pods[n][case])) for n in ns])
            at_top = med(by_pods[top][case])
            out[f"{variant}: {case}"] = {n: at_top + b * (n - top) for n in EXTRAPOLATE}
        copies = (lambda n: 1) if variant == NEW else (lambda n: n - 1)
        a, b = fit([(n, med(by_pods[n]["first copy"], "tx") - copies(n) * size) for n in ns])
        out[f"{variant}: first copy, pod 0 sent (bytes)"] = {n: copies(n) * size + a + b * n for n in EXTRAPOLATE}
    if NEW in results:
        by_pods = results[NEW]
        top = max(by_pods)
        alone = [s["hop"] for n in by_pods for s in by_pods[n].get(ALONE, [])]
        hop = float(statistics.median(alone)) if alone else 0.0
        _, slope = fit([(n, med(by_pods[n]["unchanged"])) for n in sorted(by_pods)])
        at_top = med(by_pods[top]["first copy"])
        out[f"{NEW}: first copy"] = {n: at_top + slope * (n - top) + (rounds(n) - rounds(top)) * hop for n in EXTRAPOLATE}
    return out


def ways(samples: list[Sample]) -> str:
    """How the median run's hops went: `gate` (the change written by the rank agent at its gate) or `rsync`."""
    if not samples:
        return "–"
    mid = sorted(samples, key=lambda s: s["wall"])[len(samples) // 2]
    counts: dict[str, int] = {}
    for h in mid.get("hops") or []:
        way = str(h.get("via") or "rsync")
        counts[way] = counts.get(way, 0) + 1
    return ", ".join(f"{way} {k}" for way, k in sorted(counts.items())) or "none"


def report(size: int, results: Results, meta: dict[str, Any]) -> str:
    variants = list(results)
    pods = sorted({n for v in results.values() for n in v})
    mb = size / 1e6
    lines = [
        f"`ml-dev run` on simulated pods: time until every rank runs; tree of {mb:.0f} MB (1 MiB files); {meta.get('cpus')} CPUs "
        f"shared by every pod (and, on the project's machine, by other engineers' jobs: load {meta.get('load_start')} at the "
        f"start, {meta.get('load_end')} at the end); {meta.get('repeat')} runs per case, "
        + ("the baseline's and this tree's interleaved run by run; " if len(variants) > 1 else "")
        + "medians, spread = min–max; pod 0 sent = its eth0's tx counter over the run",
        "",
        "| pods | case | launcher | median s | spread s | runs (s) | pod 0 sent, median |",
        "|---:|---|---|---:|---:|---|---:|",
    ]
    for n in pods:
        for case in CASES:
            for v in variants:
                samples = results[v].get(n, {}).get(case, [])
                if not samples:
                    continue
                walls = [s["wall"] for s in samples]
                lines.append(
                    f"| {n} | {case} | {v} | {med(samples):.2f} | {min(walls):.2f}–{max(walls):.2f} | "
                    f"{', '.join(f'{w:.2f}' for w in walls)} | {med(samples, 'tx') / 1e6:.1f} MB ({med(samples, 'tx') / size:.2f} × tree) |"
                )
    if NEW in results:
        lines += [
            "",
            "Hops of this tree's first copy (median run; seconds per hop, round by round) and the goals per N "
            "(one copy = a single hop measured alone in the same run):",
            "",
            "| pods | rounds | hops per round (s) | critical path s | one copy s | bound (⌈log2 N⌉+1) × one copy | wall s | "
            "baseline wall s | pod 0 sent ≤ 2 × tree | one file ≤ 1.2 × unchanged | one file changed: hops by way (median run) |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|",
        ]
        for n in pods:
            mine = results[NEW].get(n, {})
            firsts = sorted(mine.get("first copy", []), key=lambda s: s["wall"])
            if not firsts:
                continue
            mid = firsts[len(firsts) // 2]
            per_round: dict[int, list[str]] = {}
            for h in mid.get("hops") or []:
                per_round.setdefault(h["round"], []).append(
                    f"{h['src']}→{h['dst']} {h['seconds']:.2f}" + " (gate)" * (h.get("via") == "gate")
                )
            hops = "; ".join(f"r{r}: {', '.join(v)}" for r, v in sorted(per_round.items()))
            alone = statistics.median(s["hop"] for s in mine.get(ALONE, [])) if mine.get(ALONE) else float("nan")
            bound = (rounds(n) + 1) * alone
            crit = statistics.median(critical_path(s) for s in firsts)
            base = med(results[OLD][n]["first copy"]) if OLD in results and n in results[OLD] else float("nan")
            tx_ok = med(firsts, "tx") <= 2 * size
            ratio = med(mine.get("one file changed", [])) / med(mine.get("unchanged", []))
            lines.append(
                f"| {n} | {mid.get('rounds', '–')} | {hops} | {crit:.2f} ({'≤' if crit <= bound else '>'} bound) | {alone:.2f} | "
                f"{bound:.2f} | "
                f"{med(firsts):.2f} | {base:.2f} | {'yes' if tx_ok else 'NO'} ({med(firsts, 'tx') / size:.2f} ×) | "
                f"{'yes' if ratio <= 1.2 else 'NO'} ({ratio:.2f} ×) | {ways(mine.get('one file changed', []))} |"
            )
    est = extrapolate(size, results)
    lines += [
        "",
        "**Extrapolated, not measured** (nothing ran at 32 or 64 pods; see `extrapolate` in bench/bench_launch.py for the model):",
        "",
        "| estimate | " + " | ".join(f"{n} pods" for n in EXTRAPOLATE) + " |",
        "|---|" + "---:|" * len(EXTRAPOLATE),
    ]
    for name, values in est.items():
        unit = (lambda x: f"{x / 1e6:.0f} MB") if "bytes" in name else (lambda x: f"{x:.2f} s")
        lines.append(f"| {name} | " + " | ".join(unit(values[n]) for n in EXTRAPOLATE) + " |")
    return "\n".join(lines) + "\n"


def plot(size: int, results: Results) -> str:
    colors = {"unchanged": "#2ca02c", "one file changed": "#ff7f0e", "first copy": "#1f77b4"}
    series: list[dict[str, object]] = []
    est = extrapolate(size, results)
    for v in results:
        pods = sorted(results[v])
        for case in CASES:
            points = [(n, med(results[v][n][case])) for n in pods if results[v][n].get(case)]
            color = colors[case] if v == NEW else {"first copy": "#d62728", "unchanged": "#9467bd", "one file changed": "#8c564b"}[case]
            series.append({"label": f"{case} ({v})", "points": points, "color": color})
            if case == "first copy" and points:
                tail = [points[-1], *((n, est[f"{v}: {case}"][n]) for n in EXTRAPOLATE)]
                series.append({"label": "", "points": tail, "color": color, "dash": True})
    mb = size / 1e6
    return svgplot.line_chart(
        series,
        title=f"ml-dev run, {mb:.0f} MB tree: time until every rank runs (dashed: extrapolated)",
        x_label="pods",
        y_label="seconds",
        width=640,
        height=320,
    )


def write_report(out: Path, size: int, results: Results, meta: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench-launch-{size // 10**6}mb"
    stem.with_suffix(".md").write_text(report(size, results, meta))
    stem.with_suffix(".json").write_text(json.dumps({"size": size, **meta, "results": results}, indent=1) + "\n")
    stem.with_suffix(".svg").write_text(plot(size, results))
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("20MB"))
    parser.add_argument("--pods", type=parse_pods, default=parse_pods("2,4,8,16"), help="pod counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", metavar="REF", help="also run the launcher of git revision REF, interleaved")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out", help="where the report (markdown, JSON, SVG) is written")
    parser.add_argument("--report-from", type=Path, metavar="JSON", help="write the report of an earlier run's JSON again (no pods)")
    args = parser.parse_args()
    if args.report_from:
        data = json.loads(args.report_from.read_text())
        size, saved = data.pop("size"), data.pop("results")
        again: Results = {v: {int(n): cases for n, cases in by.items()} for v, by in saved.items()}
        stem = write_report(args.out, size, again, data)
        print(f"report written to {stem}.md / .json / .svg")
        return 0
    why = missing_requirements()
    if why:
        print(f"bench-launch: cannot simulate pods here: {why}", file=sys.stderr)
        return 2
    meta: dict[str, Any] = {"cpus": os.cpu_count(), "repeat": args.repeat, "baseline": args.baseline, "command": " ".join(sys.argv)}
    meta["load_start"] = "/".join(f"{x:.1f}" for x in os.getloadavg())
    results: Results = {}
    for pods in args.pods:
        measure(pods, args.size, args.repeat, args.baseline, results, lambda line: print(line, flush=True))
    meta["load_end"] = "/".join(f"{x:.1f}" for x in os.getloadavg())
    stem = write_report(args.out, args.size, results, meta)
    print(stem.with_suffix(".md").read_text())
    print(f"report written to {stem}.md / .json / .svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
