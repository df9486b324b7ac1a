"""Preflight: the real program against simulated pods; every failure is one line naming pod, node, device, fix."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fabric.conftest import Sim


def test_healthy_pod_passes(sim: Callable[..., Sim]) -> None:
    s = sim(2)
    res = s.run("preflight", "--verbose")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout
    assert "preflight ml-dev-env-0: passed" in res.stdout
    # what it looked at: every configured HCA, its link rate, each interface, the GID, memlock, IOMMU and GPUs
    for expected in (
        "mlx5_8: port 1 Active at 400 Gb/s",
        "net3: MTU 9000, 10.0.105.10/24",
        "mlx5_9: GID index 3 RoCE v2",
        "mlx5_6: allocated by openshift.io/eno5np0rdma",
        "memlock: max locked memory unlimited",
        "mlx5_7: IOMMU passthrough",
        "GPUs: 4 visible",
    ):
        assert expected in res.stdout, res.stdout


def gid(h: dict, hca: str, index: str, value: str, kind: str) -> None:
    h["gids"][hca][index] = [value, kind]


CASES = [
    # (id, mutate host 0, device, problem, fix)
    (
        "hca-missing",
        lambda h: h.update(hcas=["mlx5_6", "mlx5_7", "mlx5_8"]),
        "mlx5_9",
        "HCA not present in this pod (present: mlx5_6, mlx5_7, mlx5_8)",
        "network.rdma.hcas must list the VF HCAs",
    ),
    (
        "sriov-not-allocated",
        lambda h: h["env"].update(PCIDEVICE_OPENSHIFT_IO_ENO8NP0RDMA=None),
        "openshift.io/eno8np0rdma",
        "no PCIDEVICE_OPENSHIFT_IO_ENO8NP0RDMA in the environment",
        "network.rdma.sriovResources",
    ),
    (
        "sriov-other-hca",
        lambda h: (
            h["sriov"]["openshift.io/eno8np0rdma"].__setitem__(1, "mlx5_11"),
            h.update(hcas=["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_11"]),
            h["ibstat"].update(mlx5_11={"state": "Active", "rate": 400}),
        ),
        "mlx5_9",
        "not backed by a VF allocated to this pod",
        "network.rdma.hcas: use the allocated VF HCAs",
    ),
    (
        "port-down",
        lambda h: h["ibstat"].update(mlx5_7={"state": "Down", "rate": 10}),
        "mlx5_7",
        "port 1 is Down (physical state Disabled)",
        "node prerequisite: link up",
    ),
    (
        "rate-capped",
        lambda h: h["ibstat"].update(mlx5_8={"state": "Active", "rate": 100}),
        "mlx5_8",
        "port 1 Active at 100 Gb/s, expected 400 Gb/s",
        "PHY_RATE_MASK",
    ),
    ("mtu-1500", lambda h: h["ifaces"]["net2"].update(mtu=1500), "net2", "MTU 1500, expected 9000", "NetworkAttachmentDefinition's mtu"),
    ("no-address", lambda h: h["ifaces"]["net4"].update(inet=None), "net4", "no IPv4 address", "whereabouts range; network.rdma.subnets"),
    ("interface-missing", lambda h: h["ifaces"].pop("net3"), "net3", "interface missing", "network.rdma.attachments"),
    (
        "gid-roce-v1",
        lambda h: gid(h, "mlx5_6", "3", "0000:0000:0000:0000:0000:ffff:0a00:670a", "IB/RoCE v1"),
        "mlx5_6",
        "GID index 3 is 0000:0000:0000:0000:0000:ffff:0a00:670a type IB/RoCE v1, not a RoCE v2 IPv4 GID",
        "network.rdma.gidIndex (this HCA has none)",
    ),
    (
        "gid-ipv6-only",
        lambda h: (
            gid(h, "mlx5_7", "3", "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
            gid(h, "mlx5_7", "5", "0000:0000:0000:0000:0000:ffff:0a00:680a", "RoCE v2"),
        ),
        "mlx5_7",
        "not a RoCE v2 IPv4 GID",
        "network.rdma.gidIndex (RoCE v2 IPv4 GIDs on this HCA: index 5)",
    ),
    (
        "memlock-8m",
        lambda h: h.update(memlock="8388608"),
        "memlock",
        "max locked memory is 8388608 bytes, not unlimited",
        "security.memlock.mode",
    ),
    ("iommu-translated", lambda h: h.update(iommu="DMA-FQ"), "mlx5_6", "IOMMU domain type DMA-FQ (translated DMA)", "iommu=pt"),
    ("iommu-dma", lambda h: h.update(iommu="DMA"), "mlx5_9", "IOMMU domain type DMA (translated DMA)", "IOMMU off in the BIOS"),
    ("gpus-missing", lambda h: h.update(gpus=2), "GPUs", "2 visible, expected 4", "nodes.gpusPerPod"),
]


@pytest.mark.parametrize(("mutate", "device", "problem", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_failure_is_one_line_with_pod_node_device_and_fix(sim, mutate, device, problem, fix) -> None:
    s = sim(2)
    s.cluster.build()
    mutate(s.cluster.host(0))
    res = s.run("preflight")
    assert res.returncode == 1, res.stdout + res.stderr
    fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    ours = [line for line in fails if line.startswith(f"FAIL ml-dev-env-0 (node gpu-node-0) {device}: ")]
    assert ours, res.stdout
    assert any(problem in line.split("; fix: ")[0] and fix in line.split("; fix: ", 1)[1] for line in ours), ours
    assert "preflight ml-dev-env-0: FAILED" in res.stdout


def test_sriov_allocation_mismatch_names_both_sides(sim) -> None:
    s = sim(2)
    s.cluster.build()
    h = s.cluster.host(0)
    h["sriov"]["openshift.io/eno8np0rdma"][1] = "mlx5_11"
    h["hcas"].append("mlx5_11")
    h["ibstat"]["mlx5_11"] = {"state": "Active", "rate": 400}
    res = s.run("preflight")
    assert "mlx5_11: allocated VF (openshift.io/eno8np0rdma 0000:63:00.2) is not in network.rdma.hcas" in res.stdout, res.stdout


def test_tcp_mode_checks_only_gpus(sim) -> None:
    s = sim(2)
    s.settings = {**s.settings, "mode": "tcp", "hcas": [], "sriovResources": [], "interfaces": [], "gidIndex": None}
    s.cluster.build()
    s.cluster.host(0).update(memlock="8388608", iommu="DMA")
    res = s.run("preflight", "--verbose")
    assert res.returncode == 0, res.stdout
    assert "GPUs: 4 visible" in res.stdout and not s.calls("ibv_devinfo")


def test_preflight_all_runs_on_every_pod_over_ssh(sim) -> None:
    s = sim(3)
    s.cluster.build()
    s.cluster.host(2)["ibstat"]["mlx5_9"] = {"state": "Active", "rate": 100}
    res = s.run("preflight", "--all")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "preflight ml-dev-env-0: passed" in res.stdout and "preflight ml-dev-env-1: passed" in res.stdout
    fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL ml-dev-env-2 (node gpu-node-2) mlx5_9: port 1 Active at 100 Gb/s")
    assert sorted(c["args"][-2] for c in s.calls("ssh")) == sorted(s.cluster.names)


def test_unreachable_pod_is_a_failure(sim) -> None:
    s = sim(2)
    s.cluster.build()
    rank_env = s.tmp / "state" / "ml-dev-env-0" / "rank.env"
    res = s.run("preflight", "--all")
    assert res.returncode == 0, res.stdout
    text = rank_env.read_text().replace("ml-dev-env-1.ml-dev-env-headless", "ml-dev-env-9.ml-dev-env-headless")
    s.cluster.rank_env = lambda name: text  # type: ignore[method-assign]
    res = s.run("preflight", "--all")
    assert res.returncode == 1
    assert "FAIL ml-dev-env-9.ml-dev-env-headless.nccl-test.svc.cluster.local: preflight did not run (ssh: Could not resolve" in res.stdout


def test_hca_entries_with_a_port_suffix(sim) -> None:
    s = sim(2)
    s.settings = {**s.settings, "hcas": ["mlx5_6:1", "mlx5_7:1", "mlx5_8:1", "mlx5_9:1"]}
    res = s.run("preflight", "--verbose")
    assert res.returncode == 0, res.stdout
    assert "mlx5_8: port 1 Active at 400 Gb/s" in res.stdout and "mlx5_6: GID index 3 RoCE v2" in res.stdout


def test_iommu_off_passes(sim) -> None:
    s = sim(2)
    s.cluster.build()
    s.cluster.host(0)["iommu"] = None  # no iommu_group link under the PCI device
    res = s.run("preflight", "--verbose")
    assert res.returncode == 0 and "mlx5_6: IOMMU off" in res.stdout, res.stdout
