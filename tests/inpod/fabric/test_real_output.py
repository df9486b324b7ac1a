"""The fabric check names the real fault, on real tool output (tests/data/tool_output/PROVENANCE.md):
data corruption whatever the exit status, the ring algorithm set by the gate itself, each HCA with its own
interface from sysfs, and MPI's own traffic kept on eth0 under a stock Open MPI that also has pml ucx."""

from __future__ import annotations

import csv
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from inpod.fabric import allreduce, parse
from tests.inpod.fabric.conftest import Fabric

REAL = Path(__file__).resolve().parents[2] / "data" / "tool_output"
DATA = Path(__file__).parent / "data"


def test_parser_reads_a_real_corrupt_run() -> None:
    parsed = parse.parse_nccl_tests((REAL / "all_reduce_perf-2x1-rtx3090-corrupt.txt").read_text())
    rows = parsed["rows"]
    assert len(rows) == 27 and all(r["wrong"] > 0 for r in rows)
    assert rows[0]["wrong"] == 8 and rows[-1]["wrong"] == 2 * 2.68435e08  # %g-printed counts, out- and in-place
    assert parsed["out_of_bounds"] == 108 and parsed["avg_busbw"] == 3.02663
    assert parsed["ranks"] == [{"rank": 0, "host": "worker1", "device": 0}, {"rank": 1, "host": "worker2", "device": 0}]
    what = allreduce.corruption({**parsed, "rc": 7})
    assert "#wrong > 0 at 27 of 27 sizes (8 B to 512 MiB)" in what
    assert "108 out-of-bounds values" in what and "ranks 0-1 on worker1, worker2" in what


def test_the_gpu_list_of_a_real_h200() -> None:
    """`nvidia-smi -L` of a real H200 (tests/data/tool_output/nvidia-smi-h200): one line per GPU, as the same
    machine's CSV captures name it (index and UUID from the agent's query, the name from startup.sh's list, read
    with the csv module): what the preflight's GPU count reads."""
    h200 = REAL / "nvidia-smi-h200"
    with (h200 / "gpu-idle.csv").open(newline="") as f:
        gpus = list(csv.DictReader(f, skipinitialspace=True))
    with (h200 / "startup-list.csv").open(newline="") as f:
        names = {index: name for index, name, _total in csv.reader(f, skipinitialspace=True)}
    expected = [f"GPU {g['index']}: {names[g['index']]} (UUID: {g['uuid']})" for g in gpus]
    assert len(expected) == 1 and parse.parse_nvidia_smi_list((h200 / "nvidia-smi-L.txt").read_text()) == expected


def test_a_clean_real_run_is_not_corruption() -> None:
    parsed = parse.parse_nccl_tests((DATA / "all_reduce_perf-2x8-h100.txt").read_text())
    assert parsed["wrong"] == 0 and parsed["out_of_bounds"] == 0 and len(parsed["ranks"]) == 16
    assert allreduce.corruption({**parsed, "rc": 0}) == ""


def test_our_build_of_the_pinned_nccl_tests_parses_on_a_real_gpu() -> None:
    """data/SOURCES.md: nccl-tests 2.17.6 from the archive the base image pins, started on one H200 by the gate's own
    all_reduce() (its whole mpirun command line). The sizes are the command's (-b 8 -e 1 GiB -f 2); one rank moves
    no bytes across a bus, so every busbw is 0 and the single-pod gate skips rather than judging it (gate.py)."""
    text = (DATA / "all_reduce_perf-1x1-h200.txt").read_text()
    parsed = parse.parse_nccl_tests(text)
    rows = parsed["rows"]
    assert [r["bytes"] for r in rows] == [8 << i for i in range(28)]
    assert all(r["wrong"] == 0 and r["busbw"] == 0.0 for r in rows)
    assert parsed["wrong"] == 0 and parsed["out_of_bounds"] == 0
    assert parsed["ranks"] == [{"rank": 0, "host": "vm", "device": 0}]
    assert allreduce.corruption({**parsed, "rc": 0}) == "" and allreduce.plateau(rows, 64 << 20) == 0.0
    assert "# nccl-tests version 2.17.6" in text.splitlines()[0]


@pytest.mark.timeout(300)
def test_corruption_is_reported_as_such_whatever_the_exit_status(fabric) -> None:
    """nccl-tests exits non-zero when #wrong > 0; the gate must still say data corruption, and the pairwise
    runs name the pod whose pairs corrupt."""
    f: Fabric = fabric(4)
    f.state(1)["corrupt"] = True  # every all-reduce with pod 1 in it prints a real corrupt run and exits 7
    f.apply(1)
    res = f.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    result = f.result()
    assert result["status"] == "fail" and result["corrupt"] is True, result["diagnosis"]
    assert result["diagnosis"][0].startswith("DATA CORRUPTION across 4 pods: #wrong > 0 at 27 of 27 sizes")
    assert not any("failed (exit" in d for d in result["diagnosis"]), "corruption is not a failed run"
    corrupt_pairs = {tuple(p["index"]) for p in result["pairs"] if p.get("corrupt")}
    assert corrupt_pairs == {(0, 1), (1, 3)}
    assert result["suspects"] == ["ml-dev-env-1"]
    assert any(d.startswith("data corruption between ml-dev-env-0 and ml-dev-env-1") for d in result["diagnosis"])


def test_the_gate_sets_the_ring_algorithm_itself(fabric) -> None:
    f: Fabric = fabric(2)
    res = f.run("gate", prefix="env NCCL_ALGO=Tree ")  # network.ncclEnv may set it in the pod
    assert res.returncode == 0, res.stdout + res.stderr
    args = shlex.split(f.result()["command"])
    assert args[args.index("NCCL_ALGO=Ring") - 1] == "-x"
    assert "NCCL_ALGO" not in args, "the pod's NCCL_ALGO is not forwarded"
    assert {c["env"]["NCCL_ALGO"] for c in f.calls("all_reduce_perf")} == {"Ring"}, "every rank on every pod got Ring"


@pytest.mark.timeout(300)
def test_each_hca_is_paired_with_its_own_interface_from_sysfs(fabric) -> None:
    """The other pods number their VF interfaces differently (mlx5_8 is net1 there): the client must connect to the
    address of the partner's interface of the same HCA, not to the interface at the same list position."""
    f: Fabric = fabric(4)
    f.state(2)["busbw"] = 61.0
    f.state(2)["nic_gbps"]["mlx5_8"] = 97.1
    for i in (0, 1, 3):
        f.state(i)["netdevs"] = {"mlx5_6": "net4", "mlx5_7": "net3", "mlx5_8": "net1", "mlx5_9": "net2"}
    f.apply()
    res = f.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    result = f.result()
    assert result["suspects"] == ["ml-dev-env-2"]
    partner = f.names.index(result["nics"][0]["partner"].split(".")[0])
    clients = [c for c in f.calls("ib_write_bw") if c["pod"] == "ml-dev-env-2"]
    used = {c["args"][c["args"].index("-d") + 1]: c["args"][-1] for c in clients}
    pod = f.sim.pods[partner]
    want = {hca: pod.interfaces[netdev].split("/")[0] for hca, netdev in f.state(partner)["netdevs"].items()}
    assert used == want
    bad = [n for n in result["nics"] if not n["pass"]]
    assert [(n["hca"], n["interface"], n["partnerInterface"]) for n in bad] == [("mlx5_8", "net3", "net1")]


def test_mpi_traffic_stays_on_eth0_with_stock_open_mpi() -> None:
    """Stock Open MPI 4.1 builds pml ucx with a higher priority than ob1 and bumps it whenever an mlx* device
    exists: BTL settings alone would not keep MPI on eth0. The command names pml ob1."""
    info = (REAL / "ompi_info-4.1.4-debian.txt").read_text()
    params = (REAL / "ompi_info-pml-4.1.4-debian.txt").read_text()
    assert {"ob1", "ucx"} <= set(parse.parse_ompi_info_components(info, "pml"))
    assert "tcp" in parse.parse_ompi_info_components(info, "btl")
    ucx, ob1 = parse.parse_ompi_info_priority(params, "pml_ucx"), parse.parse_ompi_info_priority(params, "pml_ob1")
    assert ucx is not None and ob1 is not None and ucx > ob1
    cmd = allreduce.mpirun_cmd(Path("/tmp/hostfile"), 2, 1, 1 << 20, 1 << 30)
    mca = {cmd[i + 1]: cmd[i + 2] for i, a in enumerate(cmd) if a == "--mca"}
    assert mca["pml"] == "ob1" and mca["btl"] == "tcp,self"
    assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == "eth0"


@pytest.mark.skipif(shutil.which("mpirun") is None or not Path("/sys/class/net/eth0").exists(), reason="needs Open MPI and eth0")
def test_real_mpirun_accepts_the_command_and_ranks_get_ring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real mpirun (Debian openmpi-bin) runs the gate's exact command line with a program that prints
    what each rank sees, on this machine's eth0."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    probe = tmp_path / "all_reduce_perf"
    probe.write_text('#!/bin/sh\necho "rank ${OMPI_COMM_WORLD_RANK} NCCL_ALGO=${NCCL_ALGO}"\n')
    probe.chmod(0o755)
    for key in [k for k in os.environ if k.startswith(("NCCL_", "OMPI_", "ML_DEV_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ML_DEV_ALL_REDUCE_PERF", str(probe))
    env = dict(os.environ)
    cmd = allreduce.mpirun_cmd(hostfile, 2, 2, 1 << 20, 1 << 21)
    run = subprocess.run([*cmd[:1], "--oversubscribe", *cmd[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.stdout.split("\n")[:2]) == ["rank 0 NCCL_ALGO=Ring", "rank 1 NCCL_ALGO=Ring"], run.stdout


def test_real_ib_write_bw_reports_parse() -> None:
    ib = parse.parse_ib_write_bw((REAL / "ib_write_bw-report_gbits-ib.txt").read_text())
    assert ib == {"bytes": 2, "iterations": 5000, "peak": 0.04235, "average": 0.042185, "unit": "Gb/sec", "gbps": 0.04}
    roce = parse.parse_ib_write_bw((REAL / "ib_write_bw-roce-8bytes.txt").read_text())
    assert roce is not None and (roce["bytes"], roce["iterations"], roce["average"], roce["unit"]) == (8, 224958464, 0.48, "Gb/sec")
