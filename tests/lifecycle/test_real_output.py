"""Idle means idle, judged on real `nvidia-smi` output (tests/data/tool_output, sources in PROVENANCE.md).

The agent runs a stub `nvidia-smi` that prints a fixture file verbatim for `--query-gpu` and another for
`--query-compute-apps`, with the fixture's exit status; the rules are the agent's own (`probe_gpu`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle.conftest import agent_module, load_agent

agent = load_agent()
REAL = Path(__file__).resolve().parents[1] / "data" / "tool_output"
NO_APPS = "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"  # the header alone: no compute process
SETTINGS: dict[str, Any] = {**agent.DEFAULTS, "gpuUtilThreshold": 5, "gpuMemoryUtilThreshold": 5}

STUB = """#!/bin/bash
case "$*" in
  *--query-gpu=*) out="$SMI_GPU" ;;
  *--query-compute-apps=*) out="$SMI_APPS" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
cat "$out"
exit "${SMI_RC:-0}"
"""


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    stub = tmp_path / "nvidia-smi"
    stub.write_text(STUB)
    stub.chmod(0o755)
    monkeypatch.setenv("ML_DEV_NVIDIA_SMI", str(stub))

    def probe(gpu: str, apps: str | None = None, rc: int = 0, **settings: Any) -> dict[str, Any]:
        apps_file = tmp_path / "apps.csv"
        apps_file.write_text((REAL / apps).read_text() if apps else NO_APPS)
        monkeypatch.setenv("SMI_GPU", str(REAL / gpu))
        monkeypatch.setenv("SMI_APPS", str(apps_file))
        monkeypatch.setenv("SMI_RC", str(rc))
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
