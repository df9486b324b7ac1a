"""Bandwidth gate: all_reduce_perf through the real mpirun over the real SSH fabric of pods started from the render
(barcelona), judged on the plateau; failures localised by pairwise rounds and per-HCA ib_write_bw between pods."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import time
from pathlib import Path

import pytest

from inpod import contract
from inpod.fabric import allreduce, check, localise, parse
from inpod.lib import ledger
from tests.inpod.fabric.conftest import STATE, Fabric
from tests.podsim.nccl import nccl_report

DATA = Path(__file__).parent / "data"


# The program's modules, imported from the package as the pod imports them (inpod/fabric/, behind the fabric_check.py launcher).
fc = check


# ------------------------------------------------------------------------------------------ parsers


def test_parser_reads_a_real_all_reduce_perf_run():
    parsed = parse.parse_nccl_tests((DATA / "all_reduce_perf-2x8-h100.txt").read_text())
    rows = parsed["rows"]
    assert len(rows) == 31 and rows[0]["bytes"] == 8 and rows[-1]["bytes"] == 8 << 30
    assert (rows[-1]["algbw"], rows[-1]["busbw"], rows[-1]["in_place_busbw"]) == (180.71, 338.82, 337.35)
    assert parsed["avg_busbw"] == 70.742 and parsed["wrong"] == 0
    assert allreduce.plateau(rows, 4 << 30) == round((330.58 + 338.82) / 2, 2)


def test_parser_reads_the_stub_report_like_the_real_one():
    # the stub's output goes through the same parser; its column layout must match the real file's
    text = nccl_report(["a.svc", "b.svc"], 4, 1 << 20, 8 << 30, 197.0)
    # rows start "%12li  %12li  %8s  %6s  %6s" in every release; the spacing of the timing columns changed between
    # the release of the real sample and 2.17.6 (which the stub follows), so the parser splits on whitespace
    real = (DATA / "all_reduce_perf-2x8-h100.txt").read_text().splitlines()
    data_real = next(x for x in real if x.strip().startswith("1048576"))
    data_stub = next(x for x in text.splitlines() if x.strip().startswith("1048576"))
    assert data_real[:52] == data_stub[:52]
    assert len(data_real.split()) == len(data_stub.split()) == 13
    assert len(parse.parse_nccl_tests(text)["rows"]) == 14  # 1 MiB .. 8 GiB, factor 2


def test_ib_write_bw_parser_gbits_and_mib():
    text = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      3790000          392.90             392.50\t\t     0.748634\n"
    )
    gbits = parse.parse_ib_write_bw(text)
    assert gbits is not None, "a Gb/sec report parses"
    assert gbits["gbps"] == 392.5
    mib = (
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
        " 65536      5000             11025.44            11024.71            0.176395\n"
    )
    mibs = parse.parse_ib_write_bw(mib)
    assert mibs is not None, "a MiB/sec report parses"
    assert mibs["gbps"] == round(11024.71 * 8 * (1 << 20) / 1e9, 2)


# ------------------------------------------------------------------------------------- pair rounds


@pytest.mark.parametrize("n", range(2, 17))
def test_pair_rounds_are_log2_rounds_of_distinct_pairs(n):
    rounds = localise.pair_rounds(n)
    assert 1 <= len(rounds) <= math.ceil(math.log2(n))
    if n & (n - 1) == 0:  # powers of two: exactly the hypercube, n/2 pairs per round
        assert len(rounds) == math.ceil(math.log2(n)) and all(len(r) == n // 2 for r in rounds)
    pairs = [p for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) and all(a < b < n for a, b in pairs)
    for pod in range(n):  # every pod meets at least two partners (one when there are only two pods)
        assert len({q for p in pairs if pod in p for q in p if q != pod}) >= min(2, n - 1)


def test_suspects_need_a_cleared_partner():
    pairs = [
        {"index": [0, 1], "pass": True},
        {"index": [2, 3], "pass": False},
        {"index": [0, 2], "pass": False},
        {"index": [1, 3], "pass": True},
    ]
    assert localise.suspects_from_pairs(4, pairs) == ([2], [0, 1, 3])
    assert localise.suspects_from_pairs(2, [{"index": [0, 1], "pass": False}]) == ([], [])


# -------------------------------------------------------------------------------------- the program


def mpirun_args(f: Fabric) -> list[str]:
    return shlex.split(f.result()["command"])


@pytest.mark.timeout(300)
def test_gate_passes_on_a_healthy_fabric(fabric) -> None:
    f: Fabric = fabric(3)
    marks = f.sim.pods[0].path(f"{STATE}/{contract.START_MARKS_DIR}")
    shutil.rmtree(marks, ignore_errors=True)  # a new container's: no gate passed yet
    before = time.time()
    res = f.run("gate")
    assert res.returncode == 0, res.stdout + res.stderr
    result = f.result()
    assert result["status"] == "pass"
    # the start ledger's fabric-gate phase (inpod/lib/ledger.py): written by the gate that passed, on its pod
    assert before <= ledger.read_marks(marks.parent)[contract.START_FABRIC] <= time.time()
    assert result == f.result(where="state"), "workspace and state dir hold the same result"
    assert [r["bytes"] for r in result["sizes"]] == [1 << k for k in range(20, 34)]
    assert result["plateauBusbw"] >= result["expectation"]["pass_busbw_gbs"] == 175.14
    assert result["pairs"] == [] and result["nics"] == []
    args = mpirun_args(f)
    hostfile = f.sim.pods[0].path(args[args.index("--hostfile") + 1]).read_text().split("\n")
    assert hostfile[:3] == [f"{h} slots=4" for h in f.hosts], "hostfile in rank order from rank.env"
    assert args[args.index("-np") + 1] == "12" and args[args.index("-npernode") + 1] == "4"
    assert ["-x", "NCCL_IB_HCA"] == args[args.index("NCCL_IB_HCA") - 1 : args.index("NCCL_IB_HCA") + 1]
    # what the real mpirun started: 12 ranks, 4 per pod, filled pod by pod in hostfile order, each with the perf args
    ranks = sorted(f.calls("all_reduce_perf"), key=lambda c: c["rank"])
    assert [(c["rank"], c["pod"]) for c in ranks] == [(r, f.names[r // 4]) for r in range(12)]
    assert all(c["size"] == 12 and c["local_size"] == 4 for c in ranks)
    assert all(c["env"]["NCCL_IB_HCA"] == "mlx5_6,mlx5_7,mlx5_8,mlx5_9" and c["env"]["NCCL_ALGO"] == "Ring" for c in ranks)
    assert all(c["args"] == ["-b", str(1 << 20), "-e", str(8 << 30), "-f", "2", "-g", "1"] for c in ranks)
    assert "fabric gate PASS" in res.stdout and "expected bus bandwidth 194.6 GB/s = 4 NICs x 400 Gbit/s / 8 x 0.973" in res.stdout
    status = f.run("status")
    assert status.returncode == 0 and "fabric gate PASS" in status.stdout
    assert json.loads(f.run("status", "--json").stdout)["status"] == "pass"


@pytest.mark.timeout(300)
def test_slow_pod_is_localised_to_its_nic(fabric) -> None:
    f: Fabric = fabric(4)
    f.state(2)["busbw"] = 61.0  # every all-reduce with pod 2 in it is slow
    f.state(2)["nic_gbps"]["mlx5_8"] = 97.1  # because of one NIC
    f.apply(2)
    res = f.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    result = f.result()
    assert result["status"] == "fail" and result["plateauBusbw"] < 175.14
    assert [p["round"] for p in result["pairs"]] == [1, 1, 2, 2]  # log2(4) rounds
    assert {tuple(p["index"]) for p in result["pairs"] if not p["pass"]} == {(2, 3), (0, 2)}
    assert result["suspects"] == ["ml-dev-env-2"]
    bad = [n for n in result["nics"] if not n["pass"]]
    assert [(n["pod"], n["hca"], n["interface"]) for n in bad] == [("ml-dev-env-2", "mlx5_8", "net3")]
    assert any("ml-dev-env-2 mlx5_8 (net3): ib_write_bw 97.1 Gb/s" in d for d in result["diagnosis"])
    assert "per-HCA ib_write_bw" in res.stdout and "LOW" in res.stdout
    # the client ran on the suspect, the server on a cleared partner, over the same NIC index; they met over TCP
    # on the partner's interface of that HCA
    tries = [c for c in f.calls("ib_write_bw") if c["pod"] == "ml-dev-env-2"]
    # a client tried before its server listened is tried again with the same arguments (localise.client_of)
    clients = [c for k, c in enumerate(tries) if k == 0 or c["args"] != tries[k - 1]["args"]]
    assert [c["args"][c["args"].index("-d") + 1] for c in clients] == ["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    partner = f.names.index(result["nics"][2]["partner"].split(".")[0])
    assert partner != 2
    assert clients[2]["args"][-1] == f.sim.pods[partner].interfaces["net3"].split("/")[0]
    servers = [c for c in f.calls("ib_write_bw") if c["pod"] == f.names[partner]]
    assert [c["args"] for c in servers] == [c["args"][:-1] for c in clients], "the partner ran the servers (no address)"
    assert f.run("status").returncode == 1


@pytest.mark.timeout(300)
def test_full_ring_slow_but_pairs_fine_points_at_rack_placement(fabric) -> None:
    f: Fabric = fabric(4)
    f.node.fabric["full_ring_busbw"] = 120.0  # interleaved racks: only the full ring crosses them
    f.node.apply_fabric(f.sim)
    res = f.run("gate")
    assert res.returncode == 1
    result = f.result()
    assert all(p["pass"] for p in result["pairs"]) and result["suspects"] == []
    assert any("fabricCheck.nodeRacks" in d for d in result["diagnosis"])


@pytest.mark.timeout(300)
def test_every_pair_slow_is_fabric_wide(fabric) -> None:
    f: Fabric = fabric(3)
    for i in range(3):
        f.state(i)["busbw"] = 50.0
    f.apply()
    res = f.run("gate")
    assert res.returncode == 1
    result = f.result()
    assert result["pairs"] and not any(p["pass"] for p in result["pairs"])
    assert result["suspects"] == [] and any("fabric-wide" in d for d in result["diagnosis"])


def test_no_expectation_reports_without_judging(fabric) -> None:
    f: Fabric = fabric(2)
    for i in range(2):
        f.state(i)["busbw"] = 20.0
    f.apply()
    res = f.run("gate", settings={**f.settings, "expectation": None, "linkGbps": None})
    assert res.returncode == 0, res.stdout
    assert f.result()["status"] == "no-expectation" and "measurement only" in res.stdout


def test_single_pod_is_skipped(fabric) -> None:
    f: Fabric = fabric(1)
    res = f.run("gate")
    assert res.returncode == 0 and f.result()["status"] == "skipped" and not f.calls("all_reduce_perf")


def test_mpirun_failure_is_an_error(fabric) -> None:
    """Open MPI's daemon cannot start on pod 1 (no orted there): the real mpirun's own message is the diagnosis."""
    f: Fabric = fabric(2, key="no-orted")
    orted = f.sim.pods[1].path("/usr/bin/orted")
    if orted.exists():
        orted.unlink()  # the container's writable layer: gone for this pod only
    res = f.run("gate", "--no-localise")
    assert res.returncode == 1
    result = f.result()
    # the diagnosis keeps the last 400 characters of stderr (inpod/fabric/gate.py gate); the real mpirun's whole message (Debian
    # openmpi-bin 4.1.4: "bash: orted: command not found", then the ORTE help text) is in the run's log by the hostfile
    assert result["status"] == "error" and "all_reduce_perf across 2 pods failed (exit" in result["diagnosis"][0], result["diagnosis"]
    args = mpirun_args(f)
    log = f.sim.pods[0].path(args[args.index("--hostfile") + 1]).parent / "all_reduce-all.log"
    assert "ORTE was unable to reliably start one or more daemons" in log.read_text()


def test_status_without_a_result(fabric) -> None:
    f: Fabric = fabric(2)
    res = f.run("status")
    assert res.returncode == 2 and "no fabric gate result yet" in res.stdout


def test_missing_rank_env_is_reported_not_a_traceback(fabric) -> None:
    f: Fabric = fabric(2)
    rank_env = f.sim.pods[0].path("/tmp/ml-dev-env/rank.env")
    text = rank_env.read_text()
    rank_env.unlink()
    try:
        for args in (["gate"], ["preflight", "--all"]):
            res = f.run(*args)
            assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
            assert "rank.env: the startup script writes it (the rank contract)" in res.stdout
    finally:
        f.sim.write(0, "/tmp/ml-dev-env/rank.env", text)


@pytest.mark.timeout(300)
def test_gate_on_the_tcp_stack_runs_as_the_namespace_uid(fabric) -> None:
    """nerc-production (TCP, restricted-v2: a namespace UID, no capabilities): mpirun starts its daemons over the
    pods' sshd as that UID; the gate measures and judges what its expectation says for TCP."""
    f: Fabric = fabric(2, stack="nerc-production")
    res = f.run("gate", "--no-localise")
    assert res.returncode in (0, 1), res.stdout + res.stderr
    result = f.result()
    assert result["mode"] == "tcp" and result["status"] in ("pass", "fail", "no-expectation"), result["diagnosis"]
    assert [r["bytes"] for r in result["sizes"]][-1] == 8 << 30
    ranks = sorted(f.calls("all_reduce_perf"), key=lambda c: c["rank"])
    assert [(c["rank"], c["pod"]) for c in ranks] == [(r, f.names[r // 4]) for r in range(8)]
    uid = f.sim.identity.uid
    assert uid != 0 and all(line.split()[0] == str(uid) for line in f.sim.exec(1, "ps -o uid= -C sshd").stdout.split())
