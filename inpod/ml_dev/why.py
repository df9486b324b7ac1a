"""`ml-dev why`: which rank is stuck, and where — every rank's stack from every pod merged into one verdict.

From any pod: fans out over the SSH fabric, runs `ml-dev _why-sample` (sampler.py) on every pod at once, merges the
reports (`merge`), prints the verdict, keeps it with the run under `$ML_DEV_WORKSPACE/.ml-dev-env/env/<app>/runs/<run>/why/` on the
run's launching pod. `ml-dev run`'s watchdog (watchdog.py) calls the same `verdict_for`.

A straggler is named only when it holds in every sample (at least two, at least 1 s apart): the other ranks agree on
one place (a strict majority of the sampled ranks) and the named rank is elsewhere each time. Stacks only: no locals,
no environment values. Python 3.8+, standard library only (shipped next to ml-dev).

Why one module: the fan-out, the merge and the words all read one report shape and one verdict shape; what samples a
pod (sampler.py), what reads the collectives (collectives.py) and the watchdog (watchdog.py) are already apart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .. import contract
from ..lib.pod import env_records_dir
from .collectives import merge_fr, ras_words
from .common import HERE, PY, Cluster, die, parallel
from .sampler import sample_pod
from .watchdog import INTERVAL, MIN_INTERVAL, RUN_ID, SAMPLES

EXIT_NO_STRAGGLER = 0
EXIT_STRAGGLER = 3
EXIT_UNDECIDED = 4
EXIT_NOTHING = 5
EXIT_CODES = {
    "no-straggler": EXIT_NO_STRAGGLER,
    "straggler": EXIT_STRAGGLER,
    "undecided": EXIT_UNDECIDED,
    "nothing-sampled": EXIT_NOTHING,
}
"""`ml-dev why`'s exit status by verdict (1: it could not run, 2: a usage mistake, as everywhere in ml-dev)."""


# ------------------------------------------------------------------------------------------------ merge


def _frame(f: dict[str, Any]) -> str:
    return f"{f.get('name', '?')} ({f.get('file', '?')}:{f.get('line', '?')})"


def _own(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """The innermost frame of the job's own code (not the interpreter's library or a package), else the innermost."""
    return next((f for f in frames if not f.get("lib")), frames[0])


def _where(frames: list[dict[str, Any]]) -> str:
    """'train_step (train.py:88) in all_reduce': the job's frame, and the library call it waits in."""
    own = _own(frames)
    return _frame(own) + (f" in {frames[0]['name']}" if frames[0] is not own else "")


def _main_frames(sample: dict[str, Any]) -> list[dict[str, Any]] | None:
    threads = sample.get("threads")
    if not threads:
        return None
    main = next((t for t in threads if t.get("main")), threads[0])
    return main.get("frames") or None


def ranks_text(labels: list[str]) -> str:
    """'ranks 0–2, 5' from ['0', '1', '2', '5'] (other labels listed as they are)."""
    nums = sorted(int(x) for x in labels if x.isdigit())
    rest = sorted(x for x in labels if not x.isdigit())
    runs: list[str] = []
    for n in nums:
        if runs and runs[-1].split("–")[-1].isdigit() and int(runs[-1].split("–")[-1]) == n - 1:
            runs[-1] = runs[-1].split("–")[0] + "–" + str(n)
        else:
            runs.append(str(n))
    items = runs + rest
    word = "rank" if len(labels) == 1 else "ranks"
    return f"{word} {', '.join(items)}"


def workers(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank process worth comparing, labelled by its RANK (else its pod's rank), with pod and node.

    Left out: a launcher (a Python process whose Python children are other ranks: torchrun, DeepSpeed's launcher), and
    within one rank the helpers it started (DataLoader workers share its RANK): the topmost Python process of a rank
    stands for it. Processes the kernel refused to show stand for their rank too (their leaves: a shell is not it)."""
    out = []
    for index, report in enumerate(reports):
        for agent in report.get("agents", []):
            procs = agent["processes"]
            python = {p["pid"] for p in procs if any("threads" in s for s in p["samples"])}
            refused = {p["pid"] for p in procs if any(s.get("error") == "refused" for s in p["samples"])}
            node_label = str(report.get("node_rank", index))
            label = {p["pid"]: str(p["rank"]) if p.get("rank") not in (None, "") else node_label for p in procs}
            candidates = [p for p in procs if p["pid"] in python | refused]
            launchers = {
                p["pid"]
                for p in candidates
                if p["pid"] in python
                and any(
                    c["ppid"] == p["pid"] and (label[c["pid"]] != label[p["pid"]] or (p.get("rank") in (None, "") and c.get("rank")))
                    for c in candidates
                )
            }
            groups: dict[str, list[dict[str, Any]]] = {}
            for p in candidates:
                if p["pid"] not in launchers:
                    groups.setdefault(label[p["pid"]], []).append(p)
            for name, group in groups.items():
                py = [p for p in group if p["pid"] in python]
                pids = {p["pid"] for p in (py or group)}
                if py:
                    keep = [p for p in py if p["ppid"] not in pids]
                else:
                    keep = [p for p in group if not any(c["ppid"] == p["pid"] for c in group)]
                for p in keep:
                    out.append({"label": name, "pod": report.get("pod", "?"), "node": report.get("node", ""), "proc": p})
            # a rank none of whose processes could be sampled or refused: no Python process at all (`bash -c 'sleep
            # 600'`, a compiled program), or py-spy missing or failing there. Its topmost process stands for it, with
            # what /proc tells (state, kernel wait, children); its Python descendants, had it any, would be candidates
            # above and sampled in their turn
            rest = [p for p in procs if label[p["pid"]] not in groups and p["pid"] not in launchers]
            rest_pids = {p["pid"] for p in rest}
            for p in rest:
                if p["ppid"] in rest_pids:
                    continue
                kids = [_proc_words(c) for c in procs if c["ppid"] == p["pid"]]
                group = [q for q in rest if label[q["pid"]] == label[p["pid"]]]
                python_said_no = all(any(x.get("error") == "not-python" for x in q["samples"]) for q in group if q["samples"])
                out.append(
                    {
                        "label": label[p["pid"]],
                        "pod": report.get("pod", "?"),
                        "node": report.get("node", ""),
                        "proc": p,
                        "not_python": python_said_no and any(q["samples"] for q in group),
                        "children": kids,
                    }
                )
    return out


def _proc_words(p: dict[str, Any]) -> str:
    """'sleep (pid 12, state S, waiting in hrtimer_nanosleep)': a process as /proc shows it (its last sample's)."""
    st = next((s.get("proc") for s in reversed(p.get("samples") or []) if s.get("proc")), None) or {}
    wait = f", waiting in {st['wchan']}" if st.get("wchan") else ""
    return f"{p.get('name', '?')} (pid {p.get('pid', '?')}, state {st.get('state', '?')}{wait})"


def unseen_reason(w: dict[str, Any]) -> tuple[str, str]:
    """(short, long) why a rank's stack was not sampled: not Python, py-spy refused, missing, failed, gone."""
    samples = w["proc"].get("samples") or []
    last = samples[-1] if samples else {}
    err = last.get("error")
    if w.get("not_python") or err == "not-python":
        kids = "; ".join(w.get("children") or []) or "none"
        return "not Python", f"not Python: {_proc_words(w['proc'])}; children: {kids}; no Python process below it"
    if err == "refused":
        return "py-spy refused", f"py-spy was refused ({last.get('detail', '')}); {_proc_words(w['proc'])}"
    if err == "missing":
        return "no py-spy", f"py-spy is not installed on its pod; {_proc_words(w['proc'])}"
    if err == "gone":
        return "ended", "the process ended while it was sampled"
    return "py-spy failed", f"py-spy failed ({last.get('detail', err or '?')}); {_proc_words(w['proc'])}"


def not_seen(reports: list[dict[str, Any]], unsampled: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(short, long) lines for every rank `ml-dev why` could not sample: each unsampled worker and the ranks of every
    pod whose report never came (unreachable, no report in time)."""
    short, long = [], []
    for w in sorted(unsampled, key=lambda w: _key(w["label"])):
        brief, words = unseen_reason(w)
        short.append(f"rank {w['label']} ({brief})")
        long.append(f"rank {w['label']} ({w['pod']}): {words}")
    for r in reports:
        if r.get("failed"):
            short.append(f"the ranks of {r.get('pod', '?')} (its pod did not answer)")
            long.append(f"the ranks of {r.get('pod', '?')} (node rank {r.get('node_rank', '?')}): its pod did not answer: {r['failed']}")
    return short, long


def merge(reports: list[dict[str, Any]], interval: float = INTERVAL) -> dict[str, Any]:
    """One verdict from every pod's report (sampler.sample_pod): {"kind", "text", "straggler", "sources", ...}.

    Why one function: the rules (every rank seen, a straggler in every sample, undecided otherwise) are decided in one
    pass over the same ranks, in the order the docs give them (docs/use/debugging.md)."""
    ws = workers(reports)
    sampled = [w for w in ws if any(_main_frames(s) for s in w["proc"]["samples"])]
    samples = max((len(w["proc"]["samples"]) for w in ws), default=0)
    sources = source_lines(reports, ws)
    verdict: dict[str, Any] = {"time": time.time(), "ranks": len(ws), "sampled": len(sampled), "samples": samples, "sources": sources}
    fr = merge_fr({w["label"]: w["proc"]["fr"]["dump"] for w in ws if (w["proc"].get("fr") or {}).get("status") == "used"})
    unsampled_ws = [w for w in ws if w not in sampled]
    short, long = not_seen(reports, unsampled_ws)
    if long:
        verdict["not_seen"] = long
    if not sampled:
        if any(w.get("not_python") for w in ws) or (short and not ws and any(r.get("agents") for r in reports)):
            # ranks were seen, none of them Python (or the only ones were on pods that did not answer): the verdict
            # cannot be "nothing", nor "no straggler": undecided, each rank named with what /proc tells
            verdict.update(
                kind="undecided", text=f"undecided: no rank's stack could be sampled; not seen: {', '.join(short)}", straggler=None
            )
            return _with_fr(verdict, fr, ws)
        why = "no rank process found" if not ws and not _failures(reports) else "no rank could be sampled"
        text = f"nothing could be sampled: {why}" + (f"; not seen: {', '.join(short)}" if short else "")
        verdict.update(kind="nothing-sampled", text=text, straggler=None)
        return _with_fr(verdict, fr, ws)
    # per sample: the function each worker's main thread is in (innermost frame), and the agreed place
    places: list[dict[str, tuple[str, str]]] = []
    for k in range(samples):
        here = {}
        for w in sampled:
            frames = _main_frames(w["proc"]["samples"][k]) if k < len(w["proc"]["samples"]) else None
            if frames:
                own = _own(frames)
                here[w["label"]] = (own["name"], own["file"])
        places.append(here)
    odd: set[str] | None = None
    majority: list[tuple[str, str] | None] = []
    for here in places:
        counts = Counter(here.values())
        top, n = counts.most_common(1)[0] if counts else (None, 0)
        if n * 2 <= len(here) or len(here) < 2:
            majority.append(None)
            continue
        majority.append(top)
        off = {label for label, place in here.items() if place != top}
        odd = off if odd is None else odd & off
    by_label = {w["label"]: w for w in sampled}
    last = {w["label"]: _main_frames(w["proc"]["samples"][-1]) or [] for w in sampled}
    # a straggler holds in every sample: one agreed place (a strict majority), the same ranks elsewhere each time
    holds = samples >= 2 and None not in majority and len(set(majority)) == 1 and bool(odd)
    if holds and odd:
        names = sorted(odd, key=_key)
        waiting = sorted((label for label in by_label if label not in odd), key=_key)
        first = by_label[names[0]]
        where = _where(last[names[0]]) if last[names[0]] else "?"
        wait_frame = Counter(_where(last[label]) for label in waiting if last[label]).most_common(1)[0][0] if waiting else "?"
        node = f", node {first['node']}" if first["node"] else ""
        text = (
            f"{ranks_text(names)} ({first['pod']}{node}) is elsewhere: in {where}; "
            f"{ranks_text(waiting)} wait in {wait_frame} (in {samples} samples {interval:g} s apart)"
        )
        verdict.update(
            kind="straggler",
            text=text,
            straggler={"ranks": names, "pod": first["pod"], "node": first["node"], "frame": where, "waiting_in": wait_frame},
        )
    elif samples < 2:
        verdict.update(kind="undecided", text="undecided: one sample only (a straggler must hold in two)", straggler=None)
    elif short:
        # "no straggler" only when every rank was sampled: a rank not seen (not Python, refused, on a pod that did
        # not answer) may be the one elsewhere
        seen = ranks_text(sorted(by_label, key=_key))
        verdict.update(kind="undecided", text=f"undecided: no straggler among {seen}, and not every rank was sampled", straggler=None)
    else:
        everyone = ranks_text(sorted(by_label, key=_key))
        still = all(
            len({tuple((f["name"], f["line"]) for f in (_main_frames(s) or [])) for s in w["proc"]["samples"]}) == 1 for w in sampled
        )
        agreed = None not in majority and len(set(majority)) == 1 and not odd
        if agreed and still:
            where = Counter(_where(last[label]) for label in by_label if last[label]).most_common(1)[0][0]
            text = f"no straggler: {everyone} are all in {where} in every sample (stuck together, or idle there)"
        else:
            text = f"no straggler: no rank is apart from the others in every sample ({everyone} sampled {samples} times)"
        verdict.update(kind="no-straggler", text=text, straggler=None)
    if short:
        verdict["text"] += f"; not seen: {', '.join(short)}"
    return _with_fr(verdict, fr, ws)


def _key(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


def _with_fr(verdict: dict[str, Any], fr: dict[str, Any] | None, ws: list[dict[str, Any]]) -> dict[str, Any]:
    """Flight Recorder's cross-rank finding, when it has one: the collective the ranks behind have not entered."""
    if not fr or not fr["findings"]:
        return verdict
    where = {w["label"]: w for w in ws}
    lines = []
    for f in fr["findings"]:
        first = where.get(f["behind"][0], {"pod": "?", "node": ""})
        lines.append(
            f"{ranks_text(f['behind'])} ({first['pod']}{', node ' + first['node'] if first['node'] else ''}) "
            f"{'has' if len(f['behind']) == 1 else 'have'} not entered {f['op']} #{f['seq']} of process group {f['group']}; "
            f"{ranks_text(f['waiting'])} wait in it ({_frame(f['frame'])})"
        )
    verdict["collectives"] = lines
    verdict["text"] = lines[0] + ". Stacks: " + verdict["text"]
    if verdict["kind"] != "straggler":
        verdict["kind"] = "straggler"
        f = fr["findings"][0]
        first = where.get(f["behind"][0], {"pod": "?", "node": ""})
        frame = f"{f['op']} #{f['seq']} not entered"
        verdict["straggler"] = {"ranks": f["behind"], "pod": first["pod"], "node": first["node"], "frame": frame}
    return verdict


def _failures(reports: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """[(how many rank processes, first detail)] of processes whose every sample failed for a reason other than the
    kernel's refusal, a non-Python process or its end (py-spy not executable, a crash); [] when none."""
    procs = [p for r in reports for a in r.get("agents", []) for p in a.get("processes", [])]
    bad = [
        p for p in procs if p.get("samples") and all(s.get("error") in ("failed", "timeout", "unreadable", "missing") for s in p["samples"])
    ]
    return [(len(bad), str(bad[0]["samples"][-1].get("detail", "")))] if bad else []


def source_lines(reports: list[dict[str, Any]], ws: list[dict[str, Any]]) -> dict[str, str]:
    """Whether each source was used, and if not, why (missing, refused and what would allow it, no torch, RAS silent)."""
    out = {}
    # a pod whose report never came says nothing about its py-spy: it is "not asked", never "missing"
    missing = sorted({r.get("pod", "?") for r in reports if not r.get("py_spy") and not r.get("failed")})
    not_python = [w for w in ws if w.get("not_python")]
    refused = [w for w in ws if any(s.get("error") == "refused" for s in w["proc"]["samples"])]
    used = [w for w in ws if any("threads" in s for s in w["proc"]["samples"])]
    parts = []
    if used:
        parts.append(f"used for {ranks_text(sorted({w['label'] for w in used}, key=_key))}")
    if missing:
        parts.append(f"missing on {', '.join(missing)} (the base image's py-spy; pip install py-spy)")
    if refused:
        detail = next(s["detail"] for s in refused[0]["proc"]["samples"] if s.get("error") == "refused")
        states = {w["label"]: (w["proc"]["samples"][-1].get("proc") or {}).get("state", "?") for w in refused}
        shown = ", ".join(f"{k} {v}" for k, v in sorted(states.items(), key=lambda kv: _key(kv[0])))
        parts.append(f"{detail} for {ranks_text(sorted(states, key=_key))}; stood in: process states from /proc ({shown}), no stacks")
    if not_python:
        parts.append(f"not used for {ranks_text(sorted({w['label'] for w in not_python}, key=_key))} (not Python)")
    asked_not = sorted(r.get("pod", "?") for r in reports if r.get("failed"))
    if asked_not:
        parts.append(f"not asked on {', '.join(asked_not)} (the pod did not answer)")
    failed = _failures(reports)
    if failed:
        # py-spy ran and failed for another reason than the kernel's (it could not be executed, a crash): say so
        parts.append(f"failed for {failed[0][0]} process(es) ({failed[0][1]})")
    if not ws and not failed:
        parts.append("no rank process found")
    out["py-spy"] = "; ".join(parts) or "not used"
    fr = [w["proc"].get("fr") for w in ws if w["proc"].get("fr")]
    fr_used = [f for f in fr if f and f.get("status") == "used"]
    if fr_used:
        out["flight-recorder"] = f"used: dumps of {len(fr_used)} rank(s)"
    elif fr and all(f.get("status") == "no-torch" for f in fr):
        out["flight-recorder"] = "not used: no torch in the ranks"
    elif fr:
        detail = next(f["detail"] for f in fr if f.get("status") != "no-torch")
        out["flight-recorder"] = f"not used: {detail}"
    else:
        out["flight-recorder"] = "not used: no Python rank could be read"
    ras: list[dict[str, Any]] = [r["ras"] for r in reports if r.get("ras")]
    answered = next((r for r in ras if r and r.get("status") == "used"), None)
    if answered:
        out["ras"] = "used: " + ras_words(answered["parsed"])
    elif ras:
        out["ras"] = f"silent: {ras[0].get('detail', '')}"
    else:
        out["ras"] = "not asked: no rank process found"
    return out


# --------------------------------------------------------------------------------------------- running it


def sample_everywhere(cluster: Cluster, run: str | None, samples: int, interval: float, timeout: float) -> list[dict[str, Any]]:
    """Every pod's report (this pod's in-process, the others over SSH at once); a pod that fails says why."""

    def one(rank: int) -> dict[str, Any]:
        if rank == cluster.me:
            report = sample_pod(run, samples, interval)
        else:
            argv = [PY, str(HERE / WHY_LAUNCHER), "_why-sample", "--samples", str(samples), "--interval", str(interval)]
            if run:
                argv += ["--run", run]
            try:
                res = subprocess.run(cluster.ssh(rank, argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                return {"pod": cluster.pods[rank], "agents": [], "failed": f"no report within {timeout:.0f} s", "node_rank": rank}
            try:
                report = json.loads(res.stdout)
            except ValueError:
                failed = cluster.explain(rank, res.stderr, res.returncode)
                return {"pod": cluster.pods[rank], "agents": [], "failed": failed, "node_rank": rank}
        report["node_rank"] = rank
        return report

    results = parallel(one, list(range(len(cluster.hosts))))
    out = []
    for rank in range(len(cluster.hosts)):
        r = results[rank]
        out.append(r if isinstance(r, dict) else {"pod": cluster.pods[rank], "agents": [], "failed": str(r), "node_rank": rank})
    return out


def current_run(reports: list[dict[str, Any]]) -> str | None:
    """The newest run with a live rank anywhere (run ids sort by start time)."""
    runs = sorted({a.get("run") for r in reports for a in r.get("agents", []) if a.get("run")})
    return runs[-1] if runs else None


def only_run(reports: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    return [dict(r, agents=[a for a in r.get("agents", []) if run and a.get("run") == run]) for r in reports]


def run_dir(run: str) -> Path:
    if not RUN_ID.match(run):
        die(f"--run {run!r}: a run id is letters, digits, '.', '_' and '-' (as `ml-dev run` makes them)", 2)
    return env_records_dir() / contract.RUNS_SUBDIR / run


def keep_local(run: str, record: dict[str, Any]) -> Path:
    """Write the verdict (with the reports it used) as why/<UTC time>.json and why/latest.json of the run's directory."""
    base = run_dir(run)
    (base / "why").mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record["verdict"]["time"]))
    text = json.dumps(record, indent=1, sort_keys=True)
    path = base / "why" / f"{stamp}.json"
    for target in (path, base / contract.WHY_LATEST):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(target)
    return path


def keep(cluster: Cluster, run: str, launcher: str | None, record: dict[str, Any]) -> str:
    """Keep the record on the run's launching pod (here, or over SSH); the path or why not."""
    where = cluster.pods.index(launcher) if launcher in cluster.pods else cluster.me
    try:
        if where == cluster.me:
            return str(keep_local(run, record))
        argv = cluster.ssh(where, [PY, str(HERE / WHY_LAUNCHER), "_why-keep", "--run", run])
        res = subprocess.run(argv, input=json.dumps(record), capture_output=True, text=True, timeout=60)
        if res.returncode:
            return f"not kept on {cluster.pods[where]}: {res.stderr.strip()[-300:]}"
        return f"{cluster.pods[where]}:{res.stdout.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not kept: {exc}"


def verdict_for(
    cluster: Cluster, run: str | None, samples: int = SAMPLES, interval: float = INTERVAL, timeout: float = 60
) -> dict[str, Any]:
    """Sample every pod, merge, keep: {"run", "verdict", "reports", "kept"}."""
    reports = sample_everywhere(cluster, run, samples, interval, timeout)
    run = run or current_run(reports)
    reports = only_run(reports, run or "")  # no run: an `ml-dev exec`'s processes are no run's ranks
    verdict = merge(reports, interval)
    record = {"run": run, "verdict": verdict, "reports": reports}
    launcher = next((a.get("launcher") for r in reports for a in r.get("agents", []) if a.get("launcher")), None)
    record["kept"] = keep(cluster, run, launcher, record) if run else "not kept: no run"
    return record


def print_verdict(record: dict[str, Any], out: Any = sys.stdout) -> None:
    v = record["verdict"]
    out.write(f"ml-dev why: {v['text']}\n")
    for line in v.get("collectives", [])[1:]:
        out.write(f"  also: {line}\n")
    for name, words in v["sources"].items():
        out.write(f"  {name}: {words}\n")
    for line in v.get("not_seen", []):
        out.write(f"  not seen: {line}\n")
    out.write(f"  run {record['run'] or '-'}; kept: {record['kept']}\n")
    out.flush()


def cmd_why(args: argparse.Namespace) -> int:
    if args.interval < MIN_INTERVAL or args.samples < 2:
        die(f"--samples {args.samples} --interval {args.interval:g}: a straggler needs 2+ samples, {MIN_INTERVAL:g} s or more apart", 2)
    if args.run and not RUN_ID.match(args.run):
        die(f"--run {args.run!r}: a run id is letters, digits, '.', '_' and '-' (as `ml-dev run` makes them)", 2)
    cluster = Cluster()
    record = verdict_for(cluster, args.run, args.samples, args.interval, args.timeout)
    if args.json:
        print(json.dumps(record["verdict"], indent=1))
    else:
        print_verdict(record)
    return EXIT_CODES[record["verdict"]["kind"]]


def cmd_why_sample(args: argparse.Namespace) -> int:
    print(json.dumps(sample_pod(args.run, args.samples, args.interval)))
    return 0


def cmd_why_keep(args: argparse.Namespace) -> int:
    print(keep_local(args.run, json.loads(sys.stdin.read())))
    return 0


WHY_LAUNCHER = "ml-dev-why"
"""This module's launcher beside ml-dev (inpod.SHIPPED): `ml-dev why` execs it, so `ml-dev run` and every rank agent
never load (nor compile: a ConfigMap mount keeps no bytecode) the sampler and the merge."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ml-dev")
    sub = parser.add_subparsers(dest="cmd", required=True)
    why = sub.add_parser(
        "why",
        help="which rank is stuck, and where: every rank's stack from every pod, one verdict",
        epilog="Exit status: 0 no straggler, 3 a straggler named, 4 undecided, 5 nothing could be sampled.",
    )
    why.add_argument("--run", help="the run's id (default: the newest run with a live rank)")
    why.add_argument("--samples", type=int, default=SAMPLES, help=f"samples per process ({SAMPLES}; at least 2)")
    why.add_argument("--interval", type=float, default=INTERVAL, help=f"seconds between samples ({INTERVAL:g}; at least 1)")
    why.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod's report (60)")
    why.add_argument("--json", action="store_true", help="the verdict as JSON")
    sample = sub.add_parser("_why-sample")
    sample.add_argument("--run")
    sample.add_argument("--samples", type=int, default=SAMPLES)
    sample.add_argument("--interval", type=float, default=INTERVAL)
    keep_p = sub.add_parser("_why-keep")
    keep_p.add_argument("--run", required=True)
    args = parser.parse_args(argv)
    handlers = {"why": cmd_why, "_why-sample": cmd_why_sample, "_why-keep": cmd_why_keep}
    return handlers[args.cmd](args)
