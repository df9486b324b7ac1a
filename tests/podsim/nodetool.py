# ruff: noqa: UP031  (printf-style on purpose: the stubs mirror the tools' C format strings)
"""The node tools' stubs, run INSIDE a simulated pod (copied to /run/podsim-node/ with nccl.py; the tools on PATH
are two-line wrappers `exec python3 /run/podsim-node/nodetool.py <tool> "$@"`). Standard library only.

They print the real formats (tests/data/tool_output/PROVENANCE.md, tests/inpod/fabric/data/SOURCES.md) from the node's
state in /run/podsim-node/node.json (written by tests/podsim/nodetools.py) and log each call to calls.log there.
Between pods they use real transports: ib_write_bw server and client meet over TCP on the address given (the
pods' netK interfaces, as perftest's own out-of-band exchange does: perftest_communication.c), and the ranks of
all_reduce_perf, started by the real mpirun over the real SSH fabric, meet in /run/podsim-node/fabric (a directory
every pod of the simulation shares: the switch fabric NCCL would measure).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def node() -> dict:
    return json.loads((HERE / "node.json").read_text())


def record(tool: str, args: list[str], **extra: object) -> None:
    with open(HERE / "calls.log", "a") as f:
        f.write(json.dumps({"pod": socket.gethostname(), "tool": tool, "args": args, **extra}) + "\n")


def option(args: list[str], *names: str, default: str | None = None) -> str | None:
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            return args[i + 1]
    return default


def size_arg(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def nvidia_smi(n: dict, args: list[str]) -> int:
    """`-L`, `--query-gpu=... --format=csv[,noheader][,nounits]` and `--query-compute-apps=...`, from the node's
    state (tests/podsim/nodetools.py `Node.gpu`): per GPU its utilisation, memory controller utilisation and memory
    used, the compute processes, the model, and the tool itself working, failing (the driver gone) or hanging (stuck
    in NVML). The layout is the real tool's (tests/data/tool_output/nvidia-smi-h200: driver 580.159.04): `, `
    between cells, `value unit` with one space, a newline after every line; no process: the header alone."""
    gpus = n["gpus"]
    smi = n.get("nvidia_smi", "ok")
    if smi == "fail":  # what nvidia-smi prints when the driver is gone (exit 9: NVML_ERROR_DRIVER_NOT_LOADED)
        sys.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                         "Make sure that the latest NVIDIA driver is installed and running.\n\n")  # fmt: skip
        return 9
    if smi == "hang" and any(a.startswith(("--query-gpu=", "--query-compute-apps=")) for a in args):
        time.sleep(3600)  # stuck in the driver: the caller's deadline ends it
        return 0
    replay = n.get("replay")
    if replay and any(a.startswith(("--query-gpu=", "--query-compute-apps=")) for a in args):
        # a real tool's output, verbatim (tests/data/tool_output), with its exit status; a relative path names a file
        # beside this one (in a pod's node directory: nodetools.py `Node.gpu` copies it there)
        path = replay["gpu"] if any(a.startswith("--query-gpu=") for a in args) else replay.get("apps")
        sys.stdout.write((HERE / path).read_text() if path else "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n")
        return int(replay.get("rc", 0))
    name, total = n.get("gpu_name", "NVIDIA H100 80GB HBM3"), int(n.get("gpu_memory_total", 81559))
    uuids = n.get("gpu_uuids") or ["GPU-%08x-4d87-49d1-2eb9-39ec2baddf9b" % i for i in range(gpus)]
    uuid = lambda i: uuids[i]  # noqa: E731
    if "-L" in args:
        for i in range(gpus):
            sys.stdout.write("GPU %d: %s (UUID: %s)\n" % (i, name, uuid(i)))
        return 0
    fmt = " ".join(a for a in args if a.startswith("--format="))
    units, header = "nounits" not in fmt, "noheader" not in fmt
    apps = next((a.split("=", 1)[1] for a in args if a.startswith("--query-compute-apps=")), None)
    if apps is not None:  # the node's compute processes (none: the header alone, as the real tool prints it)
        if header:
            sys.stdout.write(", ".join(HEADER.get(k, k) for k in apps.split(",")) + "\n")
        for gpu, pid, name, mib in n.get("gpu_apps") or []:
            row = {"gpu_uuid": uuid(int(gpu)), "pid": str(pid), "process_name": name, "used_memory": "%d MiB" % mib if units else str(mib)}
            sys.stdout.write(", ".join(row.get(k, "[N/A]") for k in apps.split(",")) + "\n")
        return 0
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), "index,name,memory.total")
    if header:  # `--format=csv`: the names with their units (tests/data/tool_output/nvidia-smi-query-gpu-*.csv)
        sys.stdout.write(", ".join(HEADER.get(k, k) for k in query.split(",")) + "\n")
    for i in range(gpus):
        util, mem, used = ((n.get(key) or {}).get(str(i), 0) for key in ("gpu_util", "gpu_mem_util", "gpu_mem_used"))
        values = {
            "name": name,
            "memory.total": "%d MiB" % total if units else str(total),
            "memory.used": "%d MiB" % used if units else str(used),
            "utilization.gpu": "%d %%" % util if units else str(util),
            "utilization.memory": "%d %%" % mem if units else str(mem),
        }
        row = {"index": str(i), "uuid": uuid(i), **values}
        sys.stdout.write(", ".join(row.get(k, "[N/A]") for k in query.split(",")) + "\n")
    return 0


HEADER = {  # `--format=csv`'s names with units; the real tool names `used_memory` `used_gpu_memory` (nvidia-smi-h200/apps-*.csv)
    "utilization.gpu": "utilization.gpu [%]",
    "utilization.memory": "utilization.memory [%]",
    "memory.used": "memory.used [MiB]",
    "memory.total": "memory.total [MiB]",
    "used_memory": "used_gpu_memory [MiB]",
}


def ibv_devinfo(n: dict, args: list[str]) -> int:
    """rdma-core libibverbs/examples/devinfo.c: `-l` prints "%d HCA%s found:" then "\\t%s" per device."""
    hcas = n["hcas"]
    if not hcas:
        sys.stderr.write("No IB devices found\n")
        return 255
    if "-l" in args or "--list" in args:
        sys.stdout.write("%d HCA%s found:\n" % (len(hcas), "s" if len(hcas) != 1 else "") + "".join("\t%s\n" % d for d in hcas) + "\n")
        return 0
    for d in hcas:
        st = n["ports"].get(d, {"state": "Active"})
        sys.stdout.write(
            f"hca_id:\t{d}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n"
            f"\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\t"
            f"{'PORT_ACTIVE (4)' if st['state'] == 'Active' else 'PORT_DOWN (1)'}\n"
            "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tsm_lid:\t\t\t0\n"
            "\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\tEthernet\n\n"
        )
    return 0


def ibstat(n: dict, args: list[str]) -> int:
    """infiniband-diags src/ibstat.c: ca_dump/port_dump; an unknown CA: ibpanic "stat of IB device '%s' failed"."""
    cas = [a for a in args if not a.startswith("-")][:1] or n["hcas"]
    for ca in cas:
        if ca not in n["hcas"]:
            sys.stderr.write(f"ibpanic: [1] main: stat of IB device '{ca}' failed: No such file or directory\n")
            return 255
        st = n["ports"][ca]
        phys = "LinkUp" if st["state"] == "Active" else "Disabled"
        sys.stdout.write(
            f"CA '{ca}'\n\tCA type: MT4126\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
            "\tHardware version: 0\n\tNode GUID: 0x0000000000000000\n\tSystem image GUID: 0xa088c20300f1a2b4\n"
            f"\tPort 1:\n\t\tState: {st['state']}\n\t\tPhysical state: {phys}\n\t\tRate: {st['rate']}\n"
            "\t\tBase lid: 0\n\t\tLMC: 0\n\t\tSM lid: 0\n\t\tCapability mask: 0x00010000\n"
            "\t\tPort GUID: 0x0000000000000000\n\t\tLink layer: Ethernet\n"
        )
    return 0


def ib_write_bw(n: dict, args: list[str]) -> int:
    """perftest: the server waits for one client on TCP port -p (default 18515); both print the report
    (perftest_parameters.c print_report_bw: BW in Gb/sec with --report_gbits). The rate is the lower of the two
    ends' HCA rates (node.json nic_gbps)."""
    with_value = {"-d", "-D", "-p", "-x", "-s", "-q", "-n", "-m", "-i", "--ib-dev", "--duration", "--port", "--gid-index"}
    positional, i = [], 0
    while i < len(args):
        if args[i] in with_value:
            i += 2
            continue
        if not args[i].startswith("-"):
            positional.append(args[i])
        i += 1
    hca = option(args, "-d", "--ib-dev") or ""
    record("ib_write_bw", args)
    if hca not in n["hcas"]:
        sys.stderr.write(f" Couldn't get context for the device {hca}\n")
        return 1
    port = int(option(args, "-p", "--port", default="18515") or 18515)
    mine = {"pod": socket.gethostname(), "gbps": n["nic_gbps"].get(hca, 0.0)}
    line = "-" * 87
    if positional:  # client: one try, as perftest's ethernet_client_connect (src/perftest_communication.c)
        try:
            sock = socket.create_connection((positional[0], port), timeout=5)
        except OSError:
            sys.stderr.write(f"Couldn't connect to {positional[0]}:{port}\n")
            return 1
    else:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(1)
        server.settimeout(60)
        stars = "*" * 36
        sys.stdout.write(f"\n{stars}\n* Waiting for client to connect... *\n{stars}\n")
        sys.stdout.flush()
        sock, _ = server.accept()
        server.close()
    with sock:
        sock.settimeout(30)
        sock.sendall((json.dumps(mine) + "\n").encode())
        peer = json.loads(sock.makefile().readline())
    gbps = min(mine["gbps"], peer["gbps"])
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


def all_reduce_perf(n: dict, args: list[str]) -> int:
    """One rank of nccl-tests (MPI build) under mpirun: every rank reports its pod and its node's bus bandwidth to
    the shared fabric directory; rank 0 waits for all, prints the report (src/common.cu) at the lowest bandwidth of
    the pods in the job (or the fabric's full-ring figure when every pod takes part), or a real corrupt run's log
    and exit 7 (testNumResults) when a pod corrupts."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "0"))
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid") or ""
    if rank < 0 or not job:
        sys.stderr.write("all_reduce_perf (stub): start it through mpirun\n")
        return 2
    keep = {k: os.environ[k] for k in os.environ if k.startswith("NCCL_")}
    record("all_reduce_perf", args, rank=rank, size=size, local_size=local, env=keep)
    fabric = HERE / "fabric"
    d = fabric / job.replace("/", "_")
    d.mkdir(parents=True, exist_ok=True)
    me = {"rank": rank, "pod": socket.gethostname(), "busbw": n["busbw"], "corrupt": n["corrupt"]}
    (d / f"{rank}.tmp").write_text(json.dumps(me))
    os.replace(d / f"{rank}.tmp", d / f"{rank}.json")
    if rank != 0:
        return 0
    deadline = time.monotonic() + 60
    while len(list(d.glob("*.json"))) < size:
        if time.monotonic() > deadline:
            sys.stderr.write(f"all_reduce_perf (stub): only {len(list(d.glob('*.json')))} of {size} ranks arrived\n")
            return 3
        time.sleep(0.05)
    ranks = sorted((json.loads(p.read_text()) for p in d.glob("*.json")), key=lambda r: r["rank"])
    pods = list(dict.fromkeys(r["pod"] for r in ranks))
    if any(r["corrupt"] for r in ranks):
        sys.stdout.write((HERE / "all_reduce_perf-corrupt.txt").read_text())
        return 7
    shared = json.loads((fabric / "fabric.json").read_text())
    busbw = min(r["busbw"] for r in ranks)
    if shared.get("full_ring_busbw") is not None and len(pods) == shared["pods"]:
        busbw = min(busbw, shared["full_ring_busbw"])
    spec = importlib.util.spec_from_file_location("nccl", HERE / "nccl.py")  # copied next to this file (tests/podsim/nccl.py)
    assert spec is not None and spec.loader is not None
    nccl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nccl)
    nccl_report = nccl.nccl_report
    sys.stdout.write(
        nccl_report(
            pods,
            size // max(len(pods), 1),
            size_arg(option(args, "-b", default="32M") or "32M"),
            size_arg(option(args, "-e", default="32M") or "32M"),
            busbw,
        )
    )
    return 0


def main() -> int:
    tool, args = sys.argv[1], sys.argv[2:]
    n = node()
    if tool not in ("ib_write_bw", "all_reduce_perf"):
        record(tool, args)
    return {
        "nvidia-smi": nvidia_smi,
        "ibv_devinfo": ibv_devinfo,
        "ibstat": ibstat,
        "ib_write_bw": ib_write_bw,
        "all_reduce_perf": all_reduce_perf,
    }[tool](n, args)


if __name__ == "__main__":
    sys.exit(main())
