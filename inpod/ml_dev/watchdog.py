"""The run side of `ml-dev why`, all that `ml-dev run` and each rank agent load of it: the run id and what a rank's
environment gets, the progress relay, the watchdog (the verdict itself is why.py, run as `ml-dev-why`).

`ml-dev run`'s watchdog: when the run makes no progress for `lifecycle.stallVerdictSeconds` (no output line from any
rank and no touch of $ML_DEV_PROGRESS_FILE on any pod), it runs `ml-dev why` itself (why.verdict_for), prints the
verdict once per stall and keeps it with the run. The rank heartbeat cannot see a hang (its thread beats on while the job
is wedged); the output and the progress file can.

The progress file is per pod: each rank agent (`_rank`) watches its own and tells the launcher over its stderr
(PROGRESS_MARK, a line the launcher swallows), so a job that prints only on rank 0 still shows progress everywhere.
Python 3.8+, standard library only (shipped next to ml-dev).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from .. import contract
from .common import HERE, PY, STATE_DIR

SAMPLES = 3
INTERVAL = 1.0
MIN_INTERVAL = 1.0
"""Decided with the issue: a straggler holds in two samples at least 1 s apart, never one."""
RUN_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")
WHY_LAUNCHER = "ml-dev-why"
"""why.py's launcher beside ml-dev: the verdict runs in a process of its own (the launcher and the rank agents never
load the sampler and the merge: a ConfigMap mount keeps no bytecode, so every import compiles)."""
PROGRESS_MARK = "ml-dev: PROGRESS"
"""A rank agent's stderr line when its pod's progress file was touched; the launcher counts it and never prints it."""
POLL_SECONDS = 1.0


def stall_seconds(values: dict[str, str] | None = None) -> int:
    """lifecycle.stallVerdictSeconds as the pod's env carries it (0: never)."""
    text = (values or {}).get(contract.STALL_SECONDS_ENV) or os.environ.get(contract.STALL_SECONDS_ENV, "")
    return int(text) if text.isdigit() else contract.STALL_DEFAULT


class ProgressRelay(threading.Thread):
    """(in the rank agent) PROGRESS_MARK on stderr whenever the progress file's modification time changes."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()

    def _mtime(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return 0.0

    def run(self) -> None:
        seen = self._mtime()
        while not self.stop.wait(POLL_SECONDS):
            now = self._mtime()
            if now != seen:
                seen = now
                try:
                    os.write(2, (PROGRESS_MARK + "\n").encode())
                except OSError:
                    return


class Watchdog(threading.Thread):
    """(in the launcher) `verdict()` once per stall of `seconds`; `progress()` on every output line or progress mark."""

    def __init__(self, seconds: float, verdict: Callable[[], Any], out: Any = None) -> None:
        super().__init__(daemon=True)
        self.seconds = seconds
        self.verdict = verdict
        self.out = out or sys.stderr
        self.last = time.monotonic()
        self.fired = False
        self.stop = threading.Event()
        self.verdicts: list[Any] = []

    def progress(self) -> None:
        self.last = time.monotonic()
        self.fired = False

    def run(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            if self.fired or time.monotonic() - self.last < self.seconds:
                continue
            self.fired = True  # once per stall: the next output line or progress mark re-arms it
            silent = time.monotonic() - self.last
            self.out.write(f"ml-dev: no progress for {silent:.0f} s (no output, no progress file touched): asking every rank why\n")
            self.out.flush()
            try:
                self.verdicts.append(self.verdict())
            except SystemExit:
                pass
            except Exception as exc:  # the run goes on whatever the verdict did
                self.out.write(f"ml-dev: the stall verdict failed: {exc}\n")
                self.out.flush()


def new_run_id() -> str:
    """A run's id: its UTC start and 6 random hex digits (sorts by time, unique across pods)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def rank_env(run: str, launcher: str, values: dict[str, str]) -> dict[str, str]:
    """What `ml-dev run` adds to a rank's environment: the run id, the progress file, and where Flight Recorder's pipe and
    dumps go (only when the job has not chosen: PyTorch reads them, ProcessGroupNCCL.cpp DumpPipe)."""
    base = STATE_DIR / contract.RUN_STATE_DIR / run
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    out = {contract.RUN_ID_ENV: run, contract.PROGRESS_FILE_ENV: str(base / "progress")}
    if "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in values:
        out["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = str(base / "fr-pipe-")
    if "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in values and "TORCH_FR_DUMP_TEMP_FILE" not in values:
        # both names, one value: TORCH_FR_DUMP_TEMP_FILE is the name torch >= 2.10 reads first, the old one the name
        # older releases read (torch 2.11 warns that the old name is deprecated, even with both set: harmless)
        out["TORCH_FR_DUMP_TEMP_FILE"] = out["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(base / "fr-dump-")
    return out


def why_command(run: str) -> list[str]:
    """The watchdog's verdict: `ml-dev why --run <run>` as a process of its own."""
    return [PY, str(HERE / WHY_LAUNCHER), "why", "--run", run]


def verdict_now(run: str, out: Any) -> int:
    """Run the verdict, its lines to `out` (the launcher's stderr); its exit status."""
    res = subprocess.run(why_command(run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    out.write(res.stdout)
    out.flush()
    return res.returncode
