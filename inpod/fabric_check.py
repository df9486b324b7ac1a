#!/usr/bin/env python3
"""fabric-check: prove the GPU fabric inside the pods (Python 3 standard library only).

Delivered in the startup ConfigMap next to startup.sh (/opt/ml-dev-env/fabric_check.py) with
fabric.json, the stack's settings. Subcommands:

  preflight [--all]   checks this pod (or every pod over SSH): HCAs, SR-IOV allocation, link state and
                      rate, interface MTU/address, RoCEv2 GID, memlock, IOMMU mode, GPU count.
                      One line per failure naming pod, node, device and the fix. Exit 1 on any failure.
  gate                all_reduce_perf (nccl-tests, MPI build) across every pod with mpirun over SSH,
                      1 MiB..8 GiB; judges the plateau bus bandwidth against fabric.json's expectation;
                      on failure localises with pairwise runs (log2 n rounds) and per-HCA ib_write_bw.
                      Writes a table and JSON to the workspace and the state dir. Exit 1 on failure.
  status              prints the latest gate result (exit 0 pass, 1 fail, 2 none).
  hold                pod 0 at start with fabricCheck.onDeploy: retries preflight + gate until they pass
                      or the timeout; then keeps holding until a passing gate or `release`.
  release             lets a holding pod 0 start its dev servers although the gate did not pass.
  rank-order          prints pod names in rack-aware rank order (pod 0 first, consecutive ranks share a rack).

Environment: ML_DEV_FABRIC_CONFIG (fabric.json), ML_DEV_STATE_DIR (/tmp/ml-dev-env, holds rank.env),
ML_DEV_WORKSPACE (/workspace), ML_DEV_FABRIC_ROOT (prefix for /sys and /proc, tests), ML_DEV_SSH
(ssh command, default `ssh -o BatchMode=yes`), ML_DEV_PYTHON (python3 on the other pods), POD_NAME/ML_DEV_POD,
NODE_NAME. Runs on Python 3.8 and later (the images' own interpreters).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

# Handed to other pods: the startup ConfigMap's mount path (ML_DEV_DIR, core.naming.STARTUP_MOUNT) or this file
# as called, never resolve()d (the kubelet's `..<timestamp>` directory behind the mount differs on every pod).
PROGRAM = Path(os.environ.get("ML_DEV_DIR") or os.path.dirname(os.path.abspath(__file__))) / os.path.basename(__file__)


def sibling(name: str) -> Any:
    """A program shipped next to this one in the startup ConfigMap (this script's directory is sys.path[0]);
    None when it is missing (an older ConfigMap, or this file imported as a module by a test). Imported at
    start: the kubelet swaps the ConfigMap's `..data` symlink to a new `..<timestamp>` directory on an update
    and removes the old one (kubernetes pkg/volume/util/atomic_writer.go, AtomicWriter.Write)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


SVGPLOT = sibling("svgplot")  # the gate's curve (svgplot.gate_curve)
GIB = 1 << 30


# ------------------------------------------------------------------------------------ environment


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: the pods' python3 may be older than 3.11 (CUDA devel images)
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def state_dir() -> Path:
    return Path(env("ML_DEV_STATE_DIR", "/tmp/ml-dev-env"))


def sys_root() -> Path:
    return Path(env("ML_DEV_FABRIC_ROOT", "/"))


def load_config(path: str | None = None) -> dict:
    path = path or env("ML_DEV_FABRIC_CONFIG") or str(PROGRAM.parent / "fabric.json")
    return json.loads(Path(path).read_text())


def this_pod() -> str:
    return env("POD_NAME") or env("ML_DEV_POD") or socket.gethostname()  # POD_NAME: the downward API, always this pod


def this_node() -> str:
    return env("NODE_NAME", "?")


def read_rank_env(path: Path | None = None) -> dict[str, str]:
    """`export KEY=value` lines written by the startup script (the rank contract); values may be shell-quoted."""
    path = path or state_dir() / "rank.env"
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            words = words[1:]
        for word in words:
            if "=" in word:
                key, value = word.split("=", 1)
                values[key] = value
    return values


def ssh_command() -> list[str]:
    return shlex.split(env("ML_DEV_SSH", "ssh -o BatchMode=yes"))


def run(cmd: list[str], timeout: float | None = None, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env_extra or {}))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"{cmd[0]}: timed out after {timeout} s")


def remote(host: str, args: list[str]) -> list[str]:
    """Command line running `args` on `host` over the SSH fabric."""
    return [*ssh_command(), host, shlex.join(args)]


# ----------------------------------------------------------------------------------------- parsers


def parse_ibv_devinfo_list(text: str) -> list[str]:
    """`ibv_devinfo -l`: a "N HCAs found:" header, then one tab-indented device name per line."""
    return [line.strip() for line in text.splitlines() if line.strip() and not re.match(r"^\d+ HCAs? found:", line.strip())]


def parse_ibstat(text: str) -> dict[str, dict[int, dict[str, str]]]:
    """`ibstat [ca]`: "CA 'mlx5_6'" blocks with "Port N:" sub-blocks of "Key: value" lines."""
    cas: dict[str, dict[int, dict[str, str]]] = {}
    ca = None
    port = None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            ca, port = m.group(1), None
            cas[ca] = {}
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m and ca is not None:
            port = int(m.group(1))
            cas[ca][port] = {}
            continue
        m = re.match(r"^\s+([^:]+):\s*(.*)$", line)
        if m and ca is not None and port is not None:
            cas[ca][port][m.group(1).strip()] = m.group(2).strip()
    return cas


def parse_ip_addr(text: str) -> dict[str, dict]:
    """`ip addr show [dev X]`: "3: net1@if9: <...> mtu 9000 ... state UP" then "inet a.b.c.d/nn" lines."""
    links: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)(?:@[^:\s]+)?:\s+<([^>]*)>(.*)$", line)
        if m:
            current = m.group(1)
            mtu = re.search(r"\bmtu (\d+)", m.group(3))
            state = re.search(r"\bstate (\S+)", m.group(3))
            links[current] = {
                "flags": m.group(2).split(","),
                "mtu": int(mtu.group(1)) if mtu else None,
                "state": state.group(1) if state else None,
                "inet": [],
            }
            continue
        m = re.match(r"^\s+inet (\d+\.\d+\.\d+\.\d+)/(\d+)", line)
        if m and current is not None:
            links[current]["inet"].append(f"{m.group(1)}/{m.group(2)}")
    return links


def parse_nvidia_smi_list(text: str) -> list[str]:
    """`nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" per GPU (MIG lines are indented)."""
    return [line for line in text.splitlines() if re.match(r"^GPU \d+: ", line)]


def parse_proc_limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/<pid>/limits: "Limit  Soft Limit  Hard Limit  Units" columns separated by 2+ spaces."""
    limits = {}
    for line in text.splitlines()[1:]:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 3:
            limits[parts[0]] = (parts[1], parts[2])
    return limits


def parse_nccl_tests(text: str) -> dict:
    """nccl-tests performance output (src/common.cu writeBenchmarkLine*): one row per size,
    `size count type redop root` then out-of-place and in-place `time algbw busbw #wrong`."""
    rows = []
    avg = None
    wrong_total = 0
    for line in text.splitlines():
        m = re.match(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", line)
        if m:
            avg = float(m.group(1))
            continue
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        if len(parts) < 13 or not parts[0].isdigit():
            continue
        try:
            size, count = int(parts[0]), int(parts[1])
            oop = [float(parts[5]), float(parts[6]), float(parts[7])]
            ip = [float(parts[9]), float(parts[10]), float(parts[11])]
        except ValueError:
            continue
        wrong = [parts[8], parts[12]]
        wrong_n = sum(int(float(w)) for w in wrong if w != "N/A")
        wrong_total += wrong_n
        rows.append(
            {
                "bytes": size,
                "count": count,
                "type": parts[2],
                "redop": parts[3],
                "time_us": oop[0],
                "algbw": oop[1],
                "busbw": oop[2],
                "in_place_time_us": ip[0],
                "in_place_algbw": ip[1],
                "in_place_busbw": ip[2],
                "wrong": wrong_n,
            }
        )
    return {"rows": rows, "avg_busbw": avg, "wrong": wrong_total}


def parse_ib_write_bw(text: str) -> dict | None:
    """perftest bandwidth report (src/perftest_parameters.h RESULT_FMT_G / REPORT_FMT): a header
    ` #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]` and one result line."""
    unit = None
    for line in text.splitlines():
        m = re.match(r"^\s*#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]", line)
        if m:
            unit = m.group(2)
            continue
        if unit:
            parts = line.split()
            if len(parts) >= 5 and parts[0].isdigit():
                avg = float(parts[3])
                gbps = avg if unit == "Gb/sec" else avg * 8 * (1 << 20) / 1e9 if unit == "MiB/sec" else avg * 8 / 1e3
                return {
                    "bytes": int(parts[0]),
                    "iterations": int(parts[1]),
                    "peak": float(parts[2]),
                    "average": avg,
                    "unit": unit,
                    "gbps": round(gbps, 2),
                }
    return None


# ---------------------------------------------------------------------------------------- preflight


class Findings:
    def __init__(self, pod: str, node: str) -> None:
        self.pod, self.node = pod, node
        self.failures: list[str] = []
        self.passes: list[str] = []

    def fail(self, device: str, problem: str, fix: str) -> None:
        self.failures.append(f"FAIL {self.pod} (node {self.node}) {device}: {problem}; fix: {fix}")

    def ok(self, device: str, what: str) -> None:
        self.passes.append(f"ok   {self.pod} (node {self.node}) {device}: {what}")


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


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


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
        listing = run(["ibv_devinfo", "-l"], timeout=30)
        present = parse_ibv_devinfo_list(listing.stdout) if listing.returncode == 0 else []
        if listing.returncode != 0:
            f.fail(
                "ibv_devinfo",
                f"`ibv_devinfo -l` failed ({listing.stderr.strip() or listing.returncode})",
                "the image needs rdma-core/ibverbs-utils with the mlx5 provider (ibverbs-providers)",
            )
        elif not present:
            f.fail(
                "RDMA devices",
                "no RDMA device in this pod",
                "the SR-IOV attachment did not happen: check network.rdma.attachments and network.rdma.sriovResources "
                "(pod annotation k8s.v1.cni.cncf.io/networks and the resource requests)",
            )
        if cfg.get("hcaMode") == "auto" and not hcas:
            hcas = present
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
    out = run(["nvidia-smi", "-L"], timeout=60)
    gpus = parse_nvidia_smi_list(out.stdout) if out.returncode == 0 else []
    if out.returncode != 0:
        f.fail(
            "GPUs",
            f"`nvidia-smi -L` failed ({out.stderr.strip() or out.returncode})",
            "node prerequisite: NVIDIA GPU operator (driver, container toolkit) on this node",
        )
    elif len(gpus) != want:
        f.fail(
            "GPUs",
            f"{len(gpus)} visible, expected {want}",
            "nodes.gpusPerPod, and nothing narrowing NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES",
        )
    else:
        f.ok("GPUs", f"{len(gpus)} visible")
    return f


def cmd_preflight(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if not args.all:
        findings = preflight(cfg)
        for line in (findings.passes if args.verbose else []) + findings.failures:
            print(line)
        print(f"preflight {findings.pod}: {'FAILED, ' + str(len(findings.failures)) + ' problem(s)' if findings.failures else 'passed'}")
        return 1 if findings.failures else 0
    ok, lines = preflight_all()
    print("\n".join(lines))
    return 0 if ok else 1


NO_RANK_ENV = (
    "no {path}: the startup script writes it (the rank contract); fix: wait for the pod's startup, "
    "or check its log (oc logs <pod> -c ml-dev)"
)


def preflight_all() -> tuple[bool, list[str]]:
    try:
        rank = read_rank_env()
    except OSError:
        return False, ["FAIL " + NO_RANK_ENV.format(path=state_dir() / "rank.env")]
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


# --------------------------------------------------------------------------------------------- gate


def nccl_forward_env() -> list[str]:
    keys = sorted(k for k in os.environ if re.match(r"^(NCCL|UCX|CUDA_VISIBLE_DEVICES|LD_LIBRARY_PATH|PATH$)", k))
    return [a for k in keys for a in ("-x", k)]


def mpirun_cmd(hostfile: Path, nprocs: int, per_node: int, min_bytes: int, max_bytes: int) -> list[str]:
    """One MPI rank per GPU (`-g 1`), ranks filled host by host in hostfile order (= rank order).

    Open MPI 4.1 mpirun(1): `--hostfile` lines `<host> slots=N`, `-npernode N`, `-x VAR` exports VAR to the
    remote ranks, `--mca plm_rsh_agent` replaces `ssh` for starting the remote daemons; the base image's
    OpenMPI (NGC's, or Ubuntu's openmpi-bin 4.1) is 4.1.x."""
    rsh = env("ML_DEV_SSH")
    cmd = [
        env("ML_DEV_MPIRUN", "mpirun"),
        "--allow-run-as-root",
        "--hostfile",
        str(hostfile),
        "-np",
        str(nprocs),
        "-npernode",
        str(per_node),
        "--bind-to",
        "none",
        # MPI itself only bootstraps; keep its own traffic on the pod network
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "--mca",
        "oob_tcp_if_include",
        "eth0",
    ]
    if rsh:
        cmd += ["--mca", "plm_rsh_agent", rsh]
    cmd += nccl_forward_env()
    cmd += [env("ML_DEV_ALL_REDUCE_PERF", "all_reduce_perf"), "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", "1"]
    return cmd


def plateau(rows: list[dict], min_bytes: int) -> float | None:
    values = [r["busbw"] for r in rows if r["bytes"] >= min_bytes]
    return round(sum(values) / len(values), 2) if values else None


def all_reduce(hosts: list[str], gpus: int, min_bytes: int, max_bytes: int, workdir: Path, label: str) -> dict:
    hostfile = workdir / f"hostfile-{label}"
    hostfile.write_text("".join(f"{h} slots={gpus}\n" for h in hosts))
    cmd = mpirun_cmd(hostfile, len(hosts) * gpus, gpus, min_bytes, max_bytes)
    res = run(cmd, timeout=float(env("ML_DEV_FABRIC_RUN_TIMEOUT", "900")))
    (workdir / f"all_reduce-{label}.log").write_text(res.stdout + res.stderr)
    parsed = parse_nccl_tests(res.stdout)
    return {"cmd": shlex.join(cmd), "rc": res.returncode, "stderr": res.stderr.strip()[-2000:], **parsed}


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Hypercube pairing: round k pairs pod i with pod i XOR 2^k, so ceil(log2 n) rounds give every pod
    log2 n different partners. When n is not a power of two the missing partner is replaced by
    (i + 2^k) mod n, then by the next pod not yet paired with i; no pair is tested twice."""
    rounds: list[list[tuple[int, int]]] = []
    seen: set[tuple[int, int]] = set()
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        pairs = []
        for i in range(n):
            j = i ^ (1 << k)
            if j >= n:
                j = (i + (1 << k)) % n
            for step in range(n):
                candidate = (j + step) % n
                pair = (min(i, candidate), max(i, candidate))
                if candidate != i and pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
                    break
                if candidate == j and candidate != i and step == 0 and j == i ^ (1 << k):
                    break  # the hypercube partner was already tested from the other side
        if pairs:
            rounds.append(pairs)
    return rounds


def suspects_from_pairs(n: int, pairs: list[dict]) -> tuple[list[int], list[int]]:
    """(suspects, cleared): a pod with at least one passing pair is cleared; a pod all of whose pairs
    failed while it had a cleared partner is suspect."""
    cleared = {i for p in pairs if p["pass"] for i in p["index"]}
    suspects = []
    for i in range(n):
        mine = [p for p in pairs if i in p["index"]]
        if mine and i not in cleared and all(not p["pass"] for p in mine):
            partners = {j for p in mine for j in p["index"] if j != i}
            if partners & cleared:
                suspects.append(i)
    return suspects, sorted(cleared)


def interface_ipv4(host: str, iface: str) -> str | None:
    res = run(remote(host, ["ip", "addr", "show", "dev", iface]), timeout=60)
    info = parse_ip_addr(res.stdout).get(iface)
    return info["inet"][0].split("/")[0] if info and info["inet"] else None


def nic_bandwidth(cfg: dict, suspect: str, partner: str) -> list[dict]:
    """Per-HCA ib_write_bw from the suspect to a cleared partner (same NIC index, same subnet)."""
    results = []
    gid = cfg.get("gidIndex")
    link = cfg.get("linkGbps")
    exp = cfg.get("expectation") or {}
    need = link * exp.get("efficiency", 1.0) * exp.get("threshold_fraction", 0.9) if link else None
    hcas = cfg.get("hcas") or [h for h in env("NCCL_IB_HCA").split(",") if h]  # hcaMode auto: what startup detected
    for i, hca in enumerate(hcas):
        ifaces = cfg.get("interfaces") or []
        iface = ifaces[i] if i < len(ifaces) else None
        address = interface_ipv4(partner, iface) if iface else None
        entry = {"pod": suspect, "partner": partner, "hca": hca, "interface": iface, "gbps": None, "pass": False}
        if not address:
            entry["error"] = f"{partner} has no IPv4 address on {iface}"
            results.append(entry)
            continue
        port = str(18515 + i)
        name, _, ib_port = hca.partition(":")
        entry["hca"] = name
        base = ["ib_write_bw", "-d", name, "-i", ib_port or "1", "-F", "--report_gbits", "-D", "5", "-p", port]
        if gid is not None:
            base += ["-x", str(gid)]
        server = subprocess.Popen(remote(partner, base), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(float(env("ML_DEV_FABRIC_SERVER_WAIT", "2")))
        client = run(remote(suspect, [*base, address]), timeout=120)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
        parsed = parse_ib_write_bw(client.stdout)
        if parsed is None:
            entry["error"] = (client.stderr.strip() or "no bandwidth report")[-500:]
        else:
            entry["gbps"] = parsed["gbps"]
            entry["pass"] = need is None or parsed["gbps"] >= need
        entry["need_gbps"] = round(need, 2) if need else None
        results.append(entry)
    return results


def judge(busbw: float | None, exp: dict | None) -> str:
    if busbw is None:
        return "error"
    if not exp:
        return "no-expectation"
    return "pass" if busbw >= exp["pass_busbw_gbs"] else "fail"


def gate(cfg: dict, localise: bool = True) -> dict:
    try:
        rank = read_rank_env()
    except OSError:
        return {
            "time": utc_now(),
            "status": "error",
            "mode": cfg.get("mode"),
            "hosts": [],
            "gpusPerNode": cfg.get("gpusPerPod"),
            "expectation": cfg.get("expectation"),
            "plateauMinBytes": cfg.get("plateauMinBytes"),
            "diagnosis": [NO_RANK_ENV.format(path=state_dir() / "rank.env")],
        }
    hosts = rank.get("ML_DEV_HOSTS", "").split()
    pods = rank.get("ML_DEV_PODS", "").split() or hosts
    gpus = int(rank.get("GPUS_PER_NODE") or cfg.get("gpusPerPod") or 1)
    exp = cfg.get("expectation")
    min_plateau = int(cfg.get("plateauMinBytes") or 4 * GIB)
    result: dict = {
        "time": utc_now(),
        "mode": cfg.get("mode"),
        "pods": pods,
        "hosts": hosts,
        "gpusPerNode": gpus,
        "expectation": exp,
        "plateauMinBytes": min_plateau,
        "pairs": [],
        "suspects": [],
        "nics": [],
        "diagnosis": [],
    }
    if len(hosts) < 2:
        result.update(status="skipped", diagnosis=["single pod: all-reduce stays on NVLink/PCIe, nothing crosses the fabric"])
        return result
    workdir = Path(tempfile.mkdtemp(prefix="fabric-gate-", dir=str(ensure(state_dir() / "fabric"))))
    full = all_reduce(hosts, gpus, int(cfg.get("minBytes") or 1 << 20), int(cfg.get("maxBytes") or 8 * GIB), workdir, "all")
    busbw = plateau(full["rows"], min_plateau)
    status = judge(busbw, exp)
    result.update(command=full["cmd"], sizes=full["rows"], plateauBusbw=busbw, avgBusbw=full["avg_busbw"], wrong=full["wrong"])
    result["status"] = status
    if full["rc"] != 0 or not full["rows"]:
        result["status"] = "error"
        result["diagnosis"].append(f"all_reduce_perf across {len(hosts)} pods failed (exit {full['rc']}): {full['stderr'][-400:]}")
    elif full["wrong"]:
        result["status"] = "fail"
        result["diagnosis"].append(f"all_reduce_perf reported {full['wrong']} wrong elements: data corruption on the fabric")
    if result["status"] in ("pass", "no-expectation", "skipped") or not localise:
        return result
    # --- localisation: pairwise rounds, then per-HCA ib_write_bw on the suspects
    for k, pairs in enumerate(pair_rounds(len(hosts)), start=1):
        for a, b in pairs:
            run2 = all_reduce([hosts[a], hosts[b]], gpus, min_plateau, int(cfg.get("maxBytes") or 8 * GIB), workdir, f"{a}-{b}")
            bw = plateau(run2["rows"], min_plateau)
            ok = run2["rc"] == 0 and bw is not None and (not exp or bw >= exp["pass_busbw_gbs"])
            result["pairs"].append({"round": k, "index": [a, b], "pods": [pods[a], pods[b]], "busbw": bw, "pass": ok})
    suspects, cleared = suspects_from_pairs(len(hosts), result["pairs"])
    result["suspects"] = [pods[i] for i in suspects]
    if result["pairs"] and all(not p["pass"] for p in result["pairs"]):
        result["diagnosis"].append(
            "every pair is below the expectation: a fabric-wide cause (NCCL settings, MTU, switch QoS, "
            "IOMMU on every node); run `preflight --all`"
        )
    elif result["pairs"] and not suspects and all(p["pass"] for p in result["pairs"]):
        result["diagnosis"].append(
            "every pair reaches the expectation but the full ring does not: placement across racks or "
            "switch oversubscription; set fabricCheck.nodeRacks so consecutive ranks share a rack"
        )
    elif result["pairs"] and not suspects:
        result["diagnosis"].append("failing pairs do not single out a pod: see the pair table")
    for i in suspects:
        partner = next((hosts[j] for j in cleared if j != i), None)
        if partner is None:
            continue
        if cfg.get("mode") == "rdma":
            nics = nic_bandwidth(cfg, hosts[i], partner)
            for n in nics:
                n["pod"] = pods[i]
            result["nics"].extend(nics)
            bad = [n for n in nics if not n["pass"]]
            if bad:
                for n in bad:
                    got = f"{n['gbps']:g} Gb/s" if n["gbps"] is not None else n.get("error", "no result")
                    result["diagnosis"].append(
                        f"{pods[i]} {n['hca']} ({n['interface']}): ib_write_bw {got}, need {n.get('need_gbps')} Gb/s"
                    )
            else:
                result["diagnosis"].append(f"{pods[i]}: every HCA reaches line rate alone; check its GPUs/PCIe (nvidia-smi topo -m)")
        else:
            result["diagnosis"].append(f"{pods[i]}: every pair with it is slow")
    return result


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def table(result: dict) -> str:
    lines = [
        f"fabric gate {result['status'].upper()}  {result['time']}  mode {result.get('mode')}  "
        f"{len(result.get('hosts', []))} pods x {result.get('gpusPerNode')} GPUs"
    ]
    exp = result.get("expectation")
    if exp:
        lines.append(
            f"expected bus bandwidth {exp['expected_busbw_gbs']:.1f} GB/s = {exp['nics']} NICs x {exp['link_gbps']:g} Gbit/s / 8 "
            f"x {exp['efficiency']}; pass at >= {exp['pass_busbw_gbs']:.1f} GB/s ({exp['threshold_fraction']:g})"
        )
    else:
        lines.append("no expectation configured (fabricCheck.linkGbps): measurement only")
    if result.get("plateauBusbw") is not None:
        lines.append(f"plateau bus bandwidth (sizes >= {result['plateauMinBytes'] / GIB:g} GiB): {result['plateauBusbw']:.2f} GB/s")
    if result.get("sizes"):
        lines.append(f"{'size':>12}  {'algbw GB/s':>10}  {'busbw GB/s':>10}  {'in-place busbw':>14}")
        for r in result["sizes"]:
            mark = "  *" if r["bytes"] >= result["plateauMinBytes"] else ""
            lines.append(f"{human(r['bytes']):>12}  {r['algbw']:>10.2f}  {r['busbw']:>10.2f}  {r['in_place_busbw']:>14.2f}{mark}")
    if result.get("pairs"):
        lines.append("pairs (round, pods, plateau busbw):")
        for p in result["pairs"]:
            bw = f"{p['busbw']:.2f}" if p["busbw"] is not None else "-"
            lines.append(f"  {p['round']}  {p['pods'][0]} <-> {p['pods'][1]}  {bw} GB/s  {'ok' if p['pass'] else 'LOW'}")
    if result.get("nics"):
        lines.append("per-HCA ib_write_bw (pod -> cleared partner):")
        for n in result["nics"]:
            got = f"{n['gbps']:.2f} Gb/s" if n["gbps"] is not None else n.get("error", "-")
            lines.append(f"  {n['pod']} {n['hca']} ({n['interface']}) -> {n['partner']}: {got}  {'ok' if n['pass'] else 'LOW'}")
    for d in result.get("diagnosis", []):
        lines.append(f"diagnosis: {d}")
    return "\n".join(lines) + "\n"


def human(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def result_dirs() -> list[Path]:
    workspace = env("ML_DEV_WORKSPACE", "/workspace")
    return [Path(workspace) / ".ml-dev-env" / "fabric", state_dir() / "fabric"]


def gate_svg(result: dict) -> str | None:
    """The bus-bandwidth curve against the expectation (svgplot.gate_curve); None without svgplot.py."""
    return SVGPLOT.gate_curve(result) if SVGPLOT is not None else None


def write_result(result: dict) -> list[Path]:
    text = table(result)
    svg = gate_svg(result)
    stamp = result["time"].replace(":", "").replace("-", "")
    written = []
    for d in result_dirs():
        try:
            ensure(d)
            files = [
                (f"gate-{stamp}.json", json.dumps(result, indent=2)),
                ("latest.json", json.dumps(result, indent=2)),
                ("latest.txt", text),
            ]
            if svg is not None:  # the curve next to its JSON (svgplot.py, shipped beside this program)
                files += [(f"gate-{stamp}.svg", svg), ("latest.svg", svg)]
            for name, content in files:
                tmp = d / f".{name}.tmp"
                tmp.write_text(content + ("" if content.endswith("\n") else "\n"))
                tmp.replace(d / name)
            written.append(d)
        except OSError as exc:
            print(f"WARNING: cannot write results to {d}: {exc}", file=sys.stderr)
    return written


def cmd_gate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    result = gate(cfg, localise=not args.no_localise)
    written = write_result(result)
    sys.stdout.write(table(result))
    for d in written:
        print(f"result: {d / 'latest.json'}")
    return 0 if result["status"] in ("pass", "no-expectation", "skipped") else 1


def latest() -> dict | None:
    for d in reversed(result_dirs()):
        path = d / "latest.json"
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                return None
    return None


def cmd_status(args: argparse.Namespace) -> int:
    result = latest()
    if result is None:
        print("no fabric gate result yet (run: fabric_check.py gate)")
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(table(result))
    return 0 if result["status"] in ("pass", "no-expectation", "skipped") else 1


# --------------------------------------------------------------------------------------------- hold


def release_marker() -> Path:
    return state_dir() / "fabric" / "release"


def cmd_release(args: argparse.Namespace) -> int:
    ensure(release_marker().parent)
    release_marker().write_text(utc_now() + "\n")
    print(f"released: pod 0 starts its dev servers ({release_marker()})")
    return 0


def passed_or_released(since: float) -> bool:
    if release_marker().exists():
        return True
    path = state_dir() / "fabric" / "latest.json"
    if path.exists() and path.stat().st_mtime >= since:
        try:
            return json.loads(path.read_text()).get("status") in ("pass", "no-expectation", "skipped")
        except ValueError:
            return False
    return False


def peers_reachable() -> tuple[bool, str]:
    try:
        rank = read_rank_env()
    except OSError:
        return False, "rank.env not written yet"
    hosts = rank.get("ML_DEV_HOSTS", "").split()
    if len(hosts) != int(rank.get("NNODES") or 0):
        return False, f"rank.env lists {len(hosts)} hosts for NNODES={rank.get('NNODES')}"
    for host in hosts:
        if run(remote(host, ["true"]), timeout=30).returncode != 0:
            return False, f"{host} not reachable over SSH yet"
    return True, ""


def log(msg: str) -> None:
    print(f"[fabric-check] {msg}", flush=True)


def cmd_hold(args: argparse.Namespace) -> int:
    """Holding pod 0 before its dev servers keeps it un-Ready (no readiness file), and `pulumi up` waits for
    every replica to be Ready (pulumi/pulumi-kubernetes provider/pkg/await/statefulset.go,
    statefulsetInitAwaiter.Await: .status.readyReplicas == .spec.replicas), failing at the StatefulSet's
    pulumi.com/timeoutSeconds."""
    try:
        cfg = load_config(args.config)
    except FileNotFoundError:
        return 0  # no fabric.json next to the program: nothing configured, nothing to hold
    if not cfg.get("onDeploy"):
        return 0
    timeout = args.timeout if args.timeout is not None else float(cfg.get("onDeployTimeoutSeconds") or 1800)
    interval = args.interval
    start = time.time()
    deadline = start + timeout
    attempt = 0
    log(f"fabricCheck.onDeploy: dev servers wait for the fabric check (up to {timeout:g} s)")
    while time.time() < deadline:
        if passed_or_released(start):
            log("fabric check passed (or released)")
            return 0
        ready, why = peers_reachable()
        if not ready:
            log(f"waiting: {why}")
            time.sleep(interval)
            continue
        attempt += 1
        ok, lines = preflight_all()
        for line in lines:
            if line.startswith("FAIL"):
                log(line)
        if not ok:
            write_result(
                {
                    "time": utc_now(),
                    "status": "fail",
                    "mode": cfg.get("mode"),
                    "hosts": read_rank_env().get("ML_DEV_HOSTS", "").split(),
                    "gpusPerNode": cfg.get("gpusPerPod"),
                    "expectation": cfg.get("expectation"),
                    "plateauMinBytes": cfg.get("plateauMinBytes"),
                    "preflight": lines,
                    "diagnosis": [f"preflight failed (attempt {attempt})"],
                }
            )
            log(f"attempt {attempt}: preflight failed; retrying in {interval:g} s")
            time.sleep(interval)
            continue
        result = gate(cfg)
        write_result(result)
        for line in table(result).splitlines():
            log(line)
        if result["status"] in ("pass", "no-expectation", "skipped"):
            return 0
        log(f"attempt {attempt}: gate {result['status']}; retrying in {interval:g} s")
        time.sleep(interval)
    log(
        f"the fabric check did not pass within {timeout:g} s (fabricCheck.onDeployTimeoutSeconds). Dev servers stay held until "
        f"`{PROGRAM} gate` passes on this pod or `{PROGRAM} release`; `{PROGRAM} status` shows the last result."
    )
    while not passed_or_released(start):
        time.sleep(interval)
    log("fabric check passed (or released)")
    return 0


# --------------------------------------------------------------------------------------- rank order


def rack_order(pods: list[str], pod_nodes: dict[str, str | None], node_racks: dict[str, str]) -> list[str]:
    """Pods in rank order: pod 0 (first in `pods`) stays rank 0, its rack's pods follow, then the other
    racks in the order nodeRacks lists them; inside a rack by pod ordinal. Pods whose node is unknown
    (not scheduled yet, or not in nodeRacks) come last, by ordinal."""
    if not pods or not node_racks:
        return list(pods)
    racks_in_order: list[str] = []
    first_rack = node_racks.get(pod_nodes.get(pods[0]) or "")
    if first_rack:
        racks_in_order.append(first_rack)
    for rack in node_racks.values():
        if rack not in racks_in_order:
            racks_in_order.append(rack)
    position = {rack: i for i, rack in enumerate(racks_in_order)}

    def key(item: tuple[int, str]) -> tuple[int, int, int]:
        ordinal, pod = item
        if ordinal == 0:
            return (0, -1, 0)
        rack = node_racks.get(pod_nodes.get(pod) or "")
        return (0, position[rack], ordinal) if rack is not None else (1, 0, ordinal)

    return [pod for _, pod in sorted(enumerate(pods), key=key)]


def pod_nodes_from_api(namespace: str, selector: str) -> dict[str, str | None]:
    """spec.nodeName of this StatefulSet's pods through the Kubernetes API (needs get/list on pods in the namespace)."""
    base = env("ML_DEV_KUBE_API") or f"https://{env('KUBERNETES_SERVICE_HOST')}:{env('KUBERNETES_SERVICE_PORT', '443')}"
    sa = Path(env("ML_DEV_SA_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
    token = read_text(sa / "token") or ""
    query = urllib.parse.urlencode({"labelSelector": selector})
    req = urllib.request.Request(f"{base}/api/v1/namespaces/{namespace}/pods?{query}", headers={"Authorization": f"Bearer {token}"})
    context = None
    if base.startswith("https://"):
        import ssl

        context = ssl.create_default_context(cafile=str(sa / "ca.crt"))
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        items = json.loads(resp.read())["items"]
    return {i["metadata"]["name"]: (i.get("spec") or {}).get("nodeName") for i in items}


def cmd_rank_order(args: argparse.Namespace) -> int:
    """Prints the pods in rank order; always succeeds (falls back to ordinal order with a note on stderr)."""
    pods = args.pods.split()
    try:
        cfg = load_config(args.config)
    except (OSError, ValueError):
        cfg = {}
    racks = cfg.get("nodeRacks") or {}
    if not racks:
        print(" ".join(pods))
        return 0
    pod_nodes: dict[str, str | None] = {}
    for pair in (args.nodes or "").split():
        pod, _, node = pair.partition("=")
        pod_nodes[pod] = node or None
    if args.from_api:
        app = cfg.get("appName") or "ml-dev-env"
        selector = args.selector or f"app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance={app}"
        try:
            pod_nodes.update(pod_nodes_from_api(args.namespace or env("POD_NAMESPACE"), selector))
        except (OSError, ValueError, KeyError) as exc:
            print(f"rank-order: cannot read pod placement ({exc}); ranks = ordinals", file=sys.stderr)
            pod_nodes = {}
    unknown = [p for p in pods if not pod_nodes.get(p)]
    if unknown:
        print(f"rank-order: node of {', '.join(unknown)} not known yet; they rank last until it is", file=sys.stderr)
    print(" ".join(rack_order(pods, pod_nodes, racks)))
    return 0


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fabric_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="fabric.json (default: next to this program, or $ML_DEV_FABRIC_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight", help="check this pod (or --all pods)")
    p.add_argument("--all", action="store_true", help="run on every pod of rank.env over SSH")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the checks that passed")
    p.set_defaults(func=cmd_preflight)
    p = sub.add_parser("gate", help="NCCL all-reduce bandwidth gate across all pods")
    p.add_argument("--no-localise", action="store_true", help="skip pairwise and per-HCA localisation on failure")
    p.set_defaults(func=cmd_gate)
    p = sub.add_parser("status", help="print the latest gate result")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("hold", help="(startup, pod 0) wait for the fabric check when fabricCheck.onDeploy is set")
    p.add_argument("--timeout", type=float, help="seconds (default fabricCheck.onDeployTimeoutSeconds)")
    p.add_argument(
        "--interval",
        type=float,
        default=float(env("ML_DEV_FABRIC_INTERVAL", "30")),
        help="seconds between attempts (default $ML_DEV_FABRIC_INTERVAL or 30)",
    )
    p.set_defaults(func=cmd_hold)
    p = sub.add_parser("release", help="let a holding pod 0 start its dev servers")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("rank-order", help="pods in rack-aware rank order")
    p.add_argument("--pods", required=True, help="pod names in ordinal order, space-separated")
    p.add_argument("--nodes", help="space-separated pod=node pairs")
    p.add_argument("--from-api", action="store_true", help="read spec.nodeName of the pods from the Kubernetes API")
    p.add_argument("--namespace")
    p.add_argument("--selector", help="pod label selector (default: this stack's StatefulSet pods)")
    p.set_defaults(func=cmd_rank_order)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
