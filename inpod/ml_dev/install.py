"""ml-dev pip: one `pip` command for the whole environment (install once, every rank has it), and its log, which a pod
that never ran it (added by a resize) replays at the gate before its first rank starts.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.

Where pip installs decides where it runs: into a folder on shared storage (an activated virtualenv, `--target`,
`--prefix` on a shared volume) once, on this pod (every pod sees the folder); anywhere else (the image's
site-packages in the pod's own layer, the user site under HOME, which is each pod's own in every storage mode) on
every pod at once, through the fabric (the rank agents of `ml-dev exec`, so a venv's PATH and PIP_* travel). A wheel
or requirements file named by path is copied first to the pods that do not see it. Every pip command that worked is
appended to `<records_dir>/env-gate/pip.jsonl` (contract.ENV_PIP_LOG); each pod keeps how many of those it ran in
its HOME (contract.ENV_PIP_APPLIED), so a pod added by a resize (a new HOME) is given the whole log at the gate (`replay`).
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
from . import envgate
from .common import Cluster, die, parallel, wait_reachable
from .envgate import records
from .sync import tree_root

SHARED_OPTIONS = ("--target", "-t", "--prefix", "--root")


def pip_log_path() -> Path:
    return records() / contract.ENV_PIP_LOG


def read_pip_log() -> list[tuple[list[str], bool]]:
    """The pip log's commands in order: (pip's words, whether it ran once into a folder on shared storage)."""
    try:
        lines = pip_log_path().read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
            out.append(([str(w) for w in entry["args"]], bool(entry.get("shared"))))
        except (ValueError, KeyError, TypeError):
            continue
    return out


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


def run_pip(cluster: Cluster, ranks: list[int], words: list[str], count: int, mark_only: bool = False) -> dict[int, int]:
    """`python3 -m pip <words>` on each of `ranks` at once, output prefixed by rank; then each marks `count` applied
    (`mark_only`: no pip, the mark alone: a command that ran once into a folder every pod sees)."""
    mark = f'"$HOME/{contract.ENV_PIP_APPLIED}"'
    pip = "true" if mark_only else 'python3 -m pip "$@"'
    script = f'{pip} && mkdir -p "$(dirname {mark})" && echo {count} > {mark}'

    def one(rank: int) -> int:
        argv = ["bash", "-c", script, "_", *words]
        argv = argv if rank == cluster.me else cluster.ssh(rank, argv)
        res = subprocess.run(argv, capture_output=True, text=True, check=False)  # bounded by pip's own timeouts
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
    wait_reachable(cluster, args.timeout)
    shared = shared_target(cluster, words)
    ranks = [cluster.me] if shared else list(range(len(cluster.hosts)))
    if not shared:
        send_files(cluster, ranks, files)
    log = read_pip_log()
    changes = words[0] in ("install", "uninstall")
    results = run_pip(cluster, ranks, words, len(log) + 1 if changes else len(log))
    bad = {r: c for r, c in results.items() if c}
    where = f"once, into {shared} on shared storage" if shared else f"on {len(ranks)} pods"
    if bad:
        for r, c in sorted(bad.items()):
            print(f"ml-dev: {cluster.label(r)}: pip exited {c}", file=sys.stderr)
        return max(bad.values())
    if changes and shared:  # every other pod sees that folder: it holds the command as run
        run_pip(cluster, [r for r in range(len(cluster.hosts)) if r != cluster.me], [], len(log) + 1, mark_only=True)
    if changes:
        try:
            pip_log_path().parent.mkdir(parents=True, exist_ok=True)
            with pip_log_path().open("a") as f:
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                f.write(json.dumps({"at": at, "args": words, "shared": bool(shared)}) + "\n")
        except OSError as exc:
            print(f"ml-dev: warning: cannot append to the pip log {pip_log_path()}: {exc}", file=sys.stderr)
    print(f"ml-dev: pip {words[0]} ran {where}; every `ml-dev run` checks that the ranks' environments match", flush=True)
    return 0


def replay(cluster: Cluster, answers: dict[int, int]) -> list[int]:
    """(the launcher, at the gate) the pip log's commands each pod has not run (a pod added by a resize: none), on
    that pod, in order; returns the ranks that ran any."""
    log = read_pip_log()
    behind = sorted(r for r, n in answers.items() if n < len(log) and r != cluster.me)
    for rank in behind:
        print(f"ml-dev: {cluster.label(rank)} has not run {len(log) - answers[rank]} command(s) of the pip log: running them there first")
        for n in range(answers[rank], len(log)):
            words, shared = log[n]
            if not shared:
                send_files(cluster, [rank], [w for w in words if w.startswith("/") and os.path.isfile(w)])
            if run_pip(cluster, [rank], words, n + 1, mark_only=shared)[rank]:
                die(f"{cluster.label(rank)}: `pip {' '.join(words)}` of the pip log ({pip_log_path()}) failed there")
    return behind


BASE_OWNED = ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton", "flash-attn", "flash-attn-3", "apex")
BASE_OWNED_PREFIXES = ("transformer-engine", "nvidia-")
"""What the runtime stage may never pin (images/runtime.Containerfile holds the base's CUDA-bound packages; the nvidia-*
CUDA wheels come with torch)."""
RUNTIME_REQUIREMENTS = "images/runtime-requirements.txt"
"""The file the runtime image build reads (REQUIREMENTS_FILE=runtime-requirements.txt, images/README.md)."""


def container_start() -> float:
    """When this container's PID 1 started (seconds since the epoch): /proc/1/stat's starttime (clock ticks since boot,
    proc(5)) plus the boot time (/proc/stat btime)."""
    try:
        ticks = int(Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def on_top() -> dict[str, tuple[str, str]]:
    """name -> (version, where) of every distribution installed on top of the image: in a sys.path folder under HOME,
    the workspace or an activated virtualenv (volumes: they outlive the container), or written into the image's own
    folders since this container started (its writable layer)."""
    fp, _ = envgate.take(dict(os.environ))
    started = container_start()
    roots = [os.environ.get(k, "") for k in ("HOME", contract.WORKSPACE_ENV, "VIRTUAL_ENV")]
    roots = [r.rstrip("/") + "/" for r in roots if r and r.strip("/")]
    found: dict[str, tuple[str, str]] = {}
    for entry, exists, _ in fp["sys_path"]:  # type: ignore[attr-defined]
        entry = os.path.expanduser(str(entry))
        if not exists or not os.path.isdir(entry):
            continue
        volume = any((entry + "/").startswith(r) for r in roots)
        for item in sorted(os.listdir(entry)):
            if not item.endswith(".dist-info"):
                continue
            folder = os.path.join(entry, item)
            name = envgate.norm_name(item[: -len(".dist-info")].partition("-")[0])
            if name in found or not (volume or os.stat(folder).st_mtime > started):
                continue
            found[name] = (item[: -len(".dist-info")].partition("-")[2] or envgate.read_version(folder), local_source(folder))
    return found


def local_source(folder: str) -> str:
    """The local file or folder a distribution was installed from (PEP 610 direct_url.json), "" from an index."""
    try:
        url = str(json.loads((Path(folder) / "direct_url.json").read_text()).get("url") or "")
    except (OSError, ValueError, AttributeError):
        return ""
    return url if url.startswith("file:") else ""


def freeze_into(text: str, pins: dict[str, str], stamp: str) -> str:
    """`text` (a requirements file) with each pin of `pins` replacing that name's line, new ones appended."""
    out, seen = [], set()
    for line in text.splitlines():
        name = (
            envgate.norm_name(line.split("==", 1)[0].split(">", 1)[0].split("<", 1)[0].strip())
            if line.strip() and not line.startswith(("#", "-"))
            else ""
        )
        if name in pins:
            out.append(pins[name])
            seen.add(name)
        else:
            out.append(line)
    new = [pins[n] for n in sorted(pins) if n not in seen]
    if new:
        out += [f"# added by `ml-dev freeze` {stamp}", *new]
    return "\n".join(out) + "\n"


def cmd_freeze(args: argparse.Namespace) -> int:
    target = Path(args.output) if args.output else tree_root(Path.cwd()) / RUNTIME_REQUIREMENTS
    if not target.is_file():
        die(f"{target}: no such file; run ml-dev freeze in the repository the image build reads, or pass --output FILE")
    found = on_top()
    owned = sorted(n for n in found if n in BASE_OWNED or n.startswith(BASE_OWNED_PREFIXES))
    local = sorted(n for n in found if found[n][1] and n not in owned)
    pins = {n: f"{n}=={v}" for n, (v, _) in found.items() if n not in owned}
    stamp = time.strftime("%Y-%m-%d", time.gmtime()) + " on " + (os.environ.get("POD_NAME") or os.uname()[1])
    target.write_text(freeze_into(target.read_text(), pins, stamp))
    for n in owned:
        print(f"ml-dev freeze: {n} {found[n][0]} left out: the base image owns it (images/presets.yaml, base.Containerfile)")
    for n in local:
        print(f"ml-dev freeze: {n} {found[n][0]} came from {found[n][1]}: the image build's package index must offer it")
    print(f"ml-dev freeze: {len(pins)} pin(s) in {target} ({', '.join(sorted(pins.values())) or 'nothing on top of the image'})")
    return 0
