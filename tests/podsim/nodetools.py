"""The node behind simulated pods: node tools as stubs printing the real formats, and the sysfs an RDMA VF gives a pod.

    node = Node()                                   # PodSim(result, count=n, node=node): set up before PID 1 runs
    node.state(sim, i)["ports"]["mlx5_7"] = {...}    # change what pod i's node shows, then node.apply(sim, i)
    node.fabric["full_ring_busbw"] = 120.0; node.apply_fabric(sim)
    node.calls(sim, "ib_write_bw")                  # every call the stubs saw, on every pod (pod, args, ...)
    node.reset(sim)                                 # every pod's node back to its healthy default
    node.gpu(sim, i, util=97, mem=40)               # pod i's GPUs busy; smi="fail" / "hang": the tool broken
    node.gpu(sim, i, replay={"gpu": csv, "apps": csv2, "rc": 0})  # pod i's nvidia-smi prints a real capture
    HostNode(tmp).nvidia_smi                        # the same nvidia-smi for a program run outside a pod

What a pod gets (the podsim docstring lists these as platform rules):
* tools on PATH (/usr/bin): nvidia-smi (NVIDIA container toolkit; GPUs = the nvidia.com/gpu limit), ibv_devinfo
  (rdma-core), ibstat (infiniband-diags), ib_write_bw (perftest), all_reduce_perf (nccl-tests, MPI build): the
  stubs of tests/podsim/nodetool.py. `ip`, `ssh`, `mpirun` and `orted` are real (this machine's, the image layer).
* sysfs of the allocated VFs, mounted over the pod's read-only /sys (an overlay keeps the rest of sysfs): per
  SR-IOV resource k, the VF's PCI function (its address = the device plugin's PCIDEVICE_* value) with
  `infiniband/<hca>`, `net/<netK>` (Multus gives the VF's netdev its pod-side name) and `iommu_group/type`; and
  `/sys/class/infiniband/<hca>` with `device -> /sys/bus/pci/devices/<bdf>` and `ports/1/gids/<i>`,
  `ports/1/gid_attrs/types/<i>` (the kernel fills RoCE v2 IPv4 GIDs from the interface's address). Sources:
  Linux Documentation/ABI/stable/sysfs-class-infiniband, drivers/infiniband/core/sysfs.c (gids, gid_attrs),
  drivers/infiniband/core/cache.c gid_type_str, drivers/iommu/iommu.c iommu_group_show_type; with RDMA namespace
  exclusive mode (what the SR-IOV CNI needs) a pod sees only its own devices.
* the net1..netN interfaces' MTU = the NetworkAttachmentDefinition's `mtu` (rendered when the stack creates them),
  else the fabric config's expectation (the attachments are the cluster's).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOLS = ("nvidia-smi", "ibv_devinfo", "ibstat", "ib_write_bw", "all_reduce_perf")
CORRUPT = HERE.parent / "data" / "tool_output" / "all_reduce_perf-2x1-rtx3090-corrupt.txt"


def set_gpus(
    st: dict[str, Any],
    util: int | None = None,
    mem: int | None = None,
    used: int | None = None,
    apps: list[tuple[int, int, str, int]] | None = None,
    smi: str | None = None,
    gpus: tuple[int, ...] | None = None,
    replay: dict[str, Any] | None = None,
    model: tuple[str, int] | None = None,
    uuids: list[str] | None = None,
) -> None:
    """Change a node state's GPUs (nodetool.py `nvidia_smi` prints them): of GPUs `gpus` (default: all) the
    utilisation `util` %, the memory controller's `mem` %, `used` MiB of memory; the compute processes `apps`
    (gpu index, pid, name, MiB); the tool `smi`: "ok", "fail" (the driver gone: exit 9) or "hang" (stuck in NVML);
    `replay`: a real tool's output instead, verbatim ({"gpu": file, "apps": file or None, "rc": exit status}; {}: off;
    a relative file is read beside nodetool.py); `model`: every GPU's (name, memory.total MiB), default an H100 80GB;
    `uuids`: the GPUs' UUIDs in index order."""
    if model is not None:
        st["gpu_name"], st["gpu_memory_total"] = model[0], int(model[1])
    if uuids is not None:
        st["gpu_uuids"] = list(uuids)
    for key, value in (("gpu_util", util), ("gpu_mem_util", mem), ("gpu_mem_used", used)):
        if value is not None:
            st.setdefault(key, {}).update({str(i): int(value) for i in (gpus if gpus is not None else range(st["gpus"]))})
    if apps is not None:
        st["gpu_apps"] = [list(a) for a in apps]
    if smi is not None:
        assert smi in ("ok", "fail", "hang"), smi
        st["nvidia_smi"] = smi
    if replay is not None:
        st["replay"] = {k: str(v) if k != "rc" and v is not None else v for k, v in replay.items()}


def wrapper_script(tool: str) -> str:
    """The tool on a pod's PATH: the stub at /run/podsim-node (its node.json beside it)."""
    return f'#!/bin/sh\nexec /usr/bin/python3 /run/podsim-node/nodetool.py {tool} "$@"\n'


def default_node(directory: Path, pod: str, gpus: int, hcas: list[str] | None = None) -> None:
    """A node directory for a pod without a `Node`: nodetool.py and a healthy node.json (`gpus` idle GPUs, `hcas`
    with Active ports), for PodSim to copy to /run/podsim-node (nvidia-smi and ibv_devinfo are installed from it; no
    mount is added)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "nodetool.py", directory / "nodetool.py")
    (directory / "node.json").write_text(json.dumps({"pod": pod, "gpus": gpus, "hcas": list(hcas or []), "ports": {}}))
    (directory / "calls.log").write_text("")
    (directory / "calls.log").chmod(0o666)  # the stub logs its calls as the pod's user


def ipv4_gid(address: str) -> str:
    """The IPv4-mapped GID of an address (::ffff:a.b.c.d), as sysfs prints it: eight groups of four hex digits."""
    a, b, c, d = (int(x) for x in address.split("/")[0].split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


class Node:
    def __init__(
        self,
        link_gbps: float = 400,
        nic_gbps: float = 392.5,
        busbw: float = 197.0,
        mtu: int | None = None,
        overrides: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        """`overrides`: per pod index, node state that differs from the healthy default from the start (e.g. {1: {"gpus": 2}})."""
        self.link_gbps, self.nic_gbps, self.busbw, self.mtu = link_gbps, nic_gbps, busbw, mtu
        self.overrides = overrides or {}
        self.fabric: dict[str, Any] = {"full_ring_busbw": None}
        self.states: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------------------- the render's facts

    def _hcas(self, sim: Any) -> list[str]:
        env = {e["name"]: e.get("value", "") for e in sim.main.get("env") or []}
        return [h.split(":")[0] for h in env.get("NCCL_IB_HCA", "").split(",") if h]

    def _mtu(self, sim: Any) -> int:
        if self.mtu:
            return self.mtu
        for r in sim.resources:
            if r.kind == "NetworkAttachmentDefinition":
                config = json.loads(r.inputs.get("spec", {}).get("config") or "{}")
                if config.get("mtu"):
                    return int(config["mtu"])
        fabric = json.loads(next(iter(v for c in sim.configmaps.values() for k, v in c.items() if k == "fabric.json"), "{}"))
        return int(fabric.get("mtu") or 1500)

    def default(self, sim: Any, index: int) -> dict[str, Any]:
        pod = sim.pods[index]
        hcas = self._hcas(sim)
        vfs = sorted(k for k in sim.device_plugin_env(pod) if k.startswith("PCIDEVICE_"))
        bdfs = [sim.device_plugin_env(pod)[k] for k in vfs]
        netdevs = sorted(n for n in pod.interfaces if n.startswith("net"))
        return {
            "pod": pod.name,
            "gpus": sim.gpus,
            "hcas": list(hcas),
            "ports": {h: {"state": "Active", "rate": self.link_gbps} for h in hcas},
            "nic_gbps": dict.fromkeys(hcas, self.nic_gbps),
            "busbw": self.busbw,
            "corrupt": False,
            "vfs": {bdf: hcas[k] for k, bdf in enumerate(bdfs) if k < len(hcas)},
            "netdevs": {h: netdevs[k] for k, h in enumerate(hcas) if k < len(netdevs)},
            "gids": {
                h: {
                    "0": ["fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"],
                    "1": ["fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"],
                    **(
                        {"2": [ipv4_gid(pod.interfaces[netdevs[k]]), "IB/RoCE v1"], "3": [ipv4_gid(pod.interfaces[netdevs[k]]), "RoCE v2"]}
                        if k < len(netdevs)
                        else {}
                    ),
                }
                for k, h in enumerate(hcas)
            },
            "iommu": "identity",
        }

    def gpu_util(self, sim: Any, index: int, util: int, gpu: int = 0) -> None:
        """GPU `gpu` of pod `index` at `util` % (nvidia-smi's utilization.gpu), live."""
        self.gpu(sim, index, util=util, gpus=(gpu,))

    def gpu(self, sim: Any, index: int, **what: Any) -> None:
        """Pod `index`'s GPUs as its nvidia-smi shows them, live (`set_gpus` names what can be set). A `replay`'s
        files are copied into the pod's node directory (the pod sees none of this machine's paths)."""
        if what.get("replay"):
            what["replay"] = {**what["replay"], **self._replay_files(sim, index, what["replay"])}
        set_gpus(self.state(sim, index), **what)
        self.apply(sim, index)

    def _replay_files(self, sim: Any, index: int, replay: dict[str, Any]) -> dict[str, str]:
        """The replay's files copied beside pod `index`'s nodetool.py, by their names there (nodetool.py reads a
        relative name there)."""
        out = {}
        for key in ("gpu", "apps"):
            if replay.get(key):
                name = f"replay-{key}-{Path(replay[key]).name}"
                tmp = self.dir(sim, index) / f".{name}.tmp"
                shutil.copyfile(replay[key], tmp)
                tmp.chmod(0o644)
                tmp.replace(self.dir(sim, index) / name)
                out[key] = name
        return out

    def state(self, sim: Any, index: int) -> dict[str, Any]:
        if index not in self.states:
            self.states[index] = {**self.default(sim, index), **self.overrides.get(index, {})}
        return self.states[index]

    # ------------------------------------------------------------------------------- on this machine

    def dir(self, sim: Any, index: int) -> Path:
        return sim.base / "node" / f"pod{index}"

    def apply(self, sim: Any, index: int) -> None:
        """Write pod `index`'s node state where its tools and sysfs read it (live: the pod sees it at once)."""
        st = self.state(sim, index)
        d = self.dir(sim, index)
        tmp = d / "node.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        tmp.chmod(0o644)
        tmp.replace(d / "node.json")
        ib = d / "sys-ib"
        for child in ib.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        for bdf in st["vfs"]:
            pci = d / "pci" / bdf
            for child in pci.iterdir():
                shutil.rmtree(child)
        for bdf, hca in st["vfs"].items():
            (d / "pci" / bdf / "infiniband" / hca).mkdir(parents=True)
        bdf_of = {hca: bdf for bdf, hca in st["vfs"].items()}
        for hca in st["hcas"]:
            bdf = bdf_of.get(hca)
            port = ib / hca / "ports" / "1"
            (port / "gids").mkdir(parents=True)
            (port / "gid_attrs" / "types").mkdir(parents=True)
            for i, (gid, kind) in st["gids"].get(hca, {}).items():
                (port / "gids" / i).write_text(gid + "\n")
                (port / "gid_attrs" / "types" / i).write_text(kind + "\n")
            if bdf is None:  # an HCA without an allocated VF of ours: its own PCI function, not under /sys/bus here
                device = ib / hca / "device"
                device.mkdir()
            else:
                (ib / hca / "device").symlink_to(f"/sys/bus/pci/devices/{bdf}")
                device = d / "pci" / bdf
            netdev = st["netdevs"].get(hca)
            if netdev:
                (device / "net" / netdev).mkdir(parents=True)
            if st["iommu"] is not None:
                (device / "iommu_group").mkdir()
                (device / "iommu_group" / "type").write_text(st["iommu"] + "\n")

    def apply_fabric(self, sim: Any) -> None:
        shared = sim.base / "node" / "fabric"
        (shared / "fabric.json").write_text(json.dumps({**self.fabric, "pods": sim.count}))

    def reset(self, sim: Any) -> None:
        """Every pod's node back to its default, the fabric healthy, the call logs emptied."""
        self.fabric = {"full_ring_busbw": None}
        self.apply_fabric(sim)
        for pod in sim.pods:
            self.states[pod.index] = self.default(sim, pod.index)
            self.apply(sim, pod.index)
            (self.dir(sim, pod.index) / "calls.log").write_text("")

    def calls(self, sim: Any, tool: str) -> list[dict[str, Any]]:
        out = []
        for pod in sim.pods:
            path = self.dir(sim, pod.index) / "calls.log"
            if path.exists():
                out += [c for c in map(json.loads, path.read_text().splitlines()) if c["tool"] == tool]
        return out

    # ------------------------------------------------------------------------------- pod start

    def setup(self, sim: Any, pod: Any, root: str) -> list[str]:
        """Shell lines run as root in the pod's new mount and network namespaces before pivot_root (PodSim)."""
        d = self.dir(sim, pod.index)
        # a container restart (PodSim.restart) sets the node up again: the files are made from the node's state
        # (self.states, kept), and the old container's mounts went with its mount namespace
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        d.chmod(0o777)  # the stubs log their calls as the pod's user
        shared = sim.base / "node" / "fabric"
        if not shared.exists():
            shared.mkdir()
            shared.chmod(0o1777)
            self.apply_fabric(sim)
        (d / "fabric").mkdir()
        (d / "sys-ib").mkdir()
        (d / "lower-class" / "infiniband").mkdir(parents=True)
        st = self.state(sim, pod.index)
        for bdf in st["vfs"]:
            (d / "pci" / bdf).mkdir(parents=True)
            (d / "lower-pci" / bdf).mkdir(parents=True)
        (d / "calls.log").write_text("")
        (d / "calls.log").chmod(0o666)
        shutil.copy(HERE / "nodetool.py", d / "nodetool.py")
        shutil.copy(HERE / "nccl.py", d / "nccl.py")
        shutil.copy(CORRUPT, d / "all_reduce_perf-corrupt.txt")
        self.apply(sim, pod.index)
        q = shlex.quote
        lines = [
            f"mkdir -p {root}/run/podsim-node && mount --bind {q(str(d))} {root}/run/podsim-node",
            f"mount --bind {q(str(shared))} {root}/run/podsim-node/fabric",
        ]
        for tool in TOOLS:
            wrapper = d / f"{tool}.sh"
            wrapper.write_text(wrapper_script(tool))
            lines.append(f"install -m 0755 {q(str(wrapper))} {root}/usr/bin/{tool}")
        # sysfs of the VFs over the read-only sysfs (an overlay keeps the rest of /sys/class and the host's PCI devices)
        lines += [
            f"mount -t overlay overlay -o lowerdir={d}/lower-class:{root}/sys/class {root}/sys/class",
            f"mount --bind {d}/sys-ib {root}/sys/class/infiniband && mount -o remount,bind,ro {root}/sys/class/infiniband",
        ]
        if st["vfs"]:
            lines.append(f"mount -t overlay overlay -o lowerdir={d}/lower-pci:{root}/sys/bus/pci/devices {root}/sys/bus/pci/devices")
            for bdf in st["vfs"]:
                target = f"{root}/sys/bus/pci/devices/{bdf}"
                lines.append(f"mount --bind {d}/pci/{bdf} {target} && mount -o remount,bind,ro {target}")
        mtu = self._mtu(sim)
        for name in sorted(pod.interfaces):
            if name.startswith("net"):
                peer = f"{name}p{pod.index}"[:15]  # PodSim.add_interfaces' name for the bridge side
                lines += [f"ip -n {sim.cluster_ns} link set {peer} mtu {mtu}", f"ip link set {name} mtu {mtu}"]
        return lines


class HostNode:
    """The same nvidia-smi stub for a program run on this machine, outside any pod (the idle agent's functions
    called in-process): nodetool.py and its node.json in `directory`, `nvidia_smi` the tool's path (what the agent's
    ML_DEV_NVIDIA_SMI names), `gpu(...)` as `Node.gpu` (`set_gpus`)."""

    def __init__(self, directory: Path, gpus: int = 4) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "nodetool.py", directory / "nodetool.py")
        self.st: dict[str, Any] = {"pod": "host", "gpus": gpus, "hcas": []}
        self.nvidia_smi = directory / "nvidia-smi"
        self.nvidia_smi.write_text(f'#!/bin/sh\nexec /usr/bin/python3 {shlex.quote(str(directory / "nodetool.py"))} nvidia-smi "$@"\n')
        self.nvidia_smi.chmod(0o755)
        self.gpu()

    def gpu(self, **what: Any) -> None:
        set_gpus(self.st, **what)
        tmp = self.dir / "node.json.tmp"
        tmp.write_text(json.dumps(self.st))
        tmp.replace(self.dir / "node.json")
