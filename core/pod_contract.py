"""What the pods read: the one contract between the render and the in-pod programs.

Defined here once. The components render from it (components/pod.py: the container env and `cluster.env`;
components/devloop.py: `devloop.env`) and the programs read only these names (tests/test_contract.py
asserts both sides: every name a program reads is rendered or written by another program, and every
rendered name is listed here). Not in inpod/ (everything there ships): the programs cannot import it, so
what a program must know itself (ml-dev's PER_POD_ENV) is asserted equal to this module by the tests.
"""

from __future__ import annotations

STARTUP_DIR_ENV = "ML_DEV_DIR"
"""Container env: the startup ConfigMap's mount path (core.naming.STARTUP_MOUNT). Programs that hand their
own path to another pod use it, never a resolved path: the kubelet's `..<timestamp>` directory behind the
mount's symlinks differs on every pod."""

CONTAINER_ENV = (
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "NODE_NAME",
    "ML_DEV_WORKSPACE",
    "ML_DEV_STATE_DIR",
    "ML_DEV_CLUSTER_DIR",
    "ML_DEV_HOME",
    "HOME",
    "ENV",
    STARTUP_DIR_ENV,
)
"""Identity and paths in every main container (components/pod.py pod_env), in this order."""

CLUSTER_ENV = ("NNODES", "GPUS_PER_NODE", "APP_NAME", "HEADLESS_SERVICE", "POD_NAMESPACE", "MASTER_PORT")
"""Keys of `cluster.env` (the `<app>-cluster` ConfigMap at $ML_DEV_CLUSTER_DIR): the count-dependent facts.
startup.sh and sshd.sh read them from the file; they are not in the container env."""

DEVLOOP_ENV = ("ML_DEV_SSH_PORT", "ML_DEV_SSH_USER", "ML_DEV_SHARED_PATHS", "ML_DEV_PER_POD_PATHS")
"""Keys of `devloop.env` next to the programs in the startup ConfigMap (sshd.sh, ml-dev)."""

RANK_ENV = (
    "ML_DEV_POD",
    "NODE_RANK",
    "NNODES",
    "GPUS_PER_NODE",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "DEEPSPEED_HOSTFILE",
    "ML_DEV_HOSTS",
    "ML_DEV_PODS",
)
"""`$ML_DEV_STATE_DIR/rank.env`, written by startup.sh only (+ NCCL_IB_HCA when auto-detected)."""

PER_POD_ENV = (
    "HOSTNAME",
    "HOME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "USER",
    "LOGNAME",
    "SHELL",
    "MAIL",
    "TERM",
    "POD_*",
    "NODE_NAME",
    "ML_DEV_POD",
    "ML_DEV_HOME",
    "NODE_RANK",
    "PET_NODE_RANK",
    "RANK",
    "LOCAL_RANK",
    "SSH_*",
    "LD_PRELOAD",
    "NSS_WRAPPER_*",
    "KUBERNETES_*",
)
"""Names `ml-dev run` never carries from the launching pod to the others (glob patterns): what differs per
pod by nature. The shipped launcher holds the same tuple (inpod/ml_dev.py PER_POD_ENV; tests/test_contract.py)."""

# ------------------------------------------------------------------------------ stops and idle rules

GPU_PROBE_SECONDS = 8
"""The idle agent's GPU probe budget (both nvidia-smi queries; inpod/idle_probes.py GPU_PROBE_SECONDS): a worker's
/activity runs it inline, so a hung nvidia-smi is that pod's failed GPU check (active), never an unreachable pod."""

ACTIVITY_FETCH_SECONDS = 15
"""How long pod 0 waits for a worker's /activity (inpod/idle_decider.py fetch_json); above the GPU probe's budget."""

GPU_DEVICE_PREFIX = "/dev/nvidia"
"""The GPU device files (`/dev/nvidia<N>`) whose holders the idle rule reads: a GPU held only by Jupyter kernels
that /api/kernels reports idle does not veto (inpod/idle_probes.py held_by_idle_kernels)."""

STOPPING_MARKER = "stopping"
"""`$ML_DEV_STATE_DIR/stopping`: written by checkpoint_stop.sh when its pod stops; the rank agent then tells
`ml-dev run` its pod is stopping (every other rank is stopped at once), `ml-dev status` shows STOPPING."""

RUN_STOPPED_STATUS = 143
"""`ml-dev run`'s exit status when a pod's stop ended the job (inpod/ml_dev_launch.py STOPPED_STATUS)."""
