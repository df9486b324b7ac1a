"""Preflight: checks one pod (HCAs, SR-IOV allocation, link state and rate, interfaces, RoCEv2 GID, memlock, IOMMU,
GPU count), or every pod over SSH. One line per failure naming pod, node, device and the fix.

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
from pathlib import Path
from typing import Callable

from .. import contract
from .parse import parse_ibstat, parse_ibv_devinfo_list, parse_ip_addr, parse_nvidia_smi_list, parse_proc_limits
from .util import NO_RANK_ENV, PROGRAM, env, read_rank_env, read_text, remote, run, state_dir, sys_root, this_node, this_pod


class Findings:
    def __init__(self, pod: str, node: str) -> None:
        self.pod, self.node = pod, node
        self.failures: list[str] = []
        self.passes: list[str] = []

    def fail(self, device: str, problem: str, fix: str) -> None:
        self.failures.append(f"FAIL {self.pod} (node {self.node}) {device}: {problem}; fix: {fix}")

    def ok(self, device: str, what: str) -> None:
        self.passes.append(f"ok   {self.pod} (node {self.node}) {device}: {what}")

    def listed(self, device: str, cmd: list[str], timeout: float, parse: Callable[[str], list[str]], fix: str) -> list[str] | None:
        """What a listing tool lists (parsed), or None after one failed check naming the tool's own message."""
        out = run(cmd, timeout=timeout)
        if out.returncode != 0:
            self.fail(device, f"`{' '.join(cmd)}` failed ({out.stderr.strip() or out.returncode})", fix)
            return None
        return parse(out.stdout)


def sriov_env_name(resource: str) -> str:
    """The SR-IOV device plugin's variable: PCIDEVICE_<prefix>_<name>, '.' → '_', upper case
    (k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/pool_stub.go GetEnvs)."""
    prefix, _, name = resource.partition("/")
    return f"PCIDEVICE_{prefix}_{name}".replace(".", "_").upper()


def hcas_of_pci(root: Path, address: str) -> list[str]:
    path = root / "sys/bus/pci/devices" / address / "infiniband"
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


def hca_netdevs(root: Path, hca: str) -> list[str]:
    """The network interfaces of the PCI function behind an RDMA device: `/sys/class/infiniband/<hca>/device`
    is the parent (PCI) device (Linux Documentation/ABI/stable/sysfs-class-infiniband), and a PCI device's
    `net/` directory holds its netdevs (drivers/base/core.c device_add_class_symlinks; `ls
    /sys/bus/pci/devices/<bdf>/net`). An SR-IOV VF has one: its pod-side name (net1, net2, ...)."""
    try:
        return sorted(p.name for p in (root / "sys/class/infiniband" / hca.split(":")[0] / "device/net").iterdir())
    except OSError:
        return []


def roce_v2_ipv4_gids(root: Path, hca: str, port_number: int = 1) -> list[int]:
    """Indexes on the port whose GID is IPv4-mapped (::ffff:a.b.c.d) and whose type is RoCE v2
    (gid_attrs/types reads "IB/RoCE v1" or "RoCE v2": Linux drivers/infiniband/core/cache.c gid_type_str)."""
    port = root / "sys/class/infiniband" / hca / "ports" / str(port_number)
    found: list[int] = []
    try:
        names = sorted((p.name for p in (port / "gids").iterdir()), key=lambda n: int(n) if n.isdigit() else 1 << 30)
    except OSError:
        return found
    for name in names:
        gid = read_text(port / "gids" / name) or ""
        kind = read_text(port / "gid_attrs/types" / name) or ""
        if gid.lower().startswith("0000:0000:0000:0000:0000:ffff:") and kind == "RoCE v2":
            found.append(int(name))
    return found


def preflight(cfg: dict) -> Findings:
    """This pod's fabric facts, each check one finding. Why one function: the checks run in order and each later
    one reads what an earlier found (the HCAs, their ports, the links); one pass over one `Findings`."""
    root = sys_root()
    f = Findings(this_pod(), this_node())
    rdma = cfg.get("mode") == "rdma"
    hcas: list[str] = list(cfg.get("hcas") or [])
    ports: dict[str, int] = {}
    if rdma:
        if cfg.get("hcaMode") == "auto":
            hcas = [h for h in env("NCCL_IB_HCA").split(",") if h]
        # NCCL_IB_HCA entries may name a port (`mlx5_6:1`); devices are checked by name, links on that port
        ports = {h.split(":")[0]: int(h.split(":")[1]) if ":" in h and h.split(":")[1].isdigit() else 1 for h in hcas}
        hcas = list(ports)
        present = f.listed(
            "ibv_devinfo",
            ["ibv_devinfo", "-l"],
            30,
            parse_ibv_devinfo_list,
            "the image needs rdma-core/ibverbs-utils with the mlx5 provider (ibverbs-providers)",
        )
        if present is None:
            pass
        elif not present:
            f.fail(
                "RDMA devices",
                "no RDMA device in this pod",
                "the SR-IOV attachment did not happen: check network.rdma.attachments and network.rdma.sriovResources "
                "(pod annotation k8s.v1.cni.cncf.io/networks and the resource requests)",
            )
        if cfg.get("hcaMode") == "auto" and not hcas:
            hcas = present or []
        for hca in hcas:
            if present and hca not in present:
                f.fail(
                    hca,
                    f"HCA not present in this pod (present: {', '.join(present)})",
                    "network.rdma.hcas must list the VF HCAs this pod sees (`ibv_devinfo -l`); a wrong list costs ~50 % bandwidth",
                )
        # SR-IOV allocation: the PCI functions the device plugin gave this pod, and their HCAs.
        allocated: dict[str, tuple[str, str]] = {}
        for resource in cfg.get("sriovResources") or []:
            name = sriov_env_name(resource)
            value = env(name)
            if not value:
                f.fail(
                    resource,
                    f"no {name} in the environment: the SR-IOV device plugin allocated no VF",
                    "network.rdma.sriovResources must name the SriovNetworkNodePolicy resourceName; the node needs a free VF",
                )
                continue
            for address in [a for a in value.split(",") if a]:
                backing = hcas_of_pci(root, address)
                if not backing:
                    f.fail(
                        f"{resource} {address}",
                        "allocated VF has no RDMA device",
                        "node prerequisite: the SriovNetworkNodePolicy needs isRdma: true (and deviceType netdevice)",
                    )
                for hca in backing:
                    allocated[hca] = (resource, address)
        if allocated:
            listed = ", ".join(f"{h} ({r} {a})" for h, (r, a) in sorted(allocated.items()))
            for hca in hcas:
                if hca not in allocated:
                    f.fail(
                        hca,
                        f"not backed by a VF allocated to this pod (allocated: {listed})",
                        "network.rdma.hcas: use the allocated VF HCAs",
                    )
            for hca, (resource, address) in sorted(allocated.items()):
                if hcas and hca not in hcas:
                    f.fail(
                        hca,
                        f"allocated VF ({resource} {address}) is not in network.rdma.hcas: NCCL leaves it idle",
                        "add it to network.rdma.hcas",
                    )
                elif hca in hcas:
                    f.ok(hca, f"allocated by {resource} ({address})")
        # link state and rate
        link = cfg.get("linkGbps")
        for hca in hcas:
            if present and hca not in present:
                continue
            number = ports.get(hca, 1)
            out = run(["ibstat", hca], timeout=30)
            port = parse_ibstat(out.stdout).get(hca, {}).get(number)
            if out.returncode != 0 or port is None:
                f.fail(
                    hca,
                    f"`ibstat {hca}` gave no port {number} ({out.stderr.strip() or 'no output'})",
                    "the image needs infiniband-diags; the HCA must be visible (network.rdma.hcas)",
                )
                continue
            state = port.get("State", "?")
            rate_text = port.get("Rate", "0").split()[0]
            rate = float(rate_text) if re.match(r"^[0-9.]+$", rate_text) else 0.0
            if state != "Active":
                f.fail(
                    hca,
                    f"port {number} is {state} (physical state {port.get('Physical state', '?')})",
                    "node prerequisite: link up on the NIC and its switch port (check cabling, `ibstat` on the node)",
                )
            elif link and rate + 1e-6 < float(link):
                f.fail(
                    hca,
                    f"port {number} Active at {rate:g} Gb/s, expected {float(link):g} Gb/s",
                    "node prerequisite: NIC firmware/link speed (e.g. ConnectX-7 firmware enforcing PHY_RATE_MASK caps "
                    "links at ~100 Gb/s; mlnx_qos rate limits persist until a NIC reset), or set fabricCheck.linkGbps "
                    "to the real rate",
                )
            else:
                f.ok(hca, f"port {number} Active at {rate:g} Gb/s")
        # pod interfaces
        mtu = cfg.get("mtu") or 9000
        for iface in cfg.get("interfaces") or []:
            out = run(["ip", "addr", "show", "dev", iface], timeout=30)
            info = parse_ip_addr(out.stdout).get(iface)
            if out.returncode != 0 or info is None:
                f.fail(
                    iface,
                    "interface missing",
                    "network.rdma.attachments (Multus names the attachments net1..netN) and network.rdma.socketInterfaces",
                )
                continue
            if info["mtu"] != mtu:
                f.fail(
                    iface,
                    f"MTU {info['mtu']}, expected {mtu}",
                    "the NetworkAttachmentDefinition's mtu (network.rdma.mtu with createAttachments) and the PF/switch MTU",
                )
            if not info["inet"]:
                f.fail(iface, "no IPv4 address", "the attachment's IPAM (whereabouts range; network.rdma.subnets)")
            if info["mtu"] == mtu and info["inet"]:
                f.ok(iface, f"MTU {mtu}, {', '.join(info['inet'])}")
        # RoCEv2 GID at the configured index
        gid_index = cfg.get("gidIndex")
        for hca in hcas:
            if gid_index is None or (present and hca not in present):
                continue
            port_dir = root / "sys/class/infiniband" / hca / "ports" / str(ports.get(hca, 1))
            gid = read_text(port_dir / "gids" / str(gid_index))
            kind = read_text(port_dir / "gid_attrs/types" / str(gid_index))
            good = roce_v2_ipv4_gids(root, hca, ports.get(hca, 1))
            hint = f" (RoCE v2 IPv4 GIDs on this HCA: index {', '.join(map(str, good))})" if good else " (this HCA has none)"
            if gid is None:
                f.fail(hca, f"GID index {gid_index} unreadable", f"network.rdma.gidIndex{hint}")
            elif not gid.lower().startswith("0000:0000:0000:0000:0000:ffff:") or kind != "RoCE v2":
                f.fail(
                    hca,
                    f"GID index {gid_index} is {gid} type {kind or '?'}, not a RoCE v2 IPv4 GID",
                    f"network.rdma.gidIndex{hint}; without an address on the interface the GID table has no IPv4 entry",
                )
            else:
                f.ok(hca, f"GID index {gid_index} RoCE v2 {gid}")
        # IOMMU: translated DMA (type DMA or DMA-FQ) breaks RDMA registration (IBV_WC_LOC_PROT_ERR).
        # The group's `type` is its default domain (Linux drivers/iommu/iommu.c iommu_group_show_type:
        # blocked, identity, unmanaged, DMA, DMA-FQ or unknown); no iommu_group link = no IOMMU.
        for hca in hcas:
            group = root / "sys/class/infiniband" / hca / "device/iommu_group"
            kind = read_text(group / "type")
            if not group.exists():
                f.ok(hca, "IOMMU off")
            elif kind == "identity":
                f.ok(hca, "IOMMU passthrough")
            elif kind not in ("DMA", "DMA-FQ"):
                f.ok(hca, f"IOMMU group type {kind or 'not shown'} (not translated DMA)")
            else:
                f.fail(
                    hca,
                    f"IOMMU domain type {kind} (translated DMA): RDMA fails with IBV_WC_LOC_PROT_ERR",
                    "node prerequisite: IOMMU passthrough (MachineConfig kernelArguments iommu=pt, rolling reboot) "
                    "or IOMMU off in the BIOS",
                )
    # memlock (both modes: NCCL pins host buffers; RDMA needs it unlimited)
    # Judged by PID 1 (the startup script raised it there; `oc rsh`/`oc exec` shells start outside that tree
    # with the runtime's default), or this process's CAP_IPC_LOCK (no memlock limit applies with it:
    # Linux mm/mlock.c can_do_mlock()).
    limits = parse_proc_limits(read_text(sys_root() / "proc/1/limits") or read_text(sys_root() / "proc/self/limits") or "")
    soft = limits.get("Max locked memory", ("?", "?"))[0]
    status = (read_text(sys_root() / "proc/self/status") or "").splitlines()
    capeff = next((ln.split()[1] for ln in status if ln.startswith("CapEff:")), "0")
    ipc_lock = bool(int(capeff, 16) >> 14 & 1) if all(c in "0123456789abcdefABCDEF" for c in capeff) else False
    if rdma and soft != "unlimited" and not ipc_lock:
        f.fail(
            "memlock",
            f"max locked memory is {soft} bytes, not unlimited",
            "security.memlock.mode (scc with IPC_LOCK and SYS_RESOURCE, or privileged)",
        )
    else:
        f.ok("memlock", f"max locked memory {soft} (PID 1)" + (", CAP_IPC_LOCK" if ipc_lock else ""))
    # GPUs
    want = int(cfg.get("gpusPerPod") or 0)
    gpus = f.listed(
        "GPUs",
        ["nvidia-smi", "-L"],
        60,
        parse_nvidia_smi_list,
        "node prerequisite: NVIDIA GPU operator (driver, container toolkit) on this node",
    )
    if gpus is None:
        pass
    elif len(gpus) != want:
        f.fail(
            "GPUs",
            f"{len(gpus)} visible, expected {want}",
            "nodes.gpusPerPod, and nothing narrowing NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES",
        )
    else:
        f.ok("GPUs", f"{len(gpus)} visible")
    return f


def preflight_all() -> tuple[bool, list[str]]:
    try:
        rank = read_rank_env()
    except OSError:
        return False, ["FAIL " + NO_RANK_ENV.format(path=state_dir() / contract.RANK_ENV_FILE)]
    hosts = rank.get("ML_DEV_HOSTS", "").split()
    cmd = [env("ML_DEV_PYTHON", "python3"), str(PROGRAM), "preflight"]

    def one(host: str) -> tuple[str, subprocess.CompletedProcess]:
        return host, run(remote(host, cmd), timeout=300)

    ok = True
    lines = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        for host, res in pool.map(one, hosts):
            out = [ln for ln in res.stdout.splitlines() if ln.strip()]
            if res.returncode not in (0, 1) or not out:
                lines.append(
                    f"FAIL {host}: preflight did not run ({res.stderr.strip() or 'exit ' + str(res.returncode)}); "
                    "fix: the SSH fabric between pods (sshd in every pod, keys in the workspace)"
                )
                ok = False
                continue
            ok = ok and res.returncode == 0
            lines.extend(out)
    return ok, lines
