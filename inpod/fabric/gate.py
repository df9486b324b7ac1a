"""The bandwidth gate: all_reduce_perf across every pod (allreduce.py), judged against fabric.json's
expectation; on failure the localisation (localise.py) names the pod and HCA.

Part of the fabric check (fabric/check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .. import contract
from .allreduce import all_reduce, corruption, plateau
from .localise import localise_pods
from .util import GIB, NO_RANK_ENV, ensure, read_rank_env, state_dir, utc_now


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
            "diagnosis": [NO_RANK_ENV.format(path=state_dir() / contract.RANK_ENV_FILE)],
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
    max_bytes = int(cfg.get("maxBytes") or 8 * GIB)
    full = all_reduce(hosts, gpus, int(cfg.get("minBytes") or 1 << 20), max_bytes, workdir, "all")
    busbw = plateau(full["rows"], min_plateau)
    result.update(command=full["cmd"], sizes=full["rows"], plateauBusbw=busbw, avgBusbw=full["avg_busbw"], wrong=full["wrong"])
    result["status"] = judge(busbw, exp)
    corrupt = corruption(full)
    if corrupt:
        # before the exit status: nccl-tests exits non-zero exactly when #wrong > 0 (src/common.cu main:
        # `if (errors[0] || ...) return testNumResults;`), and that is data corruption, not a failed run
        result["status"] = "fail"
        result["corrupt"] = True
        result["diagnosis"].append(f"DATA CORRUPTION across {len(hosts)} pods: {corrupt}")
    elif full["rc"] != 0 or not full["rows"]:
        result["status"] = "error"
        result["diagnosis"].append(f"all_reduce_perf across {len(hosts)} pods failed (exit {full['rc']}): {full['stderr'][-400:]}")
    if result["status"] in ("pass", "no-expectation", "skipped") or not localise:
        return result
    localise_pods(cfg, result, hosts, pods, gpus, max_bytes, workdir)
    return result
