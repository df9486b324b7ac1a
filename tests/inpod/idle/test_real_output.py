"""Idle means idle, judged on real tool output (tests/data/tool_output, sources in PROVENANCE.md).

The agent runs the node's `nvidia-smi` (tests/podsim/nodetools.py `HostNode`) replaying a fixture file verbatim for
`--query-gpu` and another for `--query-compute-apps`, with the fixture's exit status; the rules are the agent's own
(`probe_gpu`).
Jupyter: the bodies a real JupyterLab answered (tools/capture_jupyter_status.py), served verbatim to the
probe. code-server: the `/healthz` payloads code-server's docs and issues publish, turned into the
heartbeat file code-server writes.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inpod.idle import probes
from tests.inpod.idle.conftest import agent_module, load_agent
from tests.podsim.nodetools import HostNode

agent = load_agent()
REPO = Path(__file__).resolve().parents[3]
REAL = REPO / "tests" / "data" / "tool_output"
H200 = REAL / "nvidia-smi-h200"
SETTINGS: dict[str, Any] = {**agent.DEFAULTS, "gpuUtilThreshold": 5, "gpuMemoryUtilThreshold": 5}


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    node = HostNode(tmp_path / "node")
    monkeypatch.setenv("ML_DEV_NVIDIA_SMI", str(node.nvidia_smi))

    def probe(gpu: str, apps: str | None = None, rc: int = 0, **settings: Any) -> dict[str, Any]:
        node.gpu(replay={"gpu": REAL / gpu, "apps": REAL / apps if apps else None, "rc": rc})
        result: dict[str, Any] = agent.probe_gpu({**SETTINGS, **settings})
        return result

    return probe


def test_unified_memory_reports_no_memory_and_is_judged_by_utilisation(smi) -> None:
    """DGX Spark: memory.used is [N/A] in every row; the probe works and the 0-2 % GPU is idle."""
    result = smi("nvidia-smi-query-gpu-gb10-unified.csv")
    assert result["ok"], result
    assert not result["active"], result["detail"]["why"]
    assert {g["memUsedMiB"] for g in result["detail"]["gpus"]} == {None}
    assert [g["util"] for g in result["detail"]["gpus"]] == [0, 2, 0, 0, 0]
    # the same GPU with a utilisation threshold of 2 % is busy on the one row that reached it
    assert smi("nvidia-smi-query-gpu-gb10-unified.csv", gpuUtilThreshold=2)["active"]


@pytest.mark.parametrize("fixture", ["nvidia-smi-query-gpu-gb10-memory.csv", "nvidia-smi-query-gpu-gb10-name.csv"])
def test_a_gpu_reporting_nothing_is_not_a_failed_probe(smi, fixture: str) -> None:
    result = smi(fixture)
    assert result["ok"] and not result["active"], result


def test_unified_memory_gpu_with_a_compute_process_is_busy(smi) -> None:
    result = smi("nvidia-smi-query-gpu-gb10-name.csv", apps="nvidia-smi-query-compute-apps-vgpu.csv")
    assert result["ok"] and result["active"]
    assert result["detail"]["processes"] == 3
    assert all("compute process" in why for reasons in result["detail"]["why"].values() for why in reasons)


def test_memory_controller_activity_counts(smi) -> None:
    """RTX 2080 SUPER: utilization.memory 10 % is busy (threshold 5 %); 876 MiB is under the 1024 MiB floor."""
    result = smi("nvidia-smi-query-gpu-rtx2080-all.csv")
    assert result["ok"] and result["active"]
    assert result["detail"]["why"] == {"0": ["utilization.memory 10 %"]}
    assert not smi("nvidia-smi-query-gpu-rtx2080-all.csv", gpuMemoryUtilThreshold=11)["active"]


def test_memory_in_use_above_the_floor_is_busy_at_zero_utilisation(smi) -> None:
    """A job in a CPU phase holds its memory at 0 %: the MIG A800 with 36537 MiB in use is busy by memory alone."""
    result = smi("nvidia-smi-mig-a800-transcribed.csv")
    assert result["ok"] and result["detail"]["why"] == {"0": ["36537 MiB in use (floor 1024 MiB)"]}
    assert [(g["util"], g["memUtil"]) for g in result["detail"]["gpus"]] == [(None, None)]


def test_mig_instances_are_judged_by_their_processes(smi) -> None:
    """Under MIG utilisation is [N/A]; above the memory floor, only the compute processes decide."""
    floor = {"gpuMemoryFloorMiB": 65536}
    assert not smi("nvidia-smi-mig-a800-transcribed.csv", **floor)["active"]
    busy = smi("nvidia-smi-mig-a800-transcribed.csv", apps="nvidia-smi-query-compute-apps-vgpu.csv", **floor)
    assert busy["ok"] and busy["active"] and busy["detail"]["processes"] == 3


def test_driver_mismatch_is_a_failed_probe_that_counts_as_active(smi) -> None:
    result = smi("nvidia-smi-driver-mismatch.txt", rc=18)
    assert not result["ok"]
    assert "Driver/library version mismatch" in result["detail"]["error"]
    decider = agent.Decider(now=0.0)
    decider.observe([{"pod": "p-0", "signals": [result]}], now=5000.0)
    assert decider.last_active == 5000.0 and "probe failed" in decider.reason


def test_driver_mismatch_text_with_exit_zero_is_still_no_gpu_table(smi) -> None:
    """Output that is not a CSV header never passes for 'no GPUs busy'."""
    result = smi("nvidia-smi-driver-mismatch.txt", rc=0)
    assert not result["ok"] and "no nvidia-smi CSV header" in result["detail"]["error"]


def test_a_one_column_query_row_of_n_a_is_a_gpu_not_a_message(smi) -> None:
    """`--query-gpu=mig.mode.current` on a GPU without MIG: the header and one `[N/A]` row (Syllo/nvtop
    PR 470). One cell per line is a row when the query has one column; a GPU reporting nothing is idle."""
    assert agent.parse_csv((REAL / "nvidia-smi-query-gpu-mig-mode-rtx-na.csv").read_text()) == [{"mig.mode.current": "[N/A]"}]
    result = smi("nvidia-smi-query-gpu-mig-mode-rtx-na.csv")
    assert result["ok"] and not result["active"], result
    assert [(g["util"], g["memUtil"], g["memUsedMiB"]) for g in result["detail"]["gpus"]] == [(None, None, None)]


def test_a_gpu_in_mig_mode_listed_without_utilisation_is_judged_by_its_processes(smi) -> None:
    """`--query-gpu=pci.bus_id,mig.mode.current --format=csv` after `nvidia-smi -mig 1` (HPCWIKI MIG page):
    a GPU row with nothing to measure is no evidence; a compute process on it (any uuid) makes it busy."""
    rows = agent.parse_csv((REAL / "nvidia-smi-query-gpu-mig-mode-enabled.csv").read_text())
    assert rows == [{"pci.bus_id": "00000000:4F:00.0", "mig.mode.current": "Enabled"}]
    assert not smi("nvidia-smi-query-gpu-mig-mode-enabled.csv")["active"]
    busy = smi("nvidia-smi-query-gpu-mig-mode-enabled.csv", apps="nvidia-smi-query-compute-apps-vgpu.csv")
    assert busy["ok"] and busy["active"] and busy["detail"]["busy"] == ["other"]


@pytest.mark.parametrize(
    ("gpu", "apps"),
    [
        ("nvidia-smi-query-gpu-gb10-noheader.txt", None),
        ("nvidia-smi-query-gpu-gb10-name.csv", "nvidia-smi-query-compute-apps-gb10-noheader.txt"),
    ],
)
def test_output_without_a_header_is_a_failed_probe_never_no_gpus(smi, gpu: str, apps: str | None) -> None:
    """GB10 output printed with `noheader` (mostlygeek/llama-swap issue 782): `[N/A], [N/A], 0` and a compute
    process with its memory. Without the header nothing says which column is which: the probe fails (and
    so counts as active) instead of reading the row as a header or as no process."""
    result = smi(gpu, apps=apps)
    assert not result["ok"] and "no nvidia-smi CSV header" in result["detail"]["error"], result


# ------------------------------------------------------------------------------ a real H200 (captured)

H200_STATES = ("idle", "busy-0", "busy-1", "busy-2", "after-0", "after-1")
"""The captures of nvidia-smi-h200/: before, during and after a matmul + NCCL job (SOURCES.md there)."""


def csv_rows(path: Path) -> list[dict[str, str]]:
    """A capture as the csv module reads it: the field name (its ` [unit]` dropped) to the cell."""
    with path.open(newline="") as f:
        reader = csv.reader(f, skipinitialspace=True)
        header = [name.split(" [", 1)[0] for name in next(reader)]
        return [dict(zip(header, row, strict=True)) for row in reader]


def amount(cell: str) -> float:
    """'100 %', '1787 MiB': the number before the unit."""
    number, _unit = cell.split(" ")
    return float(number)


@pytest.mark.parametrize("state", H200_STATES)
def test_the_parsers_read_the_real_h200_output(state: str) -> None:
    gpu_file, apps_file = H200 / f"gpu-{state}.csv", H200 / f"apps-{state}.csv"
    gpus, apps = csv_rows(gpu_file), csv_rows(apps_file)
    assert len(gpus) == 1 and len(apps) == (1 if state.startswith("busy") else 0)  # what the capture holds
    assert probes.parse_gpu_csv(gpu_file.read_text()) == [
        {
            "index": int(g["index"]),
            "uuid": g["uuid"],
            "util": amount(g["utilization.gpu"]),
            "memUtil": amount(g["utilization.memory"]),
            "memUsedMiB": amount(g["memory.used"]),
        }
        for g in gpus
    ]
    # the query asks for `used_memory`; the real header names it `used_gpu_memory [MiB]`
    assert probes.parse_compute_apps(apps_file.read_text()) == [
        {"gpuUuid": a["gpu_uuid"], "pid": int(a["pid"]), "name": a["process_name"], "usedMiB": amount(a["used_gpu_memory"])} for a in apps
    ]


@pytest.mark.parametrize("state", H200_STATES)
def test_the_probe_judges_the_real_h200_output(smi, state: str) -> None:
    """Busy while the job runs (its compute process, 99-100 %), idle before it and right after it: 4 % with no
    process is under the default threshold (utilisation is over the last sample period: SOURCES.md)."""
    (gpu,) = csv_rows(H200 / f"gpu-{state}.csv")
    result = smi(f"nvidia-smi-h200/gpu-{state}.csv", apps=f"nvidia-smi-h200/apps-{state}.csv", gpuUtilThreshold=5)
    assert result["ok"], result
    if state.startswith("busy"):
        (app,) = csv_rows(H200 / f"apps-{state}.csv")
        assert result["active"] and result["detail"]["processes"] == 1
        assert f"compute process {app['pid']} ({app['process_name']})" in result["detail"]["why"][gpu["index"]]
        assert f"utilization.gpu {gpu['utilization.gpu']}" in result["detail"]["why"][gpu["index"]]
    else:
        assert not result["active"] and result["detail"]["processes"] == 0, result["detail"]["why"]
        assert amount(gpu["utilization.gpu"]) < 5


def test_the_node_stub_prints_what_the_real_tool_printed(tmp_path: Path) -> None:
    """The node's nvidia-smi (tests/podsim/nodetool.py) set to the captured GPU (model, UUID, utilisation, memory,
    process: read from the capture with the csv module) prints every capture byte for byte: headers, units,
    spacing, the header alone without a process, `-L`, and startup.sh's GPU list (its query read from the script)."""
    node = HostNode(tmp_path / "node", gpus=1)
    with (H200 / "startup-list.csv").open(newline="") as f:
        ((_, name, total),) = list(csv.reader(f, skipinitialspace=True))
    startup = re.search(r"nvidia-smi (--query-gpu=\S+ --format=\S+)", (REPO / "inpod" / "sh" / "startup.sh").read_text())
    assert startup is not None

    def printed(*args: str) -> str:
        proc = subprocess.run([str(node.nvidia_smi), *args], capture_output=True, text=True, timeout=60, check=True)
        return proc.stdout

    for state in H200_STATES:
        (gpu,) = csv_rows(H200 / f"gpu-{state}.csv")
        apps = [(0, int(a["pid"]), a["process_name"], int(amount(a["used_gpu_memory"]))) for a in csv_rows(H200 / f"apps-{state}.csv")]
        util, mem, used = (int(amount(gpu[k])) for k in ("utilization.gpu", "utilization.memory", "memory.used"))
        node.gpu(model=(name, int(amount(total))), uuids=[gpu["uuid"]], util=util, mem=mem, used=used, apps=apps)
        assert printed(f"--query-gpu={probes.GPU_QUERY}", "--format=csv") == (H200 / f"gpu-{state}.csv").read_text()
        assert printed(f"--query-compute-apps={probes.APPS_QUERY}", "--format=csv") == (H200 / f"apps-{state}.csv").read_text()
    assert printed("-L") == (H200 / "nvidia-smi-L.txt").read_text()
    assert printed(*startup.group(1).split()) == (H200 / "startup-list.csv").read_text()


def test_an_unexpected_exception_in_a_local_probe_counts_as_active(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> dict[str, Any]:
        raise AttributeError("'str' object has no attribute 'removesuffix'")  # what Python 3.8 raised on main

    probes = agent_module("idle_probes")  # where local_activity looks its probes up
    monkeypatch.setattr(probes, "probe_gpu", broken)
    monkeypatch.setattr(probes, "is_rank0", lambda: False)
    report = agent.local_activity(SETTINGS)
    gpu = next(s for s in report["signals"] if s["name"] == "gpu")
    assert gpu["ok"] is False and gpu["detail"]["error"].startswith("AttributeError")


def unreachable(pod: str) -> dict[str, Any]:
    return {"pod": pod, "signals": [agent.signal("reachable", False, error="<urlopen error [Errno -2] Name or service not known>")]}


def idle_pod0() -> dict[str, Any]:
    return {"pod": "p-0", "signals": [agent.signal("gpu", True), agent.signal("terminals", True, age=10_000)]}


def test_an_unreachable_worker_holds_the_stop_only_up_to_the_bound() -> None:
    decider = agent.Decider(now=0.0, unreachable_seconds=600)
    for t in range(0, 600, 60):
        decider.observe([idle_pod0(), unreachable("p-1")], now=float(t))
        assert decider.last_active == t, "within the bound an unreachable worker counts as active"
    idle = decider.observe([idle_pod0(), unreachable("p-1")], now=660.0)
    assert "p-1" in decider.written_off and idle == 660.0 - decider.last_active > 0
    assert decider.status(660.0)["unreachable"]["p-1"] == {
        "seconds": 660.0,
        "since": 0.0,
        "writtenOff": True,
        "error": "<urlopen error [Errno -2] Name or service not known>",
    }
    # it answers again: it counts again, and is no longer written off
    decider.observe([idle_pod0(), {"pod": "p-1", "signals": [agent.signal("gpu", True, active=True)]}], now=720.0)
    assert decider.last_active == 720.0 and decider.written_off == {}


# ------------------------------------------------------------------------------ Jupyter, real bodies

JUPYTER = REAL / "jupyter"
STATES = ["1-fresh", "2-kernel-starting", "3-kernel-idle", "4-kernel-busy", "5-terminal-open"]


def bodies(state: str) -> dict[str, Any]:
    return {name: json.loads((JUPYTER / f"{state}-{name}.json").read_bytes()) for name in ("status", "kernels", "sessions", "terminals")}


def stamps(body: Any) -> Iterator[str]:
    """Every timestamp in a Jupyter body (last_activity, started), at any depth."""
    if isinstance(body, dict):
        for key, value in body.items():
            if key in ("last_activity", "started") and isinstance(value, str):
                yield value
            else:
                yield from stamps(value)
    elif isinstance(body, list):
        for item in body:
            yield from stamps(item)


def test_every_real_jupyter_timestamp_parses_as_python_reads_it() -> None:
    """jupyter_server writes `datetime.isoformat()` with Z for +00:00 (jupyter_server/_tz.py isoformat);
    the probe's parser (3.8 has no fromisoformat for Z) must agree with the standard library on each one."""
    seen = [t for state in STATES for body in bodies(state).values() for t in stamps(body)]
    assert len(seen) >= 2 * len(STATES)  # started and last_activity of /api/status at least
    for text in seen:
        want = datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        assert agent.parse_time(text) == pytest.approx(want, abs=1e-6), text


@pytest.mark.parametrize("state", STATES)
def test_jupyter_signal_on_real_bodies(state: str) -> None:
    b = bodies(state)
    kernels, terminals = b["kernels"], b["terminals"]
    newest = max(agent.parse_time(x["last_activity"]) for x in [b["status"], *kernels, *terminals])
    result = agent.judge_jupyter(b["status"], kernels, terminals, now=newest + 600)
    assert result["ok"] and result["age"] == 600.0, result
    busy = [k["id"] for k in kernels if k["execution_state"] == "busy"]
    assert result["active"] is bool(busy) and result["detail"]["busyKernels"] == busy
    assert (result["detail"]["kernels"], result["detail"]["terminals"]) == (b["status"]["kernels"], len(terminals))
    assert result["detail"]["connections"] == sum(k["connections"] for k in kernels)
    # what a notebook tab's session shows of its kernel is what /api/kernels shows the probe
    assert [s["kernel"] for s in b["sessions"]] == kernels
    # the states the capture went through, as the server reported them
    expect = {
        "1-fresh": ([], 0, 0),
        "2-kernel-starting": (["starting"], 0, 0),  # no client yet: not busy, so not activity by itself
        "3-kernel-idle": (["idle"], 1, 0),
        "4-kernel-busy": (["busy"], 1, 0),
        "5-terminal-open": (["idle"], 1, 1),
    }[state]
    assert ([k["execution_state"] for k in kernels], b["status"]["connections"], len(terminals)) == expect
    if state == "5-terminal-open":
        # the open terminal's last_activity counts: without it the signal would be older
        assert agent.judge_jupyter(b["status"], kernels, [], now=newest + 600)["age"] >= result["age"]


class JupyterReplay:
    """A stand-in answering the probe's GETs with one state's captured bodies, byte for byte, and only at
    the paths the capture tool fetched (tools/capture_jupyter_status.py ENDPOINTS); anything else is 404."""

    def __init__(self, state: str, token: str) -> None:
        from tools.capture_jupyter_status import ENDPOINTS

        routes = {path: (JUPYTER / f"{state}-{name}.json").read_bytes() for name, path in ENDPOINTS.items()}
        self.requests: list[tuple[str, str | None]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's method name
                seen.append((self.path, self.headers.get("Authorization")))
                ok = self.path in routes and self.headers.get("Authorization") == f"token {token}"
                body = routes[self.path] if ok else b'{"message": "Not Found"}'
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # port 0: bound here, no race
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.mark.parametrize("state", ["1-fresh", "4-kernel-busy", "5-terminal-open"])
def test_probe_jupyter_over_http_on_real_bodies(state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe asks exactly what was captured (so the fixtures are what it reads), with the token."""
    replay = JupyterReplay(state, token="t0k")
    try:
        monkeypatch.setenv("ML_DEV_JUPYTER_URL", replay.url)
        monkeypatch.setenv("JUPYTER_TOKEN", "t0k")
        last = agent.parse_time(bodies(state)["status"]["last_activity"])
        result = agent.probe_jupyter(last + 120)
        assert result["ok"], result
        assert result["active"] is (state == "4-kernel-busy")
        assert result["age"] is not None and 0 < result["age"] <= 120
        assert all(auth == "token t0k" for _, auth in replay.requests) and len(replay.requests) == 3
        monkeypatch.setenv("JUPYTER_TOKEN", "wrong")
        refused = agent.probe_jupyter(last + 120)
        assert not refused["ok"] and "404" in refused["detail"]["error"]
    finally:
        replay.close()


def shape(body: Any) -> Any:
    """A JSON body's keys and value types (ids and timestamps differ on every capture; the shape does not)."""
    if isinstance(body, dict):
        return {key: shape(value) for key, value in sorted(body.items())}
    if isinstance(body, list):
        return [shape(body[0])] if body else []
    return type(body).__name__


def test_the_installed_jupyter_still_answers_as_captured(tmp_path: Path) -> None:
    """The capture tool, run as `make`-less users run it, against the venv's JupyterLab: every state again,
    each body of the same shape as the committed one and judged the same. A jupyter_server whose answers
    changed fails here: capture again (tools/capture_jupyter_status.py) and check the probe against them."""
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.capture_jupyter_status", str(tmp_path)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its JupyterLab and kernel go with it if it has to be killed
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    committed = sorted(p.name for p in JUPYTER.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for state in STATES:
        for name in ("status", "kernels", "sessions", "terminals"):
            fresh = json.loads((tmp_path / f"{state}-{name}.json").read_bytes())
            assert shape(fresh) == shape(bodies(state)[name]), (state, name)
        now = agent.parse_time(json.loads((tmp_path / f"{state}-status.json").read_bytes())["last_activity"]) + 600
        again = {name: json.loads((tmp_path / f"{state}-{name}.json").read_bytes()) for name in ("status", "kernels", "terminals")}
        b = bodies(state)
        judged = agent.judge_jupyter(again["status"], again["kernels"], again["terminals"], now)
        kept = agent.judge_jupyter(b["status"], b["kernels"], b["terminals"], agent.parse_time(b["status"]["last_activity"]) + 600)
        for key in ("busyKernels", "idleKernels"):  # kernel ids differ on every capture: their count
            judged["detail"][key] = len(judged["detail"][key])
            kept["detail"][key] = len(kept["detail"][key])
        assert (judged["active"], judged["detail"]) == (kept["active"], kept["detail"]), state


# ------------------------------------------------------------------------- code-server, published bodies

HEALTHZ = ["code-server-healthz-faq.json", "code-server-healthz-3.7.1-issue-2327.json"]


@pytest.mark.parametrize("fixture", HEALTHZ)
@pytest.mark.parametrize("xdg", [True, False])
def test_code_server_heartbeat_as_code_server_writes_it(fixture: str, xdg: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """code-server's `/healthz` says `alive` while now - lastHeartbeat < 60 s, lastHeartbeat being when it
    last wrote its heartbeat file, empty, at path.join(paths.data, "heartbeat") (coder/code-server
    src/node/heart.ts Heart.alive and Heart.beat, src/node/routes/health.ts, src/node/routes/index.ts
    register; paths.data is env-paths' $XDG_DATA_HOME/code-server or ~/.local/share/code-server on Linux,
    src/node/util.ts getEnvPaths, sindresorhus/env-paths index.js linux). The probe finds that file with the
    container's own environment and reads the same instant from its mtime."""
    health = json.loads((REAL / fixture).read_text())
    assert set(health) == {"status", "lastHeartbeat"} and health["status"] == "alive"
    beat = health["lastHeartbeat"] / 1000
    monkeypatch.delenv("ML_DEV_CODE_SERVER_HEARTBEAT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg:
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        data = tmp_path / "xdg" / "code-server"
    else:
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
        data = tmp_path / "home" / ".local" / "share" / "code-server"
    assert agent.probe_vscode(beat)["detail"]["note"].startswith("no heartbeat yet")
    data.mkdir(parents=True)
    (data / "heartbeat").write_text("")  # fs.writeFile(heartbeatPath, "")
    os.utime(data / "heartbeat", (beat, beat))
    alive = agent.probe_vscode(beat + 59.5)  # still "alive" for code-server (< 60 s)
    assert alive["ok"] and not alive["active"] and alive["age"] == 59.5
    assert alive["detail"]["heartbeat"] == str(data / "heartbeat")
    decider = agent.Decider(now=beat - 7200)
    assert decider.observe([{"pod": "p-0", "signals": [alive]}], now=beat + 59.5) == pytest.approx(59.5)
    assert decider.reason == "p-0/vscode: last activity"
    # an hour after the last beat code-server says "expired" and the IDE counts an hour idle
    assert agent.probe_vscode(beat + 3600)["age"] == 3600.0
