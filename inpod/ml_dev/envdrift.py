"""The drift gate's launcher side (`ml-dev run`): its guess at its own rank's fingerprint, whose digest every gate
question carries (an equal rank answers that digest alone), and the comparison of every rank's fingerprint with the
launching pod's, in words (envgate.py takes the fingerprints: each rank agent imports that module only, this one never).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Mapping, Tuple

from .. import contract
from ..lib.pod import env_records_dir
from .common import STATE_DIR, Cluster, die
from .envgate import CACHE_FILE, Fingerprint, digest, records


class Guess:
    """(the launcher) the fingerprint its own rank most likely has (this pod's cache as its rank agent left it,
    unchecked) and its digest, sent in every gate question (`env_digest`). A rank agent whose fingerprint has that
    digest answers the digest alone (`answer`), so an answer carries a full fingerprint only when it differs from the
    guess; a stale guess costs bytes, never a wrong verdict: the launching pod's own agent answers too, and its
    answer (the digest, or its whole fingerprint) is what every rank is compared with."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        try:
            held = json.loads(((cache_dir or STATE_DIR) / CACHE_FILE).read_text())["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            held = None
        self.fingerprint: Fingerprint = held if isinstance(held, dict) else {}
        self.digest = digest(self.fingerprint) if self.fingerprint else ""

    def heard(self, got: Mapping[str, object]) -> object:
        """The fingerprint an answer stands for: its own, this guess when it answered this guess's digest; None when it
        has none (an agent asked for none, or an ml-dev from before the gate: named, not compared)."""
        if "env" in got:
            return got["env"]
        if self.digest and got.get("env_digest") == self.digest:
            return self.fingerprint
        return None


Difference = Tuple[str, str, str]
"""(what, its value on the rank, its value on the launching pod's rank); "" where one has none."""


def differences(mine: Mapping[str, object], theirs: Mapping[str, object]) -> list[Difference]:
    """What differs between a rank's fingerprint (`theirs`) and the launching pod's (`mine`), one item per thing."""
    out: list[Difference] = []
    py_a, py_b = dict(mine.get("python") or {}), dict(theirs.get("python") or {})  # type: ignore[call-overload]
    if py_a.get("version") != py_b.get("version") or py_a.get("real") != py_b.get("real"):
        out.append(
            (
                "python3",
                f"{py_b.get('version')} ({py_b.get('path')} -> {py_b.get('real')})",
                f"{py_a.get('version')} ({py_a.get('path')} -> {py_a.get('real')})",
            )
        )
    da, db = dict(mine.get("distributions") or {}), dict(theirs.get("distributions") or {})  # type: ignore[call-overload]
    for name in sorted(set(da) | set(db)):
        if da.get(name) != db.get(name):
            out.append((f"package {name}", str(db.get(name) or ""), str(da.get(name) or "")))
    la, lb = dict(mine.get("libraries") or {}), dict(theirs.get("libraries") or {})  # type: ignore[call-overload]
    for stem in sorted(set(la) | set(lb)):
        a, b = la.get(stem) or ["", ""], lb.get(stem) or ["", ""]
        if list(a) != list(b):
            out.append(
                (f"library {stem}", f"{b[0]} sha256 {str(b[1])[:12]}" if b[0] else "", f"{a[0]} sha256 {str(a[1])[:12]}" if a[0] else "")
            )
    if mine.get("pythonpath") != theirs.get("pythonpath"):
        out.append(("PYTHONPATH", ":".join(map(str, theirs.get("pythonpath") or [])), ":".join(map(str, mine.get("pythonpath") or []))))  # type: ignore[call-overload]
    out += path_differences(mine.get("sys_path"), theirs.get("sys_path"))
    return out


def offered(names: list[str]) -> str:
    return f"{', '.join(names)} importable from it" if names else "present"


def path_differences(mine: object, theirs: object) -> list[Difference]:
    """sys.path's entries that offer something (an entry that is absent and one that holds nothing importable are the
    same): one only on one side, the names an entry offers, and the order of the entries both have."""
    sa = {str(e[0]): list(e[2]) for e in (mine if isinstance(mine, list) else []) if e[1]}
    sb = {str(e[0]): list(e[2]) for e in (theirs if isinstance(theirs, list) else []) if e[1]}
    out: list[Difference] = []
    both_a, both_b = [e for e in sa if e in sb], [e for e in sb if e in sa]
    if both_a != both_b:
        out.append(("sys.path order", " ".join(both_b), " ".join(both_a)))
    for entry in [*sa, *(e for e in sb if e not in sa)]:
        a, b = sa.get(entry), sb.get(entry)
        if a is None or b is None:
            out.append((f"sys.path entry {entry}", "" if b is None else offered(b), "" if a is None else offered(a)))
        elif a != b:
            extra, lack = sorted(set(b) - set(a)), sorted(set(a) - set(b))
            out.append((f"sys.path entry {entry}", offered(extra) if extra else "", offered(lack) if lack else ""))
    return out


def align_command(diffs: list[Difference]) -> str:
    """The command that gives every pod the launching pod's packages ("" when packages are not what differs)."""
    want = sorted({f"{what.split(' ', 1)[1]}=={mine}" for what, _, mine in diffs if what.startswith("package ") and mine})
    extra = sorted({what.split(" ", 1)[1] for what, theirs, mine in diffs if what.startswith("package ") and theirs and not mine})
    words = []
    if want:
        words.append("ml-dev pip install " + " ".join(want))
    if extra:
        words.append("ml-dev pip uninstall -y " + " ".join(extra))
    return " && ".join(words)


def write_json(path: Path, data: object) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def drift_lines(cluster: Cluster, prints: Mapping[int, object]) -> list[str]:
    """One line per difference, each naming the rank, its pod, the thing and its value on each side. A rank that
    answered no fingerprint (its pod still holds an ml-dev from before the gate: a ConfigMap update reaches the pods
    one by one) is not compared, and said so (never a refusal)."""
    me = cluster.me if cluster.me in prints else min(prints)
    mine = prints[me] if isinstance(prints[me], dict) else {}
    here = f"{cluster.label(me)}, this pod"
    lines = []
    for rank in sorted(prints):
        theirs = prints[rank]
        if rank == me or theirs is mine:  # the same digest (Guess.heard): the same fingerprint
            continue
        if not isinstance(theirs, dict) or not isinstance(mine, dict) or not mine:
            print(
                f"ml-dev: {cluster.label(rank)}: no environment fingerprint to compare (an ml-dev from before the drift gate)",
                file=sys.stderr,
            )
            continue
        for what, there, mine_value in differences(mine, theirs):
            lines.append(f"{cluster.label(rank)}: {what} {there or '(none)'}; {here}: {mine_value or '(none)'}")
    return lines


def theirs_of(prints: Mapping[int, object], rank: int) -> Mapping[str, object]:
    got = prints.get(rank)
    return got if isinstance(got, dict) else {}


def gate_verdict(cluster: Cluster, prints: Mapping[int, object], allow_drift: bool, run_id: str) -> None:
    """(the launcher, every fingerprint in) record the verdict (ENV_GATE_LAST); ranks that differ refuse the launch
    (status 1, RUN_EXIT_STATUSES), one line per difference and the command that aligns them, unless `allow_drift`
    (then the run's record says so: RUN_DRIFT_FILE)."""
    lines = drift_lines(cluster, prints)
    drifted = sorted({int(line.split()[1]) for line in lines})
    mine = prints.get(cluster.me)
    mine = mine if isinstance(mine, dict) else {}
    fix = align_command([d for r in drifted for d in differences(mine, theirs_of(prints, r))])
    record = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": run_id,
        "ranks": len(prints),
        "one_environment": not lines,
        "differs": [cluster.label(r) for r in drifted],
        "lines": lines,
        "align": fix,
        "allowed": bool(lines and allow_drift),
    }
    write_json(records() / contract.ENV_GATE_LAST, record)
    if not lines:
        return
    if not allow_drift:
        how = f"\n  to align every pod with this one: {fix}" if fix else ""
        die(
            f"no rank started: the environments of {len(drifted)} rank(s) differ from this pod's:\n  "
            + "\n  ".join(lines)
            + how
            + "\n  (or launch anyway: ml-dev run --allow-drift ...)"
        )
    write_json(env_records_dir() / contract.RUNS_SUBDIR / run_id / contract.RUN_DRIFT_FILE, record)
    print(
        "ml-dev: launching with --allow-drift although the ranks' environments differ:\n  " + "\n  ".join(lines),
        file=sys.stderr,
        flush=True,
    )
