# ruff: noqa: UP031  (printf-style on purpose: the stubs mirror the tools' C format strings)
"""Simulated pods for the fabric check: tool stubs printing the real output formats (data/SOURCES.md),
an `ssh` that runs a command "on" another simulated pod, and a fake /sys + /proc per pod.

Used two ways: imported by the tests (Cluster builds the scenario), and executed as the stub
(`python sim.py <tool> args...`, through small wrappers named like the tools in a bin directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.podsim.nccl import float_str, nccl_report  # noqa: F401  (the stub's all_reduce_perf prints it)

TOOLS = (
    "ibv_devinfo",
    "ibstat",
    "ip",
    "nvidia-smi",
    "mpirun",
    "all_reduce_perf",
    "ib_write_bw",
    "ssh",
    "code-server",
    "jupyter",
    "tensorboard",
)
GIB = 1 << 30

# --------------------------------------------------------------------------------------- scenario


def default_host(i: int, app: str = "ml-dev-env", ns: str = "nccl-test") -> dict:
    hcas = ["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    return {
        "pod": f"{app}-{i}",
        "node": f"gpu-node-{i}",
        "hcas": list(hcas),
        "ibstat": {h: {"state": "Active", "rate": 400} for h in hcas},
        "ifaces": {f"net{k + 1}": {"mtu": 9000, "inet": f"10.0.{103 + k}.{10 + i}/24"} for k in range(4)},
        # SR-IOV VFs: resource -> (PCI address, HCA behind it)
        "sriov": {f"openshift.io/eno{5 + k}np0rdma": [f"0000:{0x03 + 0x20 * k:02x}:00.{2 + i % 4}", hcas[k]] for k in range(4)},
        "gids": {
            h: {
                "0": ["fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"],
                "1": ["fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"],
                "2": [f"0000:0000:0000:0000:0000:ffff:0a00:{103 + k:02x}{10 + i:02x}", "IB/RoCE v1"],
                "3": [f"0000:0000:0000:0000:0000:ffff:0a00:{103 + k:02x}{10 + i:02x}", "RoCE v2"],
            }
            for k, h in enumerate(hcas)
        },
        # the interface of each HCA's VF in this pod (/sys/class/infiniband/<hca>/device/net/<netdev>)
        "netdevs": {h: f"net{k + 1}" for k, h in enumerate(hcas)},
        "iommu": "identity",
        "memlock": "unlimited",
        "gpus": 4,
        "env": {},
    }


def fqdn(pod: str, app: str = "ml-dev-env", ns: str = "nccl-test") -> str:
    return f"{pod}.{app}-headless.{ns}.svc.cluster.local"


class Cluster:
    """N simulated pods. `scenario` is what the stubs read; `build()` writes roots, scenario and bin dir."""

    def __init__(self, tmp: Path, n: int = 2) -> None:
        self.tmp = tmp
        self.hosts = {fqdn(f"ml-dev-env-{i}"): default_host(i) for i in range(n)}
        self.allreduce = {
            "busbw": 197.0,
            "slow_hosts": [],
            "slow_busbw": 61.0,
            "full_ring_busbw": None,
            "fail": False,
            "corrupt_hosts": [],
        }
        self.nic = {"gbps": 392.5, "slow": {}, "slow_gbps": 97.1}

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    def host(self, i: int) -> dict:
        return self.hosts[self.names[i]]

    def build(self) -> dict[str, str]:
        """Write everything; return the environment for running fabric_check.py as pod 0."""
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in TOOLS:
            wrapper = bin_dir / tool
            repo = Path(__file__).resolve().parents[2]  # the stub imports tests.podsim.nccl
            wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{repo}" exec "{sys.executable}" "{Path(__file__).resolve()}" {tool} "$@"\n')
            wrapper.chmod(0o755)
        for name, h in self.hosts.items():
            root = self.tmp / "roots" / h["pod"]
            shutil.rmtree(root, ignore_errors=True)
            h["root"] = str(root)
            build_root(root, h)
            state = self.tmp / "state" / h["pod"]
            state.mkdir(parents=True, exist_ok=True)
            h["state"] = str(state)
            h["workspace"] = str(self.tmp / "workspace" / h["pod"])
            (state / "rank.env").write_text(self.rank_env(name))
        scenario = {"hosts": self.hosts, "allreduce": self.allreduce, "nic": self.nic, "calls": str(self.tmp / "calls.log")}
        path = self.tmp / "scenario.json"
        path.write_text(json.dumps(scenario, indent=1))
        return self.env_for(self.names[0], bin_dir, path)

    def rank_env(self, name: str) -> str:
        h = self.hosts[name]
        hosts = " ".join(self.names)
        pods = " ".join(x["pod"] for x in self.hosts.values())
        n = len(self.hosts)
        rank = self.names.index(name)
        lines = [
            f"export ML_DEV_POD={h['pod']}",
            f"export NODE_RANK={rank}",
            f"export NNODES={n}",
            "export GPUS_PER_NODE=4",
            f"export WORLD_SIZE={4 * n}",
            f"export MASTER_ADDR={self.names[0]}",
            "export MASTER_PORT=29500",
            f"export ML_DEV_HOSTS='{hosts}'",
            f"export ML_DEV_PODS='{pods}'",
            f"export DEEPSPEED_HOSTFILE={h['workspace']}/.deepspeed/hostfile",
        ]
        return "\n".join(lines) + "\n"

    def env_for(self, name: str, bin_dir: Path, scenario: Path) -> dict[str, str]:
        h = self.hosts[name]
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(self.tmp),
            "FABRIC_SCENARIO": str(scenario),
            "FAKE_HOST": name,
            "ML_DEV_FABRIC_ROOT": h["root"],
            "ML_DEV_STATE_DIR": h["state"],
            "ML_DEV_WORKSPACE": h["workspace"],
            "POD_NAME": h["pod"],
            "NODE_NAME": h["node"],
            "ML_DEV_FABRIC_SERVER_WAIT": "0.2",
            "ML_DEV_PYTHON": sys.executable,
            "NCCL_IB_HCA": "mlx5_6,mlx5_7,mlx5_8,mlx5_9",
            "NCCL_SOCKET_IFNAME": "net1,net2,net3,net4",
        }
        for resource, (address, _hca) in h["sriov"].items():
            env[sriov_env(resource)] = address
        env.update(h["env"])
        return {k: v for k, v in env.items() if v is not None}


def sriov_env(resource: str) -> str:
    prefix, _, name = resource.partition("/")
    return f"PCIDEVICE_{prefix}_{name}".replace(".", "_").upper()


def build_root(root: Path, h: dict) -> None:
    for hca in h["hcas"]:
        port = root / "sys/class/infiniband" / hca / "ports/1"
        (port / "gids").mkdir(parents=True, exist_ok=True)
        (port / "gid_attrs/types").mkdir(parents=True, exist_ok=True)
        for index, (gid, kind) in h["gids"].get(hca, {}).items():
            (port / "gids" / index).write_text(gid + "\n")
            (port / "gid_attrs/types" / index).write_text(kind + "\n")
        device = root / "sys/class/infiniband" / hca / "device"
        device.mkdir(parents=True, exist_ok=True)
        if h.get("netdevs", {}).get(hca):
            (device / "net" / h["netdevs"][hca]).mkdir(parents=True, exist_ok=True)
        if h["iommu"] is not None:
            (device / "iommu_group").mkdir(exist_ok=True)
            (device / "iommu_group/type").write_text(h["iommu"] + "\n")
    for _resource, (address, hca) in h["sriov"].items():
        (root / "sys/bus/pci/devices" / address / "infiniband" / hca).mkdir(parents=True, exist_ok=True)
    proc = root / "proc/self"
    proc.mkdir(parents=True, exist_ok=True)
    memlock = h["memlock"]
    (proc / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max cpu time              unlimited            unlimited            seconds   \n"
        "Max open files            1048576              1048576              files     \n"
        f"Max locked memory         {memlock:<21}{memlock:<21}bytes     \n"
        "Max address space         unlimited            unlimited            bytes     \n"
    )


# ------------------------------------------------------------------------------------------ stubs


def load() -> tuple[dict, str, dict]:
    scenario = json.loads(Path(os.environ["FABRIC_SCENARIO"]).read_text())
    name = os.environ.get("FAKE_HOST") or next(iter(scenario["hosts"]))
    return scenario, name, scenario["hosts"][name]


def record(scenario: dict, name: str, tool: str, args: list[str]) -> None:
    with open(scenario["calls"], "a") as f:
        f.write(json.dumps({"host": name, "tool": tool, "args": args}) + "\n")


def option(args: list[str], *names: str, default: str | None = None) -> str | None:
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            return args[i + 1]
    return default


def size_arg(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def stub_mpirun(scenario: dict, args: list[str]) -> int:
    hostfile = option(args, "--hostfile", "-hostfile", "--machinefile")
    hosts = [line.split()[0] for line in Path(hostfile).read_text().splitlines() if line.strip()]
    unknown = [h for h in hosts if h not in scenario["hosts"]]
    ar = scenario["allreduce"]
    if unknown or ar["fail"]:
        sys.stderr.write(
            "--------------------------------------------------------------------------\n"
            "ORTE was unable to reliably start one or more daemons.\n"
        )
        return 1
    if any(h in ar.get("corrupt_hosts", []) for h in hosts):
        # a real run with #wrong > 0 (tests/data/tool_output/PROVENANCE.md); nccl-tests then exits with
        # testNumResults (src/common.cu main), which mpirun passes on
        sys.stdout.write((Path(__file__).resolve().parents[1] / "data/tool_output/all_reduce_perf-2x1-rtx3090-corrupt.txt").read_text())
        return 7
    prog = next(i for i, a in enumerate(args) if a.endswith("all_reduce_perf"))
    perf = args[prog + 1 :]
    gpus = int(option(args, "-npernode", "--npernode", default="1"))
    if any(h in ar["slow_hosts"] for h in hosts):
        busbw = ar["slow_busbw"]
    elif len(hosts) == len(scenario["hosts"]) and ar["full_ring_busbw"] is not None:
        busbw = ar["full_ring_busbw"]
    else:
        busbw = ar["busbw"]
    sys.stdout.write(
        nccl_report(hosts, gpus, size_arg(option(perf, "-b", default="32M")), size_arg(option(perf, "-e", default="32M")), busbw)
    )
    return 0


def stub_ssh(scenario: dict, args: list[str]) -> int:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("-o", "-p", "-i", "-l", "-F") else 1
    host, command = args[i], " ".join(args[i + 1 :])
    if host not in scenario["hosts"]:
        sys.stderr.write(f"ssh: Could not resolve hostname {host}: Name or service not known\r\n")
        return 255
    h = scenario["hosts"][host]
    env = dict(
        os.environ,
        FAKE_HOST=host,
        ML_DEV_FABRIC_ROOT=h["root"],
        ML_DEV_STATE_DIR=h["state"],
        ML_DEV_WORKSPACE=h["workspace"],
        POD_NAME=h["pod"],
        NODE_NAME=h["node"],
    )
    for key in [k for k in env if k.startswith("PCIDEVICE_")]:
        del env[key]
    for resource, (address, _hca) in h["sriov"].items():
        env[sriov_env(resource)] = address
    env.update({k: v for k, v in h["env"].items() if v is not None})
    for k in [k for k, v in h["env"].items() if v is None]:
        env.pop(k, None)
    return subprocess.run(["bash", "-c", command], env=env).returncode


def stub_ibv_devinfo(h: dict, args: list[str]) -> int:
    if "-l" in args or "--list" in args:
        n = len(h["hcas"])
        sys.stdout.write("%d HCA%s found:\n" % (n, "s" if n != 1 else "") + "".join("\t%s\n" % d for d in h["hcas"]) + "\n")
        return 0
    for d in h["hcas"]:
        st = h["ibstat"].get(d, {"state": "Active"})
        sys.stdout.write(
            f"hca_id:\t{d}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n"
            f"\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\t"
            f"{'PORT_ACTIVE (4)' if st['state'] == 'Active' else 'PORT_DOWN (1)'}\n"
            "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tsm_lid:\t\t\t0\n"
            "\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\tEthernet\n\n"
        )
    return 0


def stub_ibstat(h: dict, args: list[str]) -> int:
    cas = [a for a in args if not a.startswith("-")][:1] or h["hcas"]
    for ca in cas:
        if ca not in h["hcas"]:
            sys.stderr.write(f"ibpanic: [1] main: stat of IB device '{ca}' failed: No such file or directory\n")
            return 255
        st = h["ibstat"][ca]
        phys = "LinkUp" if st["state"] == "Active" else "Disabled"
        sys.stdout.write(
            f"CA '{ca}'\n\tCA type: MT4126\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
            "\tHardware version: 0\n\tNode GUID: 0x0000000000000000\n\tSystem image GUID: 0xa088c20300f1a2b4\n"
            f"\tPort 1:\n\t\tState: {st['state']}\n\t\tPhysical state: {phys}\n\t\tRate: {st['rate']}\n"
            "\t\tBase lid: 0\n\t\tLMC: 0\n\t\tSM lid: 0\n\t\tCapability mask: 0x00010000\n"
            "\t\tPort GUID: 0x0000000000000000\n\t\tLink layer: Ethernet\n"
        )
    return 0


def stub_ip(h: dict, args: list[str]) -> int:
    dev = option(args, "dev")
    names = [dev] if dev else list(h["ifaces"])
    for index, name in enumerate(names, start=3):
        iface = h["ifaces"].get(name)
        if iface is None:
            sys.stderr.write(f'Device "{name}" does not exist.\n')
            return 1
        sys.stdout.write(
            f"{index}: {name}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu {iface['mtu']} qdisc mq state UP "
            "group default qlen 1000\n"
            f"    link/ether 2e:c9:3b:1a:77:{index:02x} brd ff:ff:ff:ff:ff:ff\n"
        )
        if iface.get("inet"):
            address, prefix = iface["inet"].split("/")
            brd = ".".join([*address.split(".")[:3], "255"])
            sys.stdout.write(f"    inet {address}/{prefix} brd {brd} scope global {name}\n       valid_lft forever preferred_lft forever\n")
        sys.stdout.write(f"    inet6 fe80::2cc9:3bff:fe1a:77{index:02x}/64 scope link \n       valid_lft forever preferred_lft forever\n")
    return 0


def stub_nvidia_smi(h: dict, args: list[str]) -> int:
    if "-L" in args:
        for i in range(h["gpus"]):
            sys.stdout.write(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08x}-4d87-49d1-2eb9-39ec2baddf9b)\n")
        return 0
    for i in range(h["gpus"]):
        sys.stdout.write(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB\n")
    return 0


def stub_ib_write_bw(scenario: dict, name: str, h: dict, args: list[str]) -> int:
    with_value = {"-d", "-D", "-p", "-x", "-s", "-q", "-n", "-m", "-i", "--ib-dev", "--duration", "--port", "--gid-index"}
    positional = []
    i = 0
    while i < len(args):
        if args[i] in with_value:
            i += 2
            continue
        if not args[i].startswith("-"):
            positional.append(args[i])
        i += 1
    hca = option(args, "-d", "--ib-dev")
    if hca not in h["hcas"]:
        sys.stderr.write(f" Couldn't get context for the device {hca}\n")
        return 1
    gbps = scenario["nic"]["gbps"]
    peer = None
    if positional:  # client: find the server pod by address
        address = positional[0]
        peer = next(
            (n for n, x in scenario["hosts"].items() for f in x["ifaces"].values() if f.get("inet", "").split("/")[0] == address), None
        )
    slow = scenario["nic"]["slow"]
    if hca in slow.get(name, []) or (peer and hca in slow.get(peer, [])):
        gbps = scenario["nic"]["slow_gbps"]
    line = "-" * 87
    if not positional:
        stars = "*" * 36
        sys.stdout.write(f"\n{stars}\n* Waiting for client to connect... *\n{stars}\n")
    sys.stdout.write(
        f"{line}\n                    RDMA_Write BW Test\n Dual-port       : OFF          Device         : {hca}\n"
        " Number of qps   : 1            Transport type : IB\n Connection type : RC           Using SRQ      : OFF\n"
        " PCIe relax order: ON\n ibv_wr* API     : ON\n TX depth        : 128\n CQ Moderation   : 1\n"
        " Mtu             : 4096[B]\n Link type       : Ethernet\n GID index       : 3\n Max inline data : 0[B]\n"
        " rdma_cm QPs     : OFF\n Data ex. method : Ethernet\n"
        f"{line}\n local address: LID 0000 QPN 0x03ad PSN 0x17d925 RKey 0x029300 VAddr 0x0073f17a0af000\n"
        f" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:103:10\n{line}\n"
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    )
    rate = gbps * 1e9 / 8 / 65536 / 1e6
    sys.stdout.write(" %-7lu    %-10d       %-7.2lf            %-7.2lf\t\t     %-7.6lf\n" % (65536, 3790000, gbps + 0.4, gbps, rate))
    sys.stdout.write(f"{line}\n")
    return 0


def main() -> int:
    tool, args = sys.argv[1], sys.argv[2:]
    scenario, name, h = load()
    record(scenario, name, tool, args)
    if tool == "mpirun":
        return stub_mpirun(scenario, args)
    if tool == "ssh":
        return stub_ssh(scenario, args)
    if tool == "ibv_devinfo":
        return stub_ibv_devinfo(h, args)
    if tool == "ibstat":
        return stub_ibstat(h, args)
    if tool == "ip":
        return stub_ip(h, args)
    if tool == "nvidia-smi":
        return stub_nvidia_smi(h, args)
    if tool == "ib_write_bw":
        return stub_ib_write_bw(scenario, name, h, args)
    if tool in ("code-server", "jupyter", "tensorboard"):  # dev servers: stay up like a server
        os.execvp("sleep", ["sleep", "60"])
    if tool == "all_reduce_perf":
        sys.stderr.write("all_reduce_perf must be started through mpirun in these tests\n")
        return 2
    return 127


if __name__ == "__main__":
    sys.exit(main())
