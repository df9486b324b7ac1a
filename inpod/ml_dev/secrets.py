"""env.secrets for ml-dev: which listed keys each pod has (names only), and the check that stops a launch before a rank
starts when one is missing. The values are read by each rank from its own pod's mount (`_rank`, inpod/lib/usersecrets.py).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import subprocess

from ..lib import usersecrets
from .common import Cluster, die, listed_secrets, parallel


def pod_presence(cluster: Cluster, timeout: float = 30) -> dict[str, usersecrets.Presence | None]:
    """{pod: {secret: {KEY: present}}} of every pod, in rank order ({} per pod when none is listed; None: no answer).
    Over the same SSH connections as the launch (`test -r` per listed path: no value leaves a pod)."""
    listed = listed_secrets()
    if not listed:
        return {pod: {} for pod in cluster.pods}
    script = usersecrets.presence_script(listed)

    def one(rank: int) -> usersecrets.Presence | None:
        argv = ["bash", "-c", script] if rank == cluster.me else cluster.ssh(rank, ["bash", "-c", script])
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        return usersecrets.from_script_output(listed, res.stdout) if res.returncode == 0 else None

    results = parallel(one, list(range(len(cluster.hosts))))
    return {cluster.pods[r]: (None if isinstance(results[r], Exception) else results[r]) for r in range(len(cluster.hosts))}  # type: ignore[misc]


def require(cluster: Cluster) -> None:
    """Stop the launch, naming secret, key and pod, when a listed key is missing on any pod."""
    if not listed_secrets():
        return
    lines = usersecrets.missing_lines(pod_presence(cluster))
    if lines:
        die("no rank started:\n  " + "\n  ".join(lines))
