"""Fabric check: expected NCCL bus bandwidth and the settings the in-pod program reads (pure, no Pulumi).

The pods run `inpod/fabric/` (`fabric_check.py` in the pod) (delivered in the startup ConfigMap next to
`startup.sh`, mounted at /opt/ml-dev-env). It reads `fabric.json`, written here from the stack
config, so the preflight and the gate judge exactly what the stack configured.

Expected bus bandwidth
----------------------
nccl-tests reports `busbw` for all-reduce as algbw × 2(n−1)/n, which for a ring spanning several
pods approaches the bandwidth each pod pushes through its NICs, independent of the pod count. So

    expected busbw [GB/s] = NICs carrying traffic × link rate [Gbit/s] / 8 × efficiency

with NICs carrying traffic = min(NICs, GPUs per pod) (NCCL drives each NIC from a GPU next to it).

The efficiency constant is calibrated on the one validated measurement of this stack: barcelona,
5 pods × 4 H100, 4 RoCE SR-IOV VFs at 400 Gbit/s each, the validated NCCL set (core/nccl.py),
all_reduce_perf at 8 GB: 194.6 GB/s bus bandwidth. Line rate there is 4 × 400 / 8 = 200 GB/s, so

    RDMA_EFFICIENCY = 194.6 / 200 = 0.973

TCP has no calibration point: a TCP expectation needs `fabricCheck.tcpLinkGbps` and `tcpEfficiency`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import inpod
from inpod import contract
from stacks.config import StackConfig

PROGRAM = inpod.path("fabric_check.py")
RANK_ORDER = inpod.path("rank_order.sh")
CONFIG_KEY = contract.FABRIC_SETTINGS_FILE
PROGRAM_KEY = "fabric_check.py"

# Calibration point (see the module docstring).
CALIBRATION_BUSBW_GBS = 194.6
CALIBRATION_NICS = 4
CALIBRATION_LINK_GBPS = 400.0
RDMA_EFFICIENCY = round(CALIBRATION_BUSBW_GBS / (CALIBRATION_NICS * CALIBRATION_LINK_GBPS / 8), 3)  # 0.973

MIN_BYTES = 1 << 20  # 1 MiB
MAX_BYTES = 8 << 30  # 8 GiB


def line_rate_gbs(nics: int, link_gbps: float) -> float:
    """Aggregate line rate of `nics` links in GB/s (10^9 bytes, the unit nccl-tests reports)."""
    return nics * link_gbps / 8


@dataclass(frozen=True)
class Expectation:
    nics: int
    """NICs that carry traffic: min(configured NICs, GPUs per pod)."""
    link_gbps: float
    efficiency: float
    expected_busbw_gbs: float
    threshold_fraction: float
    pass_busbw_gbs: float
    """The gate passes at or above this plateau bus bandwidth."""


def expected_busbw(*, nics: int, gpus_per_pod: int, link_gbps: float, efficiency: float) -> float:
    if nics < 1 or gpus_per_pod < 1:
        raise ValueError("nics and gpus_per_pod must be at least 1")
    return round(line_rate_gbs(min(nics, gpus_per_pod), link_gbps) * efficiency, 2)


def configured_nics(config: StackConfig) -> int:
    """NICs the pods use: one per RDMA attachment; TCP uses the pod's primary interface."""
    if config.network.effective_mode == "rdma":
        return len(config.network.rdma.attachments)
    return 1


def expectation(config: StackConfig) -> Expectation | None:
    """The gate's expectation, or None when config gives no link rate for the effective transport."""
    fc = config.fabric_check
    link: float | None
    efficiency: float | None
    if config.network.effective_mode == "rdma":
        link, efficiency = fc.link_gbps, fc.efficiency if fc.efficiency is not None else RDMA_EFFICIENCY
    else:
        link, efficiency = fc.tcp_link_gbps, fc.tcp_efficiency
    if link is None or efficiency is None:
        return None
    nics = min(configured_nics(config), config.nodes.gpus_per_pod)
    expected = expected_busbw(nics=nics, gpus_per_pod=config.nodes.gpus_per_pod, link_gbps=link, efficiency=efficiency)
    return Expectation(
        nics=nics,
        link_gbps=link,
        efficiency=efficiency,
        expected_busbw_gbs=expected,
        threshold_fraction=fc.threshold_fraction,
        pass_busbw_gbs=round(expected * fc.threshold_fraction, 2),
    )


def pod_settings(config: StackConfig) -> dict:
    """Content of fabric.json. Count-independent: scaling must not change the pod template's hash."""
    net = config.network
    rdma = net.rdma
    mode = net.effective_mode
    fc = config.fabric_check
    exp = expectation(config)
    return {
        "mode": mode,
        "hcaMode": rdma.hca_mode if mode == "rdma" else None,
        "hcas": list(rdma.hcas) if mode == "rdma" else [],
        "sriovResources": list(rdma.sriov_resources) if mode == "rdma" else [],
        "interfaces": list(rdma.socket_interfaces) if mode == "rdma" else [],
        "gidIndex": rdma.gid_index if mode == "rdma" else None,
        "mtu": rdma.mtu if mode == "rdma" else None,
        "gpusPerPod": config.nodes.gpus_per_pod,
        "linkGbps": fc.link_gbps if mode == "rdma" else fc.tcp_link_gbps,
        "expectation": asdict(exp) if exp else None,
        "minBytes": MIN_BYTES,
        "maxBytes": MAX_BYTES,
        "plateauMinBytes": fc.plateau_min_bytes,
        "onDeploy": fc.on_deploy,
        "onDeployTimeoutSeconds": fc.on_deploy_timeout_seconds,
        "nodeRacks": dict(fc.node_racks),
        "appName": config.cluster.app_name,
    }


def configmap_files(config: StackConfig) -> dict[str, str]:
    """Files added to the startup ConfigMap (mounted at /opt/ml-dev-env, mode 0555)."""
    return {
        **inpod.group("fabric"),
        CONFIG_KEY: json.dumps(pod_settings(config), indent=2, sort_keys=True) + "\n",
    }
