"""ml-dev pip: one `pip` command for the whole environment (install once, every rank has it), and its log, which a pod
that never ran it (added by a resize) replays at the gate before its first rank starts.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.

Where pip installs decides where it runs: into a folder on shared storage (an activated virtualenv, `--target`,
`--prefix` on a shared volume) once, on this pod (every pod sees the folder); anywhere else (the image's
site-packages in the pod's own layer, the user site under HOME, which is each pod's own in every storage mode) on
every pod at once, through the fabric (the rank agents of `ml-dev exec`, so a venv's PATH and PIP_* travel). A wheel
or requirements file named by path is copied first to the pods that do not see it. Every pip command that worked is
appended to `<records_dir>/environment/pip.jsonl` (contract.ENV_PIP_LOG); each pod keeps how many of those it ran in
its HOME (PIP_APPLIED), so a pod added by a resize (a new HOME) is given the whole log at the gate (`replay`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .. import contract
from .common import Cluster, die, parallel
from .envgate import records

PIP_APPLIED = ".cache/ml-dev-env/pip-applied"
"""`$HOME/.cache/ml-dev-env/pip-applied`: how many commands of the pip log this pod ran (its HOME is its own)."""
SHARED_OPTIONS = ("--target", "-t", "--prefix", "--root")


def log_path() -> Path:
    return records() / contract.ENV_PIP_LOG


def read_log() -> list[list[str]]:
    try:
        lines = log_path().read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append([str(w) for w in json.loads(line)["args"]])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def applied(home: str) -> int:
    try:
        return int((Path(home) / PIP_APPLIED).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def with_paths(words: list[str]) -> tuple[list[str], list[str]]:
    """`words` with every existing file (a wheel, `-r requirements.txt`) made absolute, and those files."""
    out, files = [], []
    for word in words:
        if not word.startswith("-") and os.path.isfile(word):
            word = os.path.abspath(word)
            files.append(word)
        out.append(word)
    return out, files


def shared_target(cluster: Cluster, words: list[str]) -> str:
    """The folder on shared storage pip installs into ("" when it installs into each pod's own)."""
    for i, word in enumerate(words):
        for opt in SHARED_OPTIONS:
            value = word.split("=", 1)[1] if word.startswith(opt + "=") else (words[i + 1] if word == opt and i + 1 < len(words) else "")
            if value and cluster.is_shared(Path(os.path.abspath(value))):
                return value
    venv = os.environ.get("VIRTUAL_ENV", "")
    return venv if venv and cluster.is_shared(Path(venv)) else ""


def send_files(cluster: Cluster, ranks: list[int], files: list[str]) -> None:
    """Copy each file to the pods that do not see it at the same path (over the fabric's SSH)."""
    todo = [f for f in files if not cluster.is_shared(Path(f))]

    def one(rank: int) -> None:
        for f in todo:
            remote = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
            with open(f, "rb") as src:
                res = subprocess.run(cluster.ssh(rank, ["sh", "-c", remote, "_", f]), stdin=src, capture_output=True, check=False)
            if res.returncode:
                raise RuntimeError(f"cannot copy {f}: {res.stderr.decode(errors='replace').strip()}")

    bad = {r: e for r, e in parallel(one, [r for r in ranks if r != cluster.me]).items() if e}
    if bad:
        die("\n  ".join(f"{cluster.label(r)}: {e}" for r, e in sorted(bad.items())))


def run_pip(cluster: Cluster, ranks: list[int], words: list[str], count: int, timeout: float) -> dict[int, int]:
    """`python3 -m pip <words>` on each of `ranks` at once, output prefixed by rank; then each marks `count` applied."""
    script = f'python3 -m pip "$@" && mkdir -p "$HOME/{os.path.dirname(PIP_APPLIED)}" && echo {count} > "$HOME/{PIP_APPLIED}"'

    def one(rank: int) -> int:
        argv = ["bash", "-c", script, "_", *words]
        argv = argv if rank == cluster.me else cluster.ssh(rank, argv)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 600, check=False)
        for line in (res.stdout + res.stderr).splitlines():
            print(f"[{rank}] {line}", flush=True)
        return res.returncode

    return {r: (c if isinstance(c, int) else 1) for r, c in parallel(one, ranks).items()}


def cmd_pip(args: argparse.Namespace) -> int:
    cluster = Cluster()
    words = list(args.words[1:] if args.words[:1] == ["--"] else args.words)
    if not words:
        die("nothing to do: ml-dev pip install <package> ... (any pip command)")
    words, files = with_paths(words)
    shared = shared_target(cluster, words)
    ranks = [cluster.me] if shared else list(range(len(cluster.hosts)))
    if not shared:
        send_files(cluster, ranks, files)
    log = read_log()
    changes = words[0] in ("install", "uninstall")
    results = run_pip(cluster, ranks, words, len(log) + 1 if changes else len(log), args.timeout)
    bad = {r: c for r, c in results.items() if c}
    where = f"once, into {shared} on shared storage" if shared else f"on {len(ranks)} pods"
    if bad:
        for r, c in sorted(bad.items()):
            print(f"ml-dev: {cluster.label(r)}: pip exited {c}", file=sys.stderr)
        return max(bad.values())
    if changes:
        try:
            log_path().parent.mkdir(parents=True, exist_ok=True)
            with log_path().open("a") as f:
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                f.write(json.dumps({"at": at, "args": words, "shared": bool(shared)}) + "\n")
        except OSError as exc:
            print(f"ml-dev: warning: cannot append to the pip log {log_path()}: {exc}", file=sys.stderr)
    print(f"ml-dev: pip {words[0]} ran {where}; every `ml-dev run` checks that the ranks' environments match", flush=True)
    return 0


def replay(cluster: Cluster, answers: dict[int, int], timeout: float) -> list[int]:
    """(the launcher, at the gate) the pip log's commands each pod has not run (a pod added by a resize: none), on
    that pod, in order; returns the ranks that ran any."""
    log = read_log()
    behind = sorted(r for r, n in answers.items() if n < len(log) and r != cluster.me)
    for rank in behind:
        print(f"ml-dev: {cluster.label(rank)} has not run {len(log) - answers[rank]} command(s) of the pip log: running them there first")
        for n in range(answers[rank], len(log)):
            send_files(cluster, [rank], [w for w in log[n] if w.startswith("/") and os.path.isfile(w)])
            if run_pip(cluster, [rank], log[n], n + 1, timeout)[rank]:
                die(f"{cluster.label(rank)}: `pip {' '.join(log[n])}` of the pip log ({log_path()}) failed there")
    return behind
