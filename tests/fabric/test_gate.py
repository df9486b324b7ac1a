"""Bandwidth gate: all_reduce_perf through mpirun across the simulated pods, judged on the plateau;
failures localised by pairwise rounds and per-HCA ib_write_bw."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from inpod import fabric_check, fabric_gate, fabric_localise, fabric_parse
from tests.fabric.conftest import PROGRAM, Sim
from tests.podsim.nccl import nccl_report

DATA = Path(__file__).parent / "data"


# The program's modules, imported from the package (in the pod they are flat files next to fabric_check.py).
fc = fabric_check


# ------------------------------------------------------------------------------------------ parsers


def test_parser_reads_a_real_all_reduce_perf_run():
    parsed = fabric_parse.parse_nccl_tests((DATA / "all_reduce_perf-2x8-h100.txt").read_text())
    rows = parsed["rows"]
    assert len(rows) == 31 and rows[0]["bytes"] == 8 and rows[-1]["bytes"] == 8 << 30
    assert (rows[-1]["algbw"], rows[-1]["busbw"], rows[-1]["in_place_busbw"]) == (180.71, 338.82, 337.35)
    assert parsed["avg_busbw"] == 70.742 and parsed["wrong"] == 0
    assert fabric_gate.plateau(rows, 4 << 30) == round((330.58 + 338.82) / 2, 2)


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
    assert len(fabric_parse.parse_nccl_tests(text)["rows"]) == 14  # 1 MiB .. 8 GiB, factor 2


def test_ib_write_bw_parser_gbits_and_mib():
    text = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      3790000          392.90             392.50\t\t     0.748634\n"
    )
    assert fabric_parse.parse_ib_write_bw(text)["gbps"] == 392.5
    mib = (
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
        " 65536      5000             11025.44            11024.71            0.176395\n"
    )
    assert fabric_parse.parse_ib_write_bw(mib)["gbps"] == round(11024.71 * 8 * (1 << 20) / 1e9, 2)


# ------------------------------------------------------------------------------------- pair rounds


@pytest.mark.parametrize("n", range(2, 17))
def test_pair_rounds_are_log2_rounds_of_distinct_pairs(n):
    rounds = fabric_localise.pair_rounds(n)
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
    assert fabric_localise.suspects_from_pairs(4, pairs) == ([2], [0, 1, 3])
    assert fabric_localise.suspects_from_pairs(2, [{"index": [0, 1], "pass": False}]) == ([], [])


# -------------------------------------------------------------------------------------- the program


def test_gate_passes_on_a_healthy_fabric(sim) -> None:
    s: Sim = sim(3)
    res = s.run("gate")
    assert res.returncode == 0, res.stdout + res.stderr
    result = s.result()
    assert result["status"] == "pass"
    assert result == s.result(where="state"), "workspace and state dir hold the same result"
    assert [r["bytes"] for r in result["sizes"]] == [1 << k for k in range(20, 34)]
    assert result["plateauBusbw"] >= result["expectation"]["pass_busbw_gbs"] == 175.14
    assert result["pairs"] == [] and result["nics"] == []
    (call,) = s.calls("mpirun")
    args = call["args"]
    hostfile = Path(args[args.index("--hostfile") + 1]).read_text().split("\n")
    assert hostfile[:3] == [f"{h} slots=4" for h in s.cluster.names], "hostfile in rank order from rank.env"
    assert args[args.index("-np") + 1] == "12" and args[args.index("-npernode") + 1] == "4"
    assert ["-x", "NCCL_IB_HCA"] == args[args.index("NCCL_IB_HCA") - 1 : args.index("NCCL_IB_HCA") + 1]
    perf = args[next(i for i, a in enumerate(args) if a.endswith("all_reduce_perf")) :]
    assert perf[1:] == ["-b", str(1 << 20), "-e", str(8 << 30), "-f", "2", "-g", "1"]
    assert "fabric gate PASS" in res.stdout and "expected bus bandwidth 194.6 GB/s = 4 NICs x 400 Gbit/s / 8 x 0.973" in res.stdout
    status = s.run("status")
    assert status.returncode == 0 and "fabric gate PASS" in status.stdout
    assert json.loads(s.run("status", "--json").stdout)["status"] == "pass"


def test_slow_pod_is_localised_to_its_nic(sim) -> None:
    s: Sim = sim(4)
    s.cluster.allreduce["slow_hosts"] = [s.cluster.names[2]]
    s.cluster.nic["slow"] = {s.cluster.names[2]: ["mlx5_8"]}
    res = s.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    result = s.result()
    assert result["status"] == "fail" and result["plateauBusbw"] < 175.14
    assert [p["round"] for p in result["pairs"]] == [1, 1, 2, 2]  # log2(4) rounds
    assert {tuple(p["index"]) for p in result["pairs"] if not p["pass"]} == {(2, 3), (0, 2)}
    assert result["suspects"] == ["ml-dev-env-2"]
    bad = [n for n in result["nics"] if not n["pass"]]
    assert [(n["pod"], n["hca"], n["interface"]) for n in bad] == [("ml-dev-env-2", "mlx5_8", "net3")]
    assert any("ml-dev-env-2 mlx5_8 (net3): ib_write_bw 97.1 Gb/s" in d for d in result["diagnosis"])
    assert "per-HCA ib_write_bw" in res.stdout and "LOW" in res.stdout
    # the client ran on the suspect, the server on a cleared partner, over the same NIC index
    clients = [c for c in s.calls("ib_write_bw") if c["host"] == s.cluster.names[2]]
    assert [c["args"][c["args"].index("-d") + 1] for c in clients] == ["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    partner = s.cluster.hosts[result["nics"][2]["partner"]]
    assert partner["pod"] != "ml-dev-env-2"
    assert clients[2]["args"][-1] == partner["ifaces"]["net3"]["inet"].split("/")[0]
    assert s.run("status").returncode == 1


def test_full_ring_slow_but_pairs_fine_points_at_rack_placement(sim) -> None:
    s: Sim = sim(4)
    s.cluster.allreduce["full_ring_busbw"] = 120.0  # interleaved racks: only the full ring crosses them
    res = s.run("gate")
    assert res.returncode == 1
    result = s.result()
    assert all(p["pass"] for p in result["pairs"]) and result["suspects"] == []
    assert any("fabricCheck.nodeRacks" in d for d in result["diagnosis"])


def test_every_pair_slow_is_fabric_wide(sim) -> None:
    s: Sim = sim(3)
    s.cluster.allreduce["busbw"] = 50.0
    res = s.run("gate")
    assert res.returncode == 1
    result = s.result()
    assert result["pairs"] and not any(p["pass"] for p in result["pairs"])
    assert result["suspects"] == [] and any("fabric-wide" in d for d in result["diagnosis"])


def test_no_expectation_reports_without_judging(sim) -> None:
    s: Sim = sim(2)
    s.settings = {**s.settings, "expectation": None, "linkGbps": None}
    s.cluster.allreduce["busbw"] = 20.0
    res = s.run("gate")
    assert res.returncode == 0, res.stdout
    assert s.result()["status"] == "no-expectation" and "measurement only" in res.stdout


def test_single_pod_is_skipped(sim) -> None:
    s: Sim = sim(1)
    res = s.run("gate")
    assert res.returncode == 0 and s.result()["status"] == "skipped" and not s.calls("mpirun")


def test_mpirun_failure_is_an_error(sim) -> None:
    s: Sim = sim(2)
    s.cluster.allreduce["fail"] = True
    res = s.run("gate", "--no-localise")
    assert res.returncode == 1
    result = s.result()
    assert result["status"] == "error" and "ORTE was unable to reliably start" in result["diagnosis"][0]


def test_status_without_a_result(sim) -> None:
    s: Sim = sim(2)
    res = s.run("status")
    assert res.returncode == 2 and "no fabric gate result yet" in res.stdout


def test_missing_rank_env_is_reported_not_a_traceback(sim) -> None:
    s: Sim = sim(2)
    env = s.env(0)
    (Path(env["ML_DEV_STATE_DIR"]) / "rank.env").unlink()
    import subprocess
    import sys

    for args in (["gate"], ["preflight", "--all"]):
        res = subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert "rank.env: the startup script writes it (the rank contract)" in res.stdout
