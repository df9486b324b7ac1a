"""What the pods read: the one contract between the render and the in-pod programs.

Defined here once, on the ground floor: the components render from it (components/pod.py: the container env and
`cluster.env`; components/devloop.py: `devloop.env`; components/lifecycle.py: `idle.json`, the stop env) and the
programs read it (`from ..contract import …`). tests/core/test_pod_contract.py holds both sides: every name a program reads is
rendered or written by another program, every rendered name is listed here, and the shell files' copies of these
facts (`${NAME:-default}`) equal them; a literal of this module spelled again in Python elsewhere fails the test.
Standard library only, Python 3.8+: it ships with the programs (inpod.SHIPPED, group package).
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

# ------------------------------------------------------------------------------------------ mount paths

STARTUP_MOUNT = "/opt/ml-dev-env"
"""Where the startup ConfigMap (the programs, their launchers and shell files) is mounted in every pod."""
CLUSTER_MOUNT = "/etc/ml-dev-env/cluster"
"""The `<app>-cluster` ConfigMap (`cluster.env`): the count-dependent facts."""
SETTINGS_MOUNT = "/etc/ml-dev-env/lifecycle"
SETTINGS_KEY = "idle.json"
IDLE_SETTINGS = f"{SETTINGS_MOUNT}/{SETTINGS_KEY}"
"""The idle agent's settings (the `<app>-lifecycle` ConfigMap), re-read every interval."""
SECRETS_MOUNT = "/etc/ml-dev-env/secrets"
"""The user's Secrets of `env.secrets`: each at `<SECRETS_MOUNT>/<secret>/<KEY>`, only the listed keys (the volume's
`items`), read-only, mode 0440 (components/pod.py user_secret_volumes). Read where a rank or an SSH session starts
(inpod/lib/usersecrets.py, inpod/sh/ssh-session.sh), never copied into a file, the container env or an argv."""
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""The pod's service-account token, CA and namespace (the kubelet's projected kube-api-access volume)."""

# ------------------------------------------------------------------------------------------ the state directory

STATE_DIR = "/tmp/ml-dev-env"
"""$ML_DEV_STATE_DIR: per pod, never synced."""
RANK_ENV_FILE = "rank.env"
"""`export KEY=value` lines (RANK_ENV), written by startup.sh only."""
HEARTBEAT_DIR = "heartbeat"
"""`<name>-<pid>.json` per live `ml-dev run`/`exec` (the launcher's activity)."""
GATE_RECORD_PREFIX = "gate-"
"""`heartbeat/gate-<pid>.json`: a rank agent of `ml-dev run` still at its gate (the tree being copied); the stop hook
(checkpoint_stop.sh) sends it SIGTERM as it does a rank agent, and it names the stop to its launcher and ends."""
SSH_SESSIONS_DIR = "ssh-sessions"
"""`<pid>` per live SSH session (ssh-session.sh): lines start time, user, `$SSH_CLIENT`, `$ML_DEV_RUN`."""
RUN_ENV = "ML_DEV_RUN"
"""The pid of the `ml-dev` launcher that opened an SSH session (its ssh sends it, sshd.sh's AcceptEnv takes it,
ssh-session.sh records it; empty: a person's session)."""
ACTIVITY_DIR = "activity"
"""Activity records the idle agent reads (`ssh/<pid>`, `launcher.heartbeat`)."""
IDLE_STOP_FILE = "idle-stop.json"
"""The last idle stop pod 0 made."""
IDLE_STATUS_FILE = "idle-status.json"
"""Pod 0's idle decision each round."""
FABRIC_LATEST = "fabric/latest.json"
"""The fabric gate's latest result."""
WORKSPACE_RECORDS_DIR = ".ml-dev-env"
"""`$ML_DEV_WORKSPACE/.ml-dev-env/`: what a pod keeps in the workspace of its own (the launching pod's runs, the home
page's utilisation history on pod 0, the fabric gate's results). With a per-pod workspace it is that pod's alone: the
dev loop never syncs it (components/devloop.py per_pod_paths), and pod 0's page rewrites its history there while a
tree is being copied and hashed."""
RUNS_DIR = f"{WORKSPACE_RECORDS_DIR}/runs"
"""`$ML_DEV_WORKSPACE/.ml-dev-env/runs/<run>/` on the launching pod: what `ml-dev why` and the run's watchdog kept
(`why/<UTC time>.json`, each with the per-rank stacks and dumps it used, and `why/latest.json`)."""
WHY_LATEST = "why/latest.json"
"""The last verdict of a run, under its RUNS_DIR directory (the home page shows it while the run is alive)."""
RUN_LOG_DIR = "logs"
"""Under a run's RUNS_DIR directory on every pod running one of its ranks: `rank<N>.log`, every line of rank N's output
and of its agent, written by the agent whatever became of the launcher (`ml-dev logs` reads it back)."""
RUN_LOG_PREFIX = "rank"
RUN_LOG_SUFFIX = ".log"
RUN_LOG_END = "ml-dev: END: status "
"""A run log's last line once the rank's agent has stopped its group: the rank's exit status follows."""
RUN_STATE_DIR = "runs"
"""`$ML_DEV_STATE_DIR/runs/<run>/` on every pod running a rank: the progress file and Flight Recorder's pipe and dumps."""
HOME_ADDR = "home.addr"
"""The addresses the home page listens on, one a line."""

# ------------------------------------------------------------------------------------------ env names

STARTUP_DIR_ENV = "ML_DEV_DIR"
"""Container env: the startup ConfigMap's mount path (STARTUP_MOUNT). Programs that hand their own path to another pod
use it, never a resolved path: the kubelet's `..<timestamp>` directory behind the mount's symlinks differs per pod."""
STATE_DIR_ENV = "ML_DEV_STATE_DIR"
CLUSTER_DIR_ENV = "ML_DEV_CLUSTER_DIR"
IDLE_SETTINGS_ENV = "ML_DEV_IDLE_SETTINGS"
"""Overrides IDLE_SETTINGS (tests, a copy of the settings)."""
SA_DIR_ENV = "ML_DEV_SA_DIR"
"""Overrides SA_DIR (tests)."""
SECRETS_DIR_ENV = "ML_DEV_SECRETS_DIR"
"""Overrides SECRETS_MOUNT (tests)."""
SECRETS_ENV = "ML_DEV_SECRETS"
"""`devloop.env`: the listed Secret keys, `<secret>/<KEY>` separated by spaces (names only, never a value)."""

CONTAINER_ENV = (
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "NODE_NAME",
    "ML_DEV_WORKSPACE",
    STATE_DIR_ENV,
    CLUSTER_DIR_ENV,
    "ML_DEV_HOME",
    "HOME",
    "ENV",
    STARTUP_DIR_ENV,
)
"""Identity and paths in every main container (components/pod.py pod_env), in this order."""

SERVER_ENV = ("ML_DEV_SERVERS", "ML_DEV_AUTH", "TENSORBOARD_LOGDIR", "ML_DEV_MEMLOCK", "ML_DEV_HCA_MODE")
"""The dev servers and the pod's network mode (components/pod.py server_env), after the NCCL env."""

CHECKPOINT_GRACE_ENV = "ML_DEV_CHECKPOINT_GRACE_SECONDS"
CHECKPOINT_SIGNAL_ENV = "ML_DEV_CHECKPOINT_SIGNAL"
STALL_SECONDS_ENV = "ML_DEV_STALL_SECONDS"
"""lifecycle.stallVerdictSeconds: `ml-dev run` runs `ml-dev why` itself after this long without progress (0: never)."""
STOP_ENV = (CHECKPOINT_GRACE_ENV, CHECKPOINT_SIGNAL_ENV, STALL_SECONDS_ENV)
"""What PID 1, the preStop hook and `ml-dev run`/`rank` read about a stop or a stall (components/lifecycle.py
stop_env), last."""
GRACE_DEFAULT = 30
"""lifecycle.checkpointGraceSeconds' default: seconds a stopped rank gets to save a checkpoint."""
SIGNAL_DEFAULT: Final = "SIGTERM"
"""lifecycle.checkpointSignal's default."""
STALL_DEFAULT = 600
"""lifecycle.stallVerdictSeconds' default."""
STALL_MIN = 10
"""The shortest stall time the setting accepts (the verdict itself takes a few seconds)."""

RUN_ID_ENV = "ML_DEV_RUN_ID"
"""Set by `ml-dev run` on every rank: the run's id (its directory under RUNS_DIR)."""
PROGRESS_FILE_ENV = "ML_DEV_PROGRESS_FILE"
"""Set by `ml-dev run` on every rank: a path the job may touch to tell the watchdog it progresses without printing."""

CLUSTER_ENV = ("NNODES", "GPUS_PER_NODE", "APP_NAME", "HEADLESS_SERVICE", "POD_NAMESPACE", "MASTER_PORT")
"""Keys of `cluster.env` (at $ML_DEV_CLUSTER_DIR): the count-dependent facts. startup.sh and sshd.sh read them from
the file; they are not in the container env."""

DEVLOOP_ENV = ("ML_DEV_SSH_PORT", "ML_DEV_SSH_USER", "ML_DEV_SHARED_PATHS", "ML_DEV_PER_POD_PATHS", SECRETS_ENV)
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
"""Names `ml-dev run` never carries from the launching pod to the others (glob patterns): what differs per pod by
nature (`ml-dev run --help` prints them)."""

SHELL_DEFAULTS = {
    STATE_DIR_ENV: STATE_DIR,
    CLUSTER_DIR_ENV: CLUSTER_MOUNT,
    IDLE_SETTINGS_ENV: IDLE_SETTINGS,
    CHECKPOINT_GRACE_ENV: str(GRACE_DEFAULT),
    CHECKPOINT_SIGNAL_ENV: SIGNAL_DEFAULT,
    SECRETS_DIR_ENV: SECRETS_MOUNT,
}
"""The defaults the shell files spell as `${NAME:-default}` (a shell file cannot import this module):
tests/core/test_pod_contract.py holds every such copy equal to this table."""

# ------------------------------------------------------------------------------------------ ports and labels

ACTIVITY_PORT = 9099
"""The idle agent's HTTP port on every pod (`/activity`, `/decision` on pod 0)."""
STACK_LABEL = "ml-dev-env/stack"
"""Every object a stack owns."""
CLUSTER_LABEL = "ml-dev-env/cluster"
"""Every environment's objects of one cluster (`make status`, `usage.py status`)."""
USAGE_LABEL = "ml-dev-env/usage"
"""The GPU-hours record ConfigMap."""


def usage_configmap(app: str) -> str:
    """The environment's GPU-hours record (core/naming.py names it for the render, the home page reads it)."""
    return f"{app}-usage"


PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "ml-dev-env"

# ------------------------------------------------------------------------------------------ idle.json


class IdleSettings(TypedDict, total=False):
    """`idle.json` as components/lifecycle.py writes it and the agent, the home page and `ml-dev status` read it."""

    enabled: bool
    idleTimeoutSeconds: int
    intervalSeconds: int
    warningLeadSeconds: int
    gpuUtilThreshold: int
    gpuMemoryUtilThreshold: int
    gpuMemoryFloorMiB: int
    unreachableSeconds: int
    activityPort: int
    servers: list[str]
    statefulset: str
    namespace: str
    recordConfigMap: str


IDLE_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "idleTimeoutSeconds": 3600,
    "intervalSeconds": 60,
    "warningLeadSeconds": 600,
    "gpuUtilThreshold": 5,
    "gpuMemoryUtilThreshold": 5,
    "gpuMemoryFloorMiB": 1024,
    "unreachableSeconds": 600,
    "activityPort": ACTIVITY_PORT,
    "servers": [],
}
"""The one table of idle.json's defaults: the schema's (stacks/config.py IdleStopConfig) and every reader's."""

# ------------------------------------------------------------------------------------------ the tree's fan-out


FANOUT_DEFAULTS: dict[str, int] = {
    "minPods": 2,
    "minBytes": 32 << 20,
    "tries": 3,
    "stallSeconds": 20,
    "patchBytes": 4 << 20,
}
"""When `ml-dev sync` (and `ml-dev run`'s sync) passes the tree on through pods that hold it (inpod/ml_dev/fanout.py;
docs/use/day-in-the-life.md). The launching pod pushes to every pod that needs the tree at once (one round) unless
at least `minPods` pods need it and that push would send at least `minBytes` from it in all (the estimate: the
changed files' sizes for a pod that holds the tree the launching pod sent last, the whole tree for any other);
then the copy goes in rounds: the launching pod sends once, to a first relay, and from then on every pod that
holds the verified tree sends to one more per round, the first relay to two (the launching pod's share). The
holders double each round: ceil(log2 N) rounds for N pods, and the launching pod sends the tree once. A pod gets
the tree from at most `tries` sources; a relay that sends no word for `stallSeconds` (nor its rsync moves a byte)
is given up for this sync and its receiver retried from another pod.

`patchBytes`: in `ml-dev run`'s direct push, a pod that answered the hash of the tree the launching pod sent last
gets the files changed since (regular files, at most `patchBytes` in all; 0: never) through the gate its rank agent
waits at (inpod/ml_dev/sync.py apply_patch), over the SSH session of the rank start, instead of an rsync hop; a pod
whose hash then differs gets the rsync hop (--checksum). Still the fabric's SSH and no new daemon or port: the rsync
hop costs a pod a new SSH session, the remote shell and an rsync server on top of the rank start, which was 0.09 to
0.36 s of a launch with one 1 MiB file changed at 2 to 16 pods (1.30 to 1.48 x the unchanged tree's, `make
bench-launch`, docs/models/benchmarks.md), while the rank start alone checks an unchanged tree. `ml-dev sync` (no
rank agents) and the fan-out's rounds copy by rsync."""
FANOUT_ENV = "ML_DEV_FANOUT"
"""Overrides FANOUT_DEFAULTS' keys with a JSON object in the launching shell (tests and benchmarks: a small tree
that fans out)."""

# ------------------------------------------------------------------------------------------ stops and idle rules

GPU_PROBE_SECONDS = 8
"""The idle agent's GPU probe budget (both nvidia-smi queries; inpod/idle/probes.py): a worker's /activity runs it
inline, so a hung nvidia-smi is that pod's failed GPU check (active), never an unreachable pod."""

ACTIVITY_FETCH_SECONDS = 15
"""How long pod 0 waits for a worker's /activity (inpod/idle/decider.py); above the GPU probe's budget."""

ACTIVITY_CONNECT_SECONDS = 5
"""How long pod 0 waits for a worker to accept the connection for /activity: a pod whose node is gone fails within
it (Linux sends the SYN again 1 s and 3 s after the first: include/net/tcp.h TCP_TIMEOUT_INIT, 1 s, set by
net/ipv4/tcp_output.c tcp_connect_init and doubled per retry by net/ipv4/tcp_timer.c tcp_retransmit_timer), not
after the whole ACTIVITY_FETCH_SECONDS, so one round of pod 0 is not held up by it."""

GPU_DEVICE_PREFIX = "/dev/nvidia"
"""The GPU device files (`/dev/nvidia<N>`) whose holders the idle rule reads: a GPU held only by Jupyter kernels
that /api/kernels reports idle does not veto (inpod/idle/probes.py held_by_idle_kernels)."""

STOPPING_MARKER = "stopping"
"""`$ML_DEV_STATE_DIR/stopping`: written by checkpoint_stop.sh when its pod stops; the rank agent then tells
`ml-dev run` its pod is stopping (every other rank is stopped at once), `ml-dev status` shows STOPPING."""

RUN_STOPPED_STATUS = 143
"""`ml-dev run`'s exit status when a pod's stop ended the job (inpod/ml_dev/launch.py STOPPED_STATUS)."""
