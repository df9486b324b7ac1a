"""Preflight: the real program in pods started from the render (barcelona: RDMA/SR-IOV; nerc-production: TCP), the
node's tools and sysfs as tests/podsim/nodetools.py gives them; every failure is one line naming pod, node, device, fix."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tests.fabric.conftest import Fabric

pytestmark = pytest.mark.timeout(300)


def test_healthy_pod_passes(fabric: Callable[..., Fabric]) -> None:
    f = fabric(2)
    res = f.run("preflight", "--verbose")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout
    assert "preflight ml-dev-env-0: passed" in res.stdout
    # what it looked at: every configured HCA, its link rate, each interface, the GID, memlock, IOMMU and GPUs
    for expected in (
        "mlx5_8: port 1 Active at 400 Gb/s",
        "net3: MTU 9000, 10.0.105.10/24",
        "mlx5_9: GID index 3 RoCE v2",
        "mlx5_6: allocated by openshift.io/eno5np0rdma",
        "mlx5_7: IOMMU passthrough",
        "GPUs: 4 visible",
    ):
        assert expected in res.stdout, res.stdout
    # the stack's SCC adds IPC_LOCK and SYS_RESOURCE: startup.sh raises PID 1's limit with it (a machine whose own
    # bounding set lacks SYS_RESOURCE cannot give it: that part is skipped, saying so)
    f.sim.require_capabilities("SYS_RESOURCE", what="the memlock-raised path (startup.sh raising PID 1's RLIMIT_MEMLOCK)")
    assert "memlock: max locked memory unlimited (PID 1), CAP_IPC_LOCK" in res.stdout, res.stdout


def gid(h: dict, hca: str, index: str, value: str, kind: str) -> None:
    h["gids"][hca][index] = [value, kind]


def ipv6_gid_at_index_3(h: dict) -> None:
    """mlx5_7's configured GID index holds a link-local IPv6 GID; its IPv4 RoCE v2 GID is at another index."""
    gid(h, "mlx5_7", "3", "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")
    gid(h, "mlx5_7", "5", "0000:0000:0000:0000:0000:ffff:0a00:680a", "RoCE v2")


CASES = [
    # (id, mutate pod 0's node, device, problem, fix)
    (
        "hca-missing",
        lambda h: h.update(hcas=["mlx5_6", "mlx5_7", "mlx5_8"]),
        "mlx5_9",
        "HCA not present in this pod (present: mlx5_6, mlx5_7, mlx5_8)",
        "network.rdma.hcas must list the VF HCAs",
    ),
    (
        "sriov-other-hca",
        lambda h: (
            h["vfs"].__setitem__("0000:63:00.2", "mlx5_11"),
            h.update(hcas=["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_11"]),
            h["ports"].update(mlx5_11={"state": "Active", "rate": 400}),
        ),
        "mlx5_9",
        "not backed by a VF allocated to this pod",
        "network.rdma.hcas: use the allocated VF HCAs",
    ),
    (
        "port-down",
        lambda h: h["ports"].update(mlx5_7={"state": "Down", "rate": 10}),
        "mlx5_7",
        "port 1 is Down (physical state Disabled)",
        "node prerequisite: link up",
    ),
    (
        "rate-capped",
        lambda h: h["ports"].update(mlx5_8={"state": "Active", "rate": 100}),
        "mlx5_8",
        "port 1 Active at 100 Gb/s, expected 400 Gb/s",
        "PHY_RATE_MASK",
    ),
    (
        "gid-roce-v1",
        lambda h: gid(h, "mlx5_6", "3", "0000:0000:0000:0000:0000:ffff:0a00:670a", "IB/RoCE v1"),
        "mlx5_6",
        "GID index 3 is 0000:0000:0000:0000:0000:ffff:0a00:670a type IB/RoCE v1, not a RoCE v2 IPv4 GID",
        "network.rdma.gidIndex (this HCA has none)",
    ),
    (
        "gid-ipv6-only",
        ipv6_gid_at_index_3,
        "mlx5_7",
        "not a RoCE v2 IPv4 GID",
        "network.rdma.gidIndex (RoCE v2 IPv4 GIDs on this HCA: index 5)",
    ),
    ("iommu-translated", lambda h: h.update(iommu="DMA-FQ"), "mlx5_6", "IOMMU domain type DMA-FQ (translated DMA)", "iommu=pt"),
    ("iommu-dma", lambda h: h.update(iommu="DMA"), "mlx5_9", "IOMMU domain type DMA (translated DMA)", "IOMMU off in the BIOS"),
    ("gpus-missing", lambda h: h.update(gpus=2), "GPUs", "2 visible, expected 4", "nodes.gpusPerPod"),
]
# what the pod's own kernel and runtime state decide (no node stub): interfaces and the device plugin's env
POD_CASES = [
    # (id, shell run in pod 0 before preflight (as root in its network namespace) or an env prefix, device, problem, fix)
    ("mtu-1500", "ip link set net2 mtu 1500", "net2", "MTU 1500, expected 9000", "NetworkAttachmentDefinition's mtu"),
    ("no-address", "ip addr flush dev net4", "net4", "no IPv4 address", "whereabouts range; network.rdma.subnets"),
    ("interface-missing", "ip link del net3", "net3", "interface missing", "network.rdma.attachments"),
]


def failure_lines(stdout: str, device: str) -> list[str]:
    fails = [line for line in stdout.splitlines() if line.startswith("FAIL")]
    return [line for line in fails if line.startswith(f"FAIL ml-dev-env-0 (node node-0) {device}: ")]


def assert_one_line(res, device: str, problem: str, fix: str) -> None:
    assert res.returncode == 1, res.stdout + res.stderr
    ours = failure_lines(res.stdout, device)
    assert ours, res.stdout
    assert any(problem in line.split("; fix: ")[0] and fix in line.split("; fix: ", 1)[1] for line in ours), ours
    assert "preflight ml-dev-env-0: FAILED" in res.stdout


@pytest.mark.parametrize(("mutate", "device", "problem", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_failure_is_one_line_with_pod_node_device_and_fix(fabric, mutate, device, problem, fix) -> None:
    f = fabric(2)
    mutate(f.state(0))
    f.apply(0)
    assert_one_line(f.run("preflight"), device, problem, fix)


@pytest.mark.parametrize(("change", "device", "problem", "fix"), [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_each_interface_failure_is_one_line(fabric, change, device, problem, fix) -> None:
    # pods whose interfaces this test changes are its own (not reused by the module's other tests)
    f = fabric(2, key=f"iface-{device}")
    # what Multus/the CNI gave the pod, changed from outside (the pod's user has no NET_ADMIN)
    subprocess.run(["ip", "-n", f.sim.pods[0].netns, *change.split()[1:]], capture_output=True, timeout=30, check=True)
    assert_one_line(f.run("preflight"), device, problem, fix)


def test_sriov_not_allocated_is_named(fabric) -> None:
    """The SR-IOV device plugin gave no VF for one resource: its PCIDEVICE_* variable is missing."""
    f = fabric(2)
    res = f.run("preflight", prefix="env -u PCIDEVICE_OPENSHIFT_IO_ENO8NP0RDMA ")
    assert_one_line(
        res, "openshift.io/eno8np0rdma", "no PCIDEVICE_OPENSHIFT_IO_ENO8NP0RDMA in the environment", "network.rdma.sriovResources"
    )


def test_sriov_allocation_mismatch_names_both_sides(fabric) -> None:
    f = fabric(2)
    h = f.state(0)
    h["vfs"]["0000:63:00.2"] = "mlx5_11"
    h["hcas"].append("mlx5_11")
    h["ports"]["mlx5_11"] = {"state": "Active", "rate": 400}
    f.apply(0)
    res = f.run("preflight")
    assert "mlx5_11: allocated VF (openshift.io/eno8np0rdma 0000:63:00.2) is not in network.rdma.hcas" in res.stdout, res.stdout


def test_memlock_without_ipc_lock_fails_on_rdma(fabric) -> None:
    """security.memlock.mode none: restricted-v2 (no IPC_LOCK), PID 1 at the kernel's 8 MiB."""

    def no_scc(objects: dict) -> None:
        objects["security"] = {**objects.get("security", {}), "memlock": {"mode": "none"}}

    f = fabric(2, mutate=no_scc, key="memlock-none")
    assert_one_line(f.run("preflight"), "memlock", "max locked memory is 8388608 bytes, not unlimited", "security.memlock.mode")


def test_tcp_stack_checks_only_gpus_and_memlock_passes(fabric) -> None:
    """nerc-production (TCP, restricted-v2, 8 MiB memlock, no HCAs): GPUs are checked, RDMA is not."""
    f = fabric(2, stack="nerc-production")
    res = f.run("preflight", "--verbose", host=1)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPUs: 4 visible" in res.stdout and "memlock: max locked memory 8388608 (PID 1)" in res.stdout, res.stdout
    assert not f.calls("ibv_devinfo") and not f.calls("ibstat")
    res = f.run("preflight", "--all")
    assert res.returncode == 0 and "preflight ml-dev-env-1: passed" in res.stdout, res.stdout + res.stderr


def test_preflight_all_runs_on_every_pod_over_ssh(fabric) -> None:
    f = fabric(3)
    f.state(2)["ports"]["mlx5_9"] = {"state": "Active", "rate": 100}
    f.apply(2)
    res = f.run("preflight", "--all")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "preflight ml-dev-env-0: passed" in res.stdout and "preflight ml-dev-env-1: passed" in res.stdout
    fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL ml-dev-env-2 (node node-2) mlx5_9: port 1 Active at 100 Gb/s")
    assert sorted({c["pod"] for c in f.calls("ibstat")}) == f.names, "each pod's preflight ran in that pod"


def test_unreachable_pod_is_a_failure(fabric) -> None:
    f = fabric(2)
    assert f.run("preflight", "--all").returncode == 0
    rank_env = f.sim.pods[0].path("/tmp/ml-dev-env/rank.env")
    text = rank_env.read_text()
    try:
        rank_env.write_text(text.replace("ml-dev-env-1.ml-dev-env-headless", "ml-dev-env-9.ml-dev-env-headless"))
        res = f.run("preflight", "--all")
    finally:
        rank_env.write_text(text)
    assert res.returncode == 1
    assert (
        "FAIL ml-dev-env-9.ml-dev-env-headless.nccl-test.svc.cluster.local: preflight did not run (ssh: Could not resolve" in res.stdout
    ), res.stdout


def test_hca_entries_with_a_port_suffix(fabric) -> None:
    f = fabric(2)
    res = f.run("preflight", "--verbose", settings={**f.settings, "hcas": ["mlx5_6:1", "mlx5_7:1", "mlx5_8:1", "mlx5_9:1"]})
    assert res.returncode == 0, res.stdout
    assert "mlx5_8: port 1 Active at 400 Gb/s" in res.stdout and "mlx5_6: GID index 3 RoCE v2" in res.stdout


def test_iommu_off_passes(fabric) -> None:
    f = fabric(2)
    f.state(0)["iommu"] = None  # no iommu_group link under the PCI device
    f.apply(0)
    res = f.run("preflight", "--verbose")
    assert res.returncode == 0 and "mlx5_6: IOMMU off" in res.stdout, res.stdout
