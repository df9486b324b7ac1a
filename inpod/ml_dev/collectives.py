"""The collective sources of `ml-dev why`: PyTorch's Flight Recorder dumps and NCCL's RAS status, read and merged.

Flight Recorder (PyTorch torch/csrc/distributed/c10d/FlightRecorder.hpp, FlightRecorderDetail.hpp dump_entries; the
keys below are its DEFINE_CONSTANT names): a dump is {"version", "pg_config", "pg_status", "entries": [...]}, each entry
{"record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name" (e.g.
"nccl:all_reduce"), "time_created_ns", "state" ("scheduled", "started", "completed"), "frames": [{"name", "filename",
"line"}], ...}; pickled by default, JSON when asked (`_dump_nccl_trace_json`). The cross-rank rule is fr_trace's
(torch/distributed/flight_recorder): the rank whose last collective is behind the others' has not entered it.

NCCL RAS (NCCL >= 2.24, on by default, NCCL User Guide "RAS"; NVIDIA/nccl src/ras): every NCCL process listens on
127.0.0.1:28028 (NCCL_RAS_ADDR) and answers a plain-text `STATUS` (`VERBOSE STATUS`) with the job summary, a
Communicators table (Status RUNNING/INIT/FINALIZE..., Errors OK/MISMATCH/INCOMPLETE...) and Errors/Warnings sections.

Python 3.8+, standard library only (shipped next to ml-dev).
"""

from __future__ import annotations

import io
import json
import pickle
import re
import socket
from pathlib import Path
from typing import Any

RAS_SECONDS = 10
"""How long the RAS query may take: RAS waits for unresponsive processes (the docs' example took 2.05 s)."""
ENTERED = ("scheduled", "started")


LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3")


def library(filename: str) -> bool:
    """A frame of the interpreter's library or an installed package (torch's own included), not the job's code: py-spy's
    stacks (sampler.py) and Flight Recorder's frames are both judged by it."""
    return filename.startswith("<") or any(part in filename for part in LIBRARY_PARTS)


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles dicts, lists, strings and numbers only: any class reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the dump names {module}.{name}: not a Flight Recorder dump")


def read_fr_dump(path: Path) -> dict[str, Any] | None:
    """A dump (JSON or pickle), summarised per process group; None when it is not (yet) a whole dump."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    data: Any
    try:
        data = json.loads(raw)
    except ValueError:
        try:
            data = _PlainUnpickler(io.BytesIO(raw)).load()
        except Exception:  # a partial or foreign file: not a dump
            return None
    return summarise_fr(data) if isinstance(data, dict) else None


def summarise_fr(data: dict[str, Any]) -> dict[str, Any]:
    """Per process group: the last collective entered (scheduled or started, not completed) and the last completed."""
    groups: dict[str, dict[str, Any]] = {}
    for entry in data.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg = str(entry.get("process_group") or entry.get("pg_id") or "0")
        if isinstance(entry.get("process_group"), (list, tuple)):
            pg = str(entry["process_group"][0])
        seq = int(entry.get("collective_seq_id") or 0)
        g = groups.setdefault(pg, {"entered": None, "completed": 0})
        state = str(entry.get("state", ""))
        if state == "completed":
            g["completed"] = max(g["completed"], seq)
        elif state in ENTERED and (g["entered"] is None or seq > g["entered"]["seq"]):
            frames = [f for f in entry.get("frames") or [] if isinstance(f, dict)]
            top = next((f for f in frames if not library(str(f.get("filename", "")))), frames[0] if frames else {})
            g["entered"] = {
                "seq": seq,
                "op": str(entry.get("profiling_name", "?")).split(":")[-1],
                "state": state,
                "frame": {"name": top.get("name", "?"), "file": Path(str(top.get("filename", "?"))).name, "line": top.get("line", 0)},
            }
    return {"version": str(data.get("version", "")), "groups": groups}


def merge_fr(dumps: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """{rank label: summary} of every rank that dumped -> the ranks behind in a process group's collective sequence.

    The furthest sequence number any rank reached in a group (entered or completed) is where the job is; a rank whose
    own furthest is lower has not entered that collective."""
    if len(dumps) < 2:
        return None
    findings = []
    groups = sorted({g for s in dumps.values() for g in s["groups"]})
    for g in groups:
        reached = {}
        ahead: dict[str, Any] | None = None
        for label, summary in dumps.items():
            info = summary["groups"].get(g, {"entered": None, "completed": 0})
            entered = info["entered"]["seq"] if info["entered"] else 0
            reached[label] = max(entered, info["completed"])
            if info["entered"] and (ahead is None or info["entered"]["seq"] > ahead["seq"]):
                ahead = info["entered"]
        top = max(reached.values())
        behind = sorted((label for label, seq in reached.items() if seq < top), key=_rank_key)
        if behind and ahead is not None and len(behind) < len(reached):
            waiting = sorted((label for label, seq in reached.items() if seq == top), key=_rank_key)
            findings.append({"group": g, "op": ahead["op"], "seq": top, "frame": ahead["frame"], "behind": behind, "waiting": waiting})
    return {"findings": findings}


def _rank_key(label: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", label)
    return (int(digits) if digits else 1 << 30, label)


# ------------------------------------------------------------------------------------------------ RAS


def ask_ras(address: str = "127.0.0.1:28028", timeout: float = RAS_SECONDS) -> dict[str, Any]:
    """The pod's RAS status (plain-text protocol: the ncclras client's, or `echo verbose status | nc localhost 28028`)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=2) as conn:
            conn.settimeout(timeout)
            conn.sendall(b"VERBOSE STATUS\n")
            chunks = []
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    except (OSError, ValueError) as exc:
        reason = "nothing listens (no NCCL >= 2.24 process on this pod, or NCCL_RAS_ENABLE=0)"
        if not isinstance(exc, ConnectionRefusedError):
            reason = f"no answer ({exc})"
        return {"status": "silent", "detail": reason}
    text = b"".join(chunks).decode(errors="replace")
    parsed = parse_ras(text)
    if not parsed["communicators"]:
        return {"status": "silent", "detail": "it answered without a communicator table", "text": text[-4000:]}
    return {"status": "used", "parsed": parsed, "text": text[-4000:]}


def parse_ras(text: str) -> dict[str, Any]:
    """The Communicators table rows and the Errors/Warnings sections of a RAS status."""
    communicators = []
    section = ""
    sections: dict[str, list[str]] = {"Errors": [], "Warnings": []}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if nxt and set(nxt) == {"="}:
            section = stripped.split("...")[0].strip()
            continue
        if set(stripped) == {"="}:
            continue
        if section == "Communicators":
            m = re.match(r"^(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z_]+)$", stripped)
            if m:
                communicators.append({"group": int(m[1]), "comms": int(m[2]), "ranks": int(m[6]), "status": m[7], "errors": m[8]})
        elif section in sections and stripped:
            sections[section].append(stripped)
    return {"communicators": communicators, "errors": sections["Errors"], "warnings": sections["Warnings"]}


def ras_words(parsed: dict[str, Any]) -> str:
    """One sentence of what RAS says about the job."""
    rows = parsed["communicators"]
    bad = [r for r in rows if r["errors"] != "OK" or r["status"] not in ("RUNNING",)]
    if not bad:
        total = sum(r["comms"] for r in rows)
        return f"{total} communicator(s) RUNNING, no errors (RAS sees no fault: a hang inside the job is still possible)"
    parts = [f"group {r['group']}: {r['status']} {r['errors']}" for r in bad]
    detail = [line for line in parsed["errors"] + parsed["warnings"] if re.match(r"^(Missing|The missing|Process|\d+ ranks? have)", line)]
    return "; ".join(parts) + (" (" + "; ".join(detail[:4]) + ")" if detail else "")
