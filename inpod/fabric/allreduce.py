"""All-reduce runs across pods: all_reduce_perf (nccl-tests, MPI build) started by mpirun over the SSH fabric,
its rows, plateau and data-corruption verdict. Below the gate and the localisation (both run it): no import circle.

Part of the fabric check (fabric/check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from ..lib.http import interface_of
from .parse import parse_nccl_tests
from .util import GIB, env, run


def nccl_forward_env() -> list[str]:
    keys = sorted(k for k in os.environ if re.match(r"^(NCCL|UCX|CUDA_VISIBLE_DEVICES|LD_LIBRARY_PATH|PATH$)", k) and k != "NCCL_ALGO")
    return [a for k in keys for a in ("-x", k)]


def mpirun_cmd(hostfile: Path, nprocs: int, per_node: int, min_bytes: int, max_bytes: int) -> list[str]:
    """One MPI rank per GPU (`-g 1`), ranks filled host by host in hostfile order (= rank order).

    Open MPI 4.1 mpirun(1): `--hostfile` lines `<host> slots=N`, `-npernode N`, `-x VAR` exports VAR to the
    remote ranks, `--mca plm_rsh_agent` replaces `ssh` for starting the remote daemons; the base image's
    OpenMPI (NGC's, or Ubuntu's openmpi-bin 4.1) is 4.1.x."""
    rsh = env("ML_DEV_SSH")
    # the pod network's interface is the one that holds POD_IP (inpod/lib/http.py interface_of), whatever its name;
    # the pods of one stack share their CNI, hence the name
    pod_if = interface_of(env("POD_IP")) or "eth0"
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
        # MPI itself only bootstraps; keep its own traffic on the pod network (`pod_if`). The BTL settings bind
        # only the ob1 PML: stock Open MPI 4.1 also builds pml ucx at a higher priority (51 against ob1's 20)
        # and selects it whenever an mlx* device is present (pml_ucx_devices), and HPC-X's Open MPI prefers
        # UCX too, which would carry MPI over the RDMA VFs: so pml ob1 is named (tests/data/tool_output/
        # ompi_info-pml-4.1.4-debian.txt), and the collective components with their own transports
        # (HPC-X hcoll, ucc) are excluded (an excluded component that is not built is ignored).
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        pod_if,
        "--mca",
        "oob_tcp_if_include",
        pod_if,
        "--mca",
        "coll",
        "^hcoll,ucc",
    ]
    if rsh:
        cmd += ["--mca", "plm_rsh_agent", rsh]
    cmd += nccl_forward_env()
    # the expectation (fabric.json) is for the ring algorithm: with Tree on two nodes the bus bandwidth can
    # exceed the NICs' rate, so a half-broken fabric would pass. Set here, never left to the pod's env
    # (network.ncclEnv may set another NCCL_ALGO; nccl_forward_env leaves it out).
    cmd += ["-x", "NCCL_ALGO=Ring"]
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


def corruption(run: dict) -> str:
    """'' when every element checked right; else what was wrong where: the sizes, the count, the ranks.

    nccl-tests sums #wrong over every rank of the run before printing it (src/common.cu BenchTime:
    `Allreduce(args, &wrongElts1, /*sum*/4)`), so one run names no single rank: the ranks listed are
    those of the run (its "# Using devices" lines); the pairwise runs of the localisation narrow it down."""
    bad = [r for r in run["rows"] if r["wrong"]]
    if not bad and not run.get("out_of_bounds"):
        return ""
    sizes = [r["bytes"] for r in bad]
    where = (
        f"#wrong > 0 at {len(sizes)} of {len(run['rows'])} sizes ({human_size(min(sizes))} to {human_size(max(sizes))}), "
        f"{run['wrong']:g} wrong elements"
        if sizes
        else "no size row with #wrong"
    )
    if run.get("out_of_bounds"):
        where += f", {run['out_of_bounds']} out-of-bounds values"
    ranks = run.get("ranks") or []
    if ranks:
        hosts = sorted({r["host"] for r in ranks})
        where += f"; ranks 0-{len(ranks) - 1} on {', '.join(hosts)}"
    return where + " (all_reduce_perf checks every result element: a NIC, cable or switch altering data, or GPU memory errors)"


def human_size(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"
