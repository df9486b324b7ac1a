"""`ml-dev _why-sample` (on every pod): every process of every rank of a run, sampled with py-spy, its Flight Recorder
dumps triggered and read, the pod's NCCL RAS asked; one JSON report on stdout for `ml-dev why` to merge.

Stacks only: py-spy runs without --locals, and nothing of a process's environment leaves this module (the environ is
read for RANK/LOCAL_RANK numbers and Flight Recorder's pipe path only). Shipped next to ml-dev (inpod.SHIPPED);
Python 3.8+, standard library only.

Who may sample (the kernel's rules, as `ml-dev why` reports them):
* ptrace access (py-spy attaches, or reads /proc/<pid>/mem and process_vm_readv): kernel/ptrace.c
  __ptrace_may_access: the same real/effective/saved UID and GID as the target, else CAP_SYS_PTRACE; a target
  whose capabilities are not a subset of the caller's also needs CAP_SYS_PTRACE (security/commoncap.c
  cap_ptrace_access_check); a non-dumpable target (get_dumpable) needs it too.
* Yama (security/yama/yama_lsm.c yama_ptrace_access_check, `kernel.yama.ptrace_scope`): 0 adds nothing; 1 admits
  only an ancestor of the target (task_is_descendant), a tracer the target named with prctl(PR_SET_PTRACER), or
  CAP_SYS_PTRACE; 2 only CAP_SYS_PTRACE; 3 nobody.
* seccomp: CRI-O's RuntimeDefault (internal/config/seccomp/seccomp.go DefaultProfile, containers/common
  pkg/seccomp/default_linux.go) allows ptrace and process_vm_readv since containers/common v0.48
  (containers/buildah#3833, "Add ptrace as a default seccomp allow to match Docker").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .. import contract
from .collectives import ask_ras, library, read_fr_dump
from .common import STATE_DIR

PY_SPY_SECONDS = 8
"""How long one `py-spy dump` may take (a large process with many threads: well under a second on the test machine)."""
FR_WAIT_SECONDS = 30
"""How long a rank's Flight Recorder dump may take to appear after its pipe was written. PyTorch symbolises each
entry's C++ stack before it writes (ProcessGroupNCCL::dumpDebuggingInfo, `dump_nccl_trace(.., includeStackTrace=true,
..)`, then DebugInfoWriter::write): torch 2.11 with NCCL 2.28.9 on an H200 took 4.3 s for 2,000 entries between the
pipe's "preparing to dump debug info" and the write, so the first bound (5 s) missed it. The triggers of all ranks run
at once, beside the py-spy samples, so this bound is not added per rank."""
REFUSED = ("Permission Denied", "Operation not permitted", "os error 1)", "os error 13)")
NOT_PYTHON = ("Failed to find python version", "Failed to find a python interpreter", "not a python", "Failed to get process")
CAP_SYS_PTRACE = 19


def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def processes() -> dict[int, tuple[int, int, str, str]]:
    """{pid: (parent, process group, state, name)} of this pod's processes (/proc/<pid>/stat: world-readable)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        text = read(f"/proc/{entry}/stat")
        if ")" not in text:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        try:
            table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0], name)
        except (IndexError, ValueError):
            continue
    return table


def rank_processes(agent: int, pgid: int, table: dict[int, tuple[int, int, str, str]]) -> list[int]:
    """The rank's processes: its process group and every descendant of its agent (torchrun's workers run in sessions of
    their own), the agent itself not; zombies not."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(agent, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    found |= {pid for pid, (_, group, _, _) in table.items() if group == pgid}
    found.discard(agent)
    return sorted(p for p in found if p in table and table[p][2] != "Z")


def uids(pid: int | str) -> list[int]:
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def has_cap_sys_ptrace() -> bool:
    for line in read("/proc/self/status").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def yama_scope() -> int | None:
    """kernel.yama.ptrace_scope, None where the kernel has no Yama (/proc/sys/kernel/yama absent)."""
    text = read("/proc/sys/kernel/yama/ptrace_scope").strip()
    return int(text) if text.isdigit() else None


def refusal(pid: int) -> str:
    """Why the kernel refused to let this sampler read `pid`, and what would allow it (words for the verdict)."""
    mine, theirs = os.getuid(), uids(pid)
    scope = yama_scope()
    cap = has_cap_sys_ptrace()
    if theirs and (theirs[0] != mine or len(set(theirs)) > 1) and not cap:
        return (
            f"refused by the kernel: the sampler runs as UID {mine}, the rank as UID {theirs[0]} "
            "(ptrace needs the same UID or CAP_SYS_PTRACE: kernel/ptrace.c __ptrace_may_access); run `ml-dev why` as the "
            "rank's user"
        )
    if scope == 1 and not cap:
        return (
            "refused by the kernel: kernel.yama.ptrace_scope=1 admits only the rank's ancestors, a tracer it named with "
            "prctl(PR_SET_PTRACER) or CAP_SYS_PTRACE (security/yama/yama_lsm.c); a node with ptrace_scope 0 allows it"
        )
    if scope in (2, 3):
        return f"refused by the kernel: kernel.yama.ptrace_scope={scope} ({'CAP_SYS_PTRACE only' if scope == 2 else 'no attach at all'})"
    return (
        "refused by the kernel: the rank is not dumpable or holds capabilities the sampler lacks "
        "(security/commoncap.c cap_ptrace_access_check)"
    )


def py_spy() -> str | None:
    """The py-spy binary: $ML_DEV_PY_SPY, else on PATH (the base image's pip installs it into its bin directory)."""
    return os.environ.get("ML_DEV_PY_SPY") or shutil.which("py-spy")


def dump(binary: str, pid: int) -> dict[str, Any]:
    """One `py-spy dump --json` of `pid`: {"threads": [...]} (frames innermost first, no locals) or {"error": kind, ...}."""
    try:
        res = subprocess.run(
            [binary, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": "timeout", "detail": f"py-spy took over {PY_SPY_SECONDS} s"}
    except OSError as exc:
        return {"error": "missing", "detail": str(exc)}
    if res.returncode == 0:
        try:
            raw = json.loads(res.stdout)
        except ValueError:
            return {"error": "unreadable", "detail": res.stdout[:200]}
        threads = []
        for t in raw:
            frames = [
                {"name": f.get("name", "?"), "file": f.get("short_filename") or f.get("filename", "?"), "line": f.get("line", 0),
                 "lib": library(str(f.get("filename", "")))}
                for f in t.get("frames") or []
            ]  # fmt: skip
            main = t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"
            threads.append({"name": t.get("thread_name") or "", "main": bool(main), "idle": not t.get("active"), "frames": frames})
        return {"threads": threads}
    text = (res.stderr or res.stdout).strip()
    first = text.splitlines()[0] if text else f"py-spy exited {res.returncode}"
    if any(k in text for k in REFUSED):
        return {"error": "refused", "detail": refusal(pid)}
    if not os.path.exists(f"/proc/{pid}"):
        return {"error": "gone", "detail": "the process ended"}
    if any(k.lower() in text.lower() for k in NOT_PYTHON):
        return {"error": "not-python", "detail": first}
    return {"error": "failed", "detail": first}


def proc_state(pid: int) -> dict[str, str]:
    """What /proc tells anyone about a process (the stand-in when py-spy is refused): its state and kernel wait."""
    stat = read(f"/proc/{pid}/stat")
    state = stat.rsplit(")", 1)[1].split()[0] if ")" in stat else "?"
    wchan = read(f"/proc/{pid}/wchan").strip()
    return {"state": state, "wchan": wchan if wchan not in ("", "0") else ""}


def environ_of(pid: int) -> dict[str, str] | None:
    """The process's environment (same UID only), None when refused. Used here only, never reported."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def torch_loaded(pid: int) -> bool | None:
    """Whether the process mapped libtorch (None: its maps are not readable to this sampler)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return b"libtorch" in f.read()
    except OSError:
        return None


def dump_prefix(values: dict[str, str]) -> str:
    """Where a rank's Flight Recorder dump goes (`<prefix><rank>`): the names in the order PyTorch reads them
    (torch/csrc/distributed/c10d/FlightRecorder.cpp DebugInfoWriter::getWriter, `getCvarString({"TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}, ..)`); `ml-dev run` sets both to one value (watchdog.rank_env)."""
    return values.get("TORCH_FR_DUMP_TEMP_FILE") or values.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "/tmp/nccl_trace_rank_"


def trigger_fr(pid: int, values: dict[str, str]) -> dict[str, Any]:
    """Ask a torch rank for its Flight Recorder dump through its pipe and read the dump.

    PyTorch (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, DumpPipe): with TORCH_NCCL_DEBUG_INFO_PIPE_FILE set
    and a trace buffer (TORCH_FR_BUFFER_SIZE, formerly TORCH_NCCL_TRACE_BUFFER_SIZE) above 0, each rank makes the FIFO
    `<pipe file><rank>.pipe`; anything written to it makes the watchdog dump to `<dump_prefix><rank>`."""
    rank = values.get("RANK", "")
    stem = values.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
    size = values.get("TORCH_FR_BUFFER_SIZE") or values.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    if not stem:
        return {"status": "off", "detail": "TORCH_NCCL_DEBUG_INFO_PIPE_FILE is not set for this rank"}
    if not size.isdigit() or int(size) <= 0:
        return {"status": "off", "detail": "no trace buffer (TORCH_FR_BUFFER_SIZE is 0 or unset)"}
    pipe = f"{stem}{rank}.pipe"
    out = dump_prefix(values) + rank
    before = os.stat(out).st_mtime if os.path.exists(out) else 0.0
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"status": "failed", "detail": f"its dump pipe does not answer ({exc.strerror})"}
    try:
        os.write(fd, b"1\n")
    finally:
        os.close(fd)
    deadline = time.monotonic() + FR_WAIT_SECONDS
    while time.monotonic() < deadline:
        if os.path.exists(out) and os.stat(out).st_mtime > before:
            time.sleep(0.2)  # the writer renames a finished file into place; a partial read is retried below
            parsed = read_fr_dump(Path(out))
            if parsed is not None:
                return {"status": "used", "rank": int(rank) if rank.isdigit() else None, "dump": parsed}
        time.sleep(0.1)
    return {"status": "failed", "detail": f"no dump within {FR_WAIT_SECONDS} s of writing its pipe"}


def heartbeats(run: str | None) -> list[dict[str, Any]]:
    """The live rank agents of this pod (heartbeat/rank-<pid>.json), of run `run` when given."""
    found = []
    for path in sorted((STATE_DIR / contract.HEARTBEAT_DIR).glob("rank-*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or not os.path.exists(f"/proc/{info.get('pid')}"):
            continue
        if run and info.get("run") != run:
            continue
        found.append(info)
    return found


def sample_pod(run: str | None, samples: int, interval: float) -> dict[str, Any]:
    """This pod's report: its ranks' processes sampled `samples` times, `interval` seconds apart (at least); a pod
    without any answers at once.

    Why one function: one sampling loop over this pod's ranks, each round reading what the last one found.
    """
    binary = py_spy()
    report: dict[str, Any] = {
        "pod": os.environ.get("POD_NAME") or socket.gethostname(),
        "node": os.environ.get("NODE_NAME", ""),
        "sampler_uid": os.getuid(),
        "yama": yama_scope(),
        "py_spy": binary or "",
        "agents": [],
        "ras": None,
    }
    agents = heartbeats(run)
    table = processes()
    for info in agents:
        procs = []
        for pid in rank_processes(int(info["pid"]), int(info.get("pgid") or 0), table):
            values = environ_of(pid)
            procs.append(
                {
                    "pid": pid,
                    "ppid": table[pid][0],
                    "name": table[pid][3],
                    "rank": (values or {}).get("RANK"),
                    "local_rank": (values or {}).get("LOCAL_RANK"),
                    "samples": [],
                    "_env": values,
                }
            )
        report["agents"].append({"run": info.get("run"), "launcher": info.get("launcher"), "agent": info["pid"], "processes": procs})
    everyone = [p for a in report["agents"] for p in a["processes"]]
    # Flight Recorder dumps take seconds (FR_WAIT_SECONDS): every torch rank's is asked for first, all at once, and
    # read while py-spy samples.
    fr_threads = []
    for proc in everyone:
        if proc["_env"] is not None and torch_loaded(proc["pid"]):

            def ask(proc: dict[str, Any] = proc) -> None:
                proc["fr"] = trigger_fr(proc["pid"], proc["_env"])

            fr_threads.append(threading.Thread(target=ask, daemon=True))
    for t in fr_threads:
        t.start()
    # no rank process here: nothing to sample, no interval to wait (the processes are found once, above)
    for k in range(max(1, samples) if everyone else 0):
        began = time.monotonic()
        stamp = time.time()

        def one(proc: dict[str, Any], stamp: float = stamp) -> None:
            if proc["samples"] and proc["samples"][-1].get("error") in ("not-python", "gone"):
                again = dict(proc["samples"][-1], at=stamp)
                if again.get("error") == "not-python":  # py-spy once; its state and wait each time
                    again["proc"] = proc_state(proc["pid"])
                proc["samples"].append(again)
                return
            result: dict[str, Any] = {"error": "missing", "detail": "py-spy is not installed in this image"}
            if binary:
                result = dump(binary, proc["pid"])
            if result.get("error") in ("refused", "missing", "failed", "timeout", "not-python"):
                result["proc"] = proc_state(proc["pid"])  # what /proc tells anyone stands in for the stack
            result["at"] = stamp
            proc["samples"].append(result)

        threads = [threading.Thread(target=one, args=(p,)) for p in everyone]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if k + 1 < samples:
            time.sleep(max(0.0, interval - (time.monotonic() - began)))
    for t in fr_threads:
        t.join(FR_WAIT_SECONDS + 5)
    ras_addr = "127.0.0.1:28028"
    for proc in everyone:
        values = proc.pop("_env")
        python = any("threads" in s for s in proc["samples"])
        loaded = torch_loaded(proc["pid"]) if python else False
        if "fr" in proc:
            ras_addr = (values or {}).get("NCCL_RAS_ADDR") or ras_addr
        elif loaded and values is not None:
            proc["fr"] = {"status": "failed", "detail": f"no dump within {FR_WAIT_SECONDS} s of writing its pipe"}
        elif loaded is None and python:
            proc["fr"] = {"status": "refused", "detail": "its memory maps are not readable to this sampler"}
        elif python:
            proc["fr"] = {"status": "no-torch", "detail": "torch is not loaded"}
    if everyone:
        report["ras"] = ask_ras(ras_addr)
    return report
