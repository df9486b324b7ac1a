"""ml-dev status: pods, reachability, ranks, GPUs, RDMA devices, SSH sessions (`--all`: usage.py).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # in the repository: the inpod package
    from .ml_dev_lib import HERE, PY, Cluster, parallel
else:  # in the pod: the modules ship next to the program (/opt/ml-dev-env), whose directory is sys.path[0]
    from ml_dev_lib import HERE, PY, Cluster, parallel


STATUS_SCRIPT = r"""
. "${ML_DEV_STATE_DIR:-/tmp/ml-dev-env}/rank.env" 2>/dev/null
gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"
rdma="$(ls /sys/class/infiniband 2>/dev/null | paste -sd, -)"
n=0
for f in "${ML_DEV_STATE_DIR:-/tmp/ml-dev-env}"/ssh-sessions/*; do
  [ -f "$f" ] || continue
  pid="${f##*/}"; start="$(head -n1 "$f")"
  if [ -r "/proc/$pid/stat" ] && [ "$(cut -d' ' -f22 "/proc/$pid/stat")" = "$start" ]; then n=$((n + 1)); else rm -f "$f"; fi
done
printf 'rank=%s/%s gpus=%s rdma=%s ssh_sessions=%s\n' "${NODE_RANK:-?}" "${NNODES:-?}" "${gpus:-none}" "${rdma:-none}" "$n"
"""


def cmd_status(args: argparse.Namespace) -> int:
    if getattr(args, "all", False):
        # Every environment of this namespace (owner, size, state, GPU-hours this week) from the live objects,
        # read with the pod's ServiceAccount (its usage Role may list them): usage.py, shipped next to ml-dev.
        namespace = os.environ.get("POD_NAMESPACE") or Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
        return subprocess.run([PY, str(HERE / "usage.py"), "status", "--namespace", namespace], check=False).returncode
    cluster = Cluster()

    def one(rank: int) -> str:
        argv = ["bash", "-c", STATUS_SCRIPT] if rank == cluster.me else cluster.ssh(rank, ["bash", "-c", STATUS_SCRIPT])
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=args.timeout + 10, check=False)
        if res.returncode != 0:
            return "UNREACHABLE " + ((res.stderr.strip().splitlines() or [""])[-1])
        return res.stdout.strip()

    results = parallel(one, list(range(len(cluster.hosts))))
    print(
        f"{len(cluster.hosts)} pods, WORLD_SIZE={cluster.rank_env.get('WORLD_SIZE', '?')}, "
        f"master {cluster.rank_env.get('MASTER_ADDR', '?')}:{cluster.rank_env.get('MASTER_PORT', '?')}"
    )
    unreachable = 0
    for rank in range(len(cluster.hosts)):
        text = results[rank]
        text = f"ERROR {text}" if isinstance(text, Exception) else text
        unreachable += str(text).startswith(("UNREACHABLE", "ERROR"))
        print(f"  {cluster.pods[rank]:<24} {text}{'  (this pod)' if rank == cluster.me else ''}")
    return 1 if unreachable else 0
