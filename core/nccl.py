"""NCCL environment for RDMA and TCP modes (pure functions, no Pulumi).

`GOLD_STANDARD` is the set validated on barcelona at ~194 GB/s bus bandwidth on 5 nodes.
The cluster-specific values (HCA list, socket
interfaces, GID index, GDR level, cross-NIC) are not in it: they come from the stack's typed
`network.rdma` settings, and every value can be overridden per stack with `network.ncclEnv`.
"""

from __future__ import annotations

from collections.abc import Mapping

GOLD_STANDARD: dict[str, str] = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_DMABUF_ENABLE": "1",
    "NCCL_NET_GDR_READ": "1",
    "NCCL_MIN_NCHANNELS": "8",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_IB_TIMEOUT": "23",
    "NCCL_IB_RETRY_CNT": "7",
    "NCCL_IB_TC": "106",
    "NCCL_IB_SL": "0",
    "NCCL_IB_AR_THRESHOLD": "8192",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "Ring",
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_NTHREADS": "640",
    "NCCL_LL_THRESHOLD": "0",
    "NCCL_TREE_THRESHOLD": "0",
    "NCCL_SOCKET_FAMILY": "4",
    "NCCL_NSOCKS_PERTHREAD": "8",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_NET_SHARED_BUFFERS": "1",
    "NCCL_NET_OVERHEAD": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_P2P_LEVEL": "NVL",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
}

TCP_DEFAULTS: dict[str, str] = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_DEBUG": "INFO",
}

# Variables derived from typed settings; `network.ncclEnv` may not set them a second time.
RDMA_TYPED_KEYS = {
    "NCCL_IB_HCA": "network.rdma.hcas",
    "NCCL_SOCKET_IFNAME": "network.rdma.socketInterfaces",
    "NCCL_IB_GID_INDEX": "network.rdma.gidIndex",
    "NCCL_NET_GDR_LEVEL": "network.rdma.gdrLevel",
    "NCCL_CROSS_NIC": "network.rdma.crossNic",
}
TCP_TYPED_KEYS = {
    "NCCL_SOCKET_IFNAME": "network.tcp.interfaceExclude",
    "NCCL_P2P_LEVEL": "network.tcp.p2pLevel",
}


def rdma_env(
    *,
    hcas: list[str] | None,
    socket_interfaces: list[str],
    gid_index: int,
    gdr_level: int | str,
    cross_nic: int,
    overrides: Mapping[str, str],
) -> dict[str, str]:
    """NCCL env for RDMA: gold standard, then typed cluster values, then per-stack overrides.

    `hcas=None` means auto-detection at pod start (the startup script sets NCCL_IB_HCA).
    """
    env = dict(GOLD_STANDARD)
    if hcas is not None:
        env["NCCL_IB_HCA"] = ",".join(hcas)
    env["NCCL_SOCKET_IFNAME"] = ",".join(socket_interfaces)
    env["NCCL_IB_GID_INDEX"] = str(gid_index)
    env["NCCL_NET_GDR_LEVEL"] = str(gdr_level)
    env["NCCL_CROSS_NIC"] = str(cross_nic)
    env.update(overrides)
    return dict(sorted(env.items()))


def tcp_env(*, interface_exclude: str, p2p_level: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """NCCL env for TCP sockets: InfiniBand disabled, primary interface only."""
    env = dict(TCP_DEFAULTS)
    env["NCCL_SOCKET_IFNAME"] = interface_exclude
    env["NCCL_P2P_LEVEL"] = p2p_level
    env.update(overrides)
    env["NCCL_IB_DISABLE"] = "1"
    return dict(sorted(env.items()))
