"""`ml-dev logs [RUN] [--rank N] [-f]`: a run's output read back from the run logs its rank agents keep.

Every rank agent of `ml-dev run` writes each line of its rank's output (and its own lines) to
`<records_dir>/runs/<run>/logs/rank<N>.log` on its pod (the environment's own folder of the workspace:
`$ML_DEV_WORKSPACE/.ml-dev-env/env/<app>/`, inpod/lib/pod.py env_records_dir), whatever became of the
launcher (launch.RankOutput), and ends it with `contract.RUN_LOG_END<status>` once it has stopped its group. This
reads them: a rank's log from this pod's workspace when it is there (the launching pod, or a shared workspace), else
from its pod over the SSH fabric (`ml-dev _log` there). `-f` follows until the rank's last line, or until no agent of
the run is left on that pod. Python 3.8+, standard library only (shipped next to ml-dev).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from .. import contract
from ..lib.pod import env_records_dir
from .common import HERE, PY, STATE_DIR, Cluster, die

POLL_SECONDS = 0.2


def runs_dir() -> Path:
    return env_records_dir() / contract.RUNS_SUBDIR


def log_path(run: str, rank: int | str) -> Path:
    return runs_dir() / run / contract.RUN_LOG_DIR / f"{contract.RUN_LOG_PREFIX}{rank}{contract.RUN_LOG_SUFFIX}"


def newest_run() -> str | None:
    """The newest run with a log on this pod (run ids sort by their start time)."""
    try:
        found = [d.name for d in runs_dir().iterdir() if (d / contract.RUN_LOG_DIR).is_dir()]
    except OSError:
        return None
    return max(found) if found else None


def agent_alive(run: str) -> bool:
    """Whether a rank agent of `run` still runs on this pod (its heartbeat record, its process)."""
    for path in (STATE_DIR / contract.HEARTBEAT_DIR).glob("rank-*.json"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("run") == run and os.path.exists(f"/proc/{info.get('pid')}"):
            return True
    return False


def read_log(path: Path, run: str, follow: bool, write: Callable[[str], None]) -> bool:
    """Every line of the log to `write`; following, until its last line (RUN_LOG_END) or until no agent of the run
    is left here and nothing more came. False when there is no log (and, following, no agent that could write one)."""
    while not path.exists():
        if not follow or not agent_alive(run):
            return False
        time.sleep(POLL_SECONDS)
    with open(path, "rb") as f:
        rest = b""
        idle = 0
        while True:
            chunk = f.read(1 << 16)
            if chunk:
                idle = 0
                rest += chunk
                *lines, rest = rest.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace")
                    write(line)
                    if line.startswith(contract.RUN_LOG_END):
                        return True
                continue
            if not follow or (idle >= 2 and not agent_alive(run)):
                if rest:
                    write(rest.decode(errors="replace"))
                return True
            idle += 1
            time.sleep(POLL_SECONDS)


def cmd_log_here(args: argparse.Namespace) -> int:
    """(`ml-dev _log`, on the rank's pod) its log on stdout; 3: there is none."""

    def write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    if not read_log(log_path(args.run, args.rank), args.run, args.follow, write):
        print(f"ml-dev: no log of run {args.run} for rank {args.rank} at {log_path(args.run, args.rank)}", file=sys.stderr)
        return 3
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    cluster = Cluster()
    run = args.run or newest_run()
    if not run:
        die(f"no run log on this pod ({runs_dir()}): name the run (ml-dev logs RUN), as `ml-dev run` printed it")
    assert run is not None
    ranks = [args.rank] if args.rank is not None else list(range(len(cluster.hosts)))
    bad = [r for r in ranks if not 0 <= r < len(cluster.hosts)]
    if bad:
        die(f"--rank {bad[0]}: the ranks are 0-{len(cluster.hosts) - 1}", 2)
    lock = threading.Lock()
    missing: list[str] = []

    def one(rank: int) -> None:
        prefix = "" if len(ranks) == 1 else f"[{rank}] "

        def write(line: str) -> None:
            with lock:
                try:
                    sys.stdout.write(prefix + line + "\n")
                    sys.stdout.flush()
                except (OSError, ValueError):
                    pass

        here = log_path(run, rank)
        if rank == cluster.me or here.exists():  # this pod's own, or a workspace every pod shares
            if not read_log(here, run, args.follow, write):
                missing.append(f"{cluster.label(rank)}: no log at {here} on {cluster.pods[rank]}")
            return
        argv = [PY, str(HERE / "ml-dev"), "_log", "--run", run, "--rank", str(rank)] + (["-f"] if args.follow else [])
        proc = subprocess.Popen(cluster.ssh(rank, argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        for raw in iter(proc.stdout.readline, b""):
            write(raw.decode(errors="replace").rstrip("\n"))
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait()
        if code == 3:
            missing.append(f"{cluster.label(rank)}: no log at {here} on {cluster.pods[rank]}")
        elif code:
            missing.append(f"{cluster.label(rank)}: not read: {cluster.explain(rank, err, code)}")

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for line in missing:
        print(f"ml-dev: {line}", file=sys.stderr)
    return 1 if missing else 0
