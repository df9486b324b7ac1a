"""What the pods read: the one contract between the render and the in-pod programs.

Defined here once, on the ground floor: the components render from it (components/pod.py: the container env and
`cluster.env`; components/devloop.py: `devloop.env`; components/lifecycle.py: `idle.json`, the stop env) and the
programs read it (`from ..contract import …`; the shell files from contract.env, `shell_env()`, shipped beside them).
tests/core/test_pod_contract.py holds both sides: every name a program reads is rendered or written by another
program, every rendered name is listed here, the shell files read every fact from contract.env and spell none; a
literal of this module spelled again in Python or a shell file elsewhere fails the test.
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
"""`$ML_DEV_WORKSPACE/.ml-dev-env/`: what the programs keep in the workspace, each environment in a folder of its own
(`records_dir`). With a per-pod workspace it is that pod's alone: the dev loop never syncs it (components/devloop.py
per_pod_paths), and pod 0's page rewrites its history there while a tree is being copied and hashed."""
ENV_RECORDS_DIR = "env"
"""`.ml-dev-env/env/<app>/`: one environment's records (the launching pod's runs, the home page's utilisation history
on pod 0, the fabric gate's results). A workspace claim may be mounted by several environments (docs/use/teams.md):
nothing one writes there carries another's name, so each page shows its own."""
LEGACY_RECORDS = ("runs", "home", "fabric")
"""What `.ml-dev-env/` held directly before records were kept per environment: moved once, into the folder of the
first environment whose program looks (inpod/lib/pod.py env_records_dir), never overwriting one (a name both hold keeps
the older as `<name>.before-<time>`)."""
RUNS_SUBDIR = "runs"
"""`<records_dir>/runs/<run>/` on the launching pod: what `ml-dev why` and the run's watchdog kept (`why/<UTC
time>.json`, each with the per-rank stacks and dumps it used, and `why/latest.json`)."""
WARM_DIR = "warm-ranks"
"""Warm ranks (`ml-dev ranks`): `<records_dir>/warm-ranks/` on the launching pod (WARM_STATE_FILE, WARM_HUB_LOG) and
`$ML_DEV_STATE_DIR/warm-ranks/` on every pod running them (WARM_ACTIVITY_FILE, `cells/cell-<id>.py`)."""
WARM_STATE_FILE = "state.json"
"""The hub's record: state (starting, warm, stopped, failed), hub pid and pod, pods, ranks per pod, the last cell."""
WARM_HUB_LOG = "hub.log"
"""The hub's output: the `ml-dev run` of the warm ranks' node program, as its launcher prints it."""
WARM_ACTIVITY_FILE = "activity.json"
"""A pod's warm ranks, rewritten by its node at every cell's start and end: `running` (cell ids), `last` (the time of
the last cell event, the start if none), `last_cell` ({id, state, ranks, started, ended}); the idle agent's signal."""
WARM_NODE_COMMAND = "_warm-node"
"""The warm ranks' rank command on every pod (`ml-dev _warm-node`): a rank heartbeat naming it is a warm rank's."""
WARM_WORKER_COMMAND = "_warm-worker"
"""The last word of a warm rank's worker's argv (`python3 -c ... <fd> _warm-worker`): the idle agent knows its GPU."""
WARM_BRIDGE_COMMAND = "_warm-bridge"
WARM_SOCKET_PREFIX = "ml-dev-env/warm/"
"""The abstract Unix sockets of warm ranks (`\\0ml-dev-env/warm/{node,hub}:<uid>:...`): in the pod's network namespace only."""


def records_dir(workspace: str, app: str) -> str:
    """The environment's own records folder in the workspace (`<workspace>/.ml-dev-env/env/<app>`)."""
    return f"{workspace}/{WORKSPACE_RECORDS_DIR}/{ENV_RECORDS_DIR}/{app}"


FINGERPRINT_FIELDS = ("python", "distributions", "libraries", "pythonpath", "sys_path")
"""A rank's environment fingerprint (inpod/ml_dev/envgate.py), answered by its rank agent at the gate beside the tree
hash: the `python3` its PATH finds (path, where it leads, version), every installed distribution (name: version), the
CUDA and NCCL libraries the loader would map (path, sha256), PYTHONPATH, and sys.path's shape (entry, whether it
offers anything to import, the top-level names of an entry outside site-packages and the standard library)."""
FINGERPRINT_LIBRARIES = ("libnccl", "libcudart", "libcublas", "libcudnn")
"""The libraries whose path and content every rank must share (the loader's search: envgate.libraries)."""
ENV_GATE_DIR = "env-gate"
"""`<records_dir>/env-gate/`: the drift gate's records on the launching pod: `last.json` (the last launch's gate:
"one environment" or the ranks that differ; `ml-dev status` and the home page show it) and `pip.jsonl` (every `ml-dev
pip` command, in order: what a pod added by a resize is given before its first rank starts)."""
ENV_GATE_LAST = "last.json"
ENV_PIP_LOG = "pip.jsonl"
ENV_PIP_APPLIED = ".cache/ml-dev-env/pip-applied"
"""`$HOME/.cache/ml-dev-env/pip-applied` on every pod: how many commands of the pip log (ENV_PIP_LOG) that pod ran
(its HOME is its own in every storage mode; a pod added by a resize has none: the gate runs the log there first)."""
RUN_DRIFT_FILE = "drift.json"
"""`<records_dir>/runs/<run>/drift.json`: a run launched with `--allow-drift` over ranks that differ, and how."""


START_LEDGER_DIR = "starts"
"""`<records_dir>/starts/<start>.json`: the start ledger of one start or resume of the environment, every pod's phases
(inpod/lib/ledger.py), the last START_LEDGER_KEEP kept."""
START_LEDGER_KEEP = 20
START_MARKS_DIR = "start-marks"
"""`$ML_DEV_STATE_DIR/start-marks/<phase>`: the time (epoch seconds) an in-pod phase of this container's start was
reached, written once by the program that reached it. The state directory is the container's own, so a restarted
container starts a new record."""
START_SSHD = "sshd-ready"
"""sshd.sh: sshd listens (its PidFile is written: openssh-portable sshd.c main writes it right after server_listen()
has bound and listened on every address, before server_accept_loop; not under -d, and sshd.sh runs `sshd -D -e`)."""
START_FABRIC = "fabric-gate"
"""The fabric gate (inpod/fabric/check.py gate) passed."""
START_RANK = "first-rank"
"""The first rank of an `ml-dev run` started on this pod (inpod/ml_dev/launch.py cmd_rank)."""
START_IN_POD = (START_SSHD, START_FABRIC, START_RANK)
"""The phases the pod's own programs record (START_MARKS_DIR); the others come from the API."""
START_PHASES = ("admitted", "scheduled", "volumes", "image", "started", *START_IN_POD)
"""The phases of a pod's start, in the order the kubelet and the programs reach them; each ends at its boundary
(inpod/lib/ledger.py says where each is read), the first begins at the pod's creation."""


WHY_LATEST = "why/latest.json"
"""The last verdict of a run, under its run directory (the home page shows it while the run is alive)."""
RUN_LOG_DIR = "logs"
"""Under a run's directory (`<records_dir>/runs/<run>/`) on every pod running one of its ranks: `rank<N>.log`, every line of rank N's output
and of its agent, written by the agent whatever became of the launcher (`ml-dev logs` reads it back)."""
RUN_LOG_PREFIX = "rank"
RUN_LOG_SUFFIX = ".log"
STATE_LOGS_DIR = "logs"
"""`$ML_DEV_STATE_DIR/logs/` on every pod: where each program startup.sh starts writes its output (`<name>.log`,
`sshd.log`)."""
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
PROXY_PORTS_ENV = "ML_DEV_PROXY_PORTS"
"""Main container env (auth `oauth-proxy`): the OAuth proxies' ports, separated by spaces. Each proxy sidecar listens on
127.0.0.1:<port>; startup.sh starts forward.py on every pod, which owns `<pod IP>:<port>` bound to the interface that
holds the pod IP and copies each connection to the proxy (components/pod.py proxy_containers)."""
IDLE_SETTINGS_ENV = "ML_DEV_IDLE_SETTINGS"
"""Overrides IDLE_SETTINGS (tests, a copy of the settings)."""
SA_DIR_ENV = "ML_DEV_SA_DIR"
"""Overrides SA_DIR (tests)."""
SECRETS_DIR_ENV = "ML_DEV_SECRETS_DIR"
"""Overrides SECRETS_MOUNT (tests)."""
SECRET_VALUE_MAX = 65536
"""The most bytes one env.secrets value may have (as the Secret holds it). Each value becomes one `KEY=value` string
of a process's environment, and Linux refuses an execve(2) any one of whose strings is longer than MAX_ARG_STRLEN,
32 pages (include/uapi/linux/binfmts.h; fs/exec.c copy_strings, E2BIG): a 140,000-byte value made every command of
an SSH session fail (bash: Argument list too long, exit 126). Half of that leaves room for the name and the rest of
the environment (ARG_MAX, a quarter of the stack limit, bounds all strings together). A longer value, one with a
NUL byte (an environment string ends at the first) or one that is not UTF-8 text is refused, naming Secret and key,
the same words at the launch, in `_rank` and in the SSH session hook (inpod/lib/usersecrets.py refusal_line,
inpod/sh/ssh-session.sh); the key is then unset, everything else works."""
SECRET_VALUE_MAX_ENV = "ML_DEV_SECRET_VALUE_MAX"
"""Overrides SECRET_VALUE_MAX (tests)."""
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

MODELS_ENV = "ML_DEV_MODELS"
"""The models mounted from their images (models[].mountInEnv): a JSON list of {"name", "path", "image"} (image by
`@sha256:` digest), in the container env after the servers' facts and only where a model is mounted (components/pod.py
model_volumes); `ml-dev status` and the home page list them (inpod/lib/pod.py mounted_models)."""

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
"""Set by `ml-dev run` on every rank: the run's id (its directory under RUNS_SUBDIR)."""
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

# ------------------------------------------------------------------------------------------ ports and labels

ACTIVITY_PORT = 9099
"""The idle agent's HTTP port on every pod (`/activity`, `/decision` on pod 0)."""
STACK_LABEL = "ml-dev-env/stack"
"""Every object a stack owns."""
CLUSTER_LABEL = "ml-dev-env/cluster"
"""Every environment's objects of one cluster (`make status`, `usage.py status`)."""
USAGE_LABEL = "ml-dev-env/usage"
"""The GPU-hours record ConfigMap."""
IDLE_AGENT_MANAGER = "ml-dev-env-idle-agent"
"""The idle agent's field manager (and Event component): the scale PUT it stops with is recorded under it, which is
how the usage recorder tells an idle stop from another (inpod/usage.py)."""


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
docs/ref/dev-loop.md). The launching pod pushes to every pod that needs the tree at once (one round) unless
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

# ------------------------------------------------------------------------------------------ files the shell reads too

SSH_SECRET_MOUNT = "/etc/ml-dev-env/ssh"
"""The `<app>-ssh` Secret (host keys, the fabric's key pair) in every pod of the stack (components/devloop.py)."""
SSH_SECRET_DIR_ENV = "ML_DEV_SSH_SECRET_DIR"
"""Overrides SSH_SECRET_MOUNT (sshd.sh; tests)."""
SSH_PORT = 2222
"""sshd's port in every pod (unprivileged); devloop.env's ML_DEV_SSH_PORT says it, this is sshd.sh's fallback."""
MASTER_PORT = 29500
"""torch's TCPStore on pod 0 (`MASTER_PORT` in cluster.env; startup.sh's fallback)."""
CLUSTER_ENV_FILE = "cluster.env"
"""The key of the `<app>-cluster` ConfigMap under CLUSTER_MOUNT (CLUSTER_ENV)."""
DEVLOOP_ENV_FILE = "devloop.env"
"""The rendered dev-loop settings (DEVLOOP_ENV) next to the programs in the startup ConfigMap."""
FABRIC_SETTINGS_FILE = "fabric.json"
"""The fabric gate's settings next to the programs in the startup ConfigMap (components/fabric.py)."""
HOME_LINKS_FILE = "home-links.json"
"""The home page's links next to the programs in the startup ConfigMap: `[[server, title], ...]`, the stack's enabled
routed dev servers but the page, in table order (components/gpu_cluster.py from core/servers.py page_links)."""
READY_FILE = "ready"
"""`$ML_DEV_STATE_DIR/ready`: startup.sh's ready file, which the main container's readiness probe tests."""
SHELL_ENV_FILE = "env.sh"
"""`$ML_DEV_STATE_DIR/env.sh`: sources rank.env and sets the HOME caches; every shell's ~/.bashrc sources it."""
SSH_SESSION_ENV_FILE = "ssh/session.env"
"""`$ML_DEV_STATE_DIR/ssh/session.env`: the container env every SSH session gets (sshd.sh writes it)."""
IDLE_WARNING_FILE = "idle-warning"
"""`$ML_DEV_STATE_DIR/idle-warning`: the pending idle stop's warning, shown by idle-warning.sh in interactive shells."""
ENV_NAME_FIRST = "A-Za-z_"
ENV_NAME_REST = "A-Za-z0-9_"
ENV_NAME_PATTERN = f"[{ENV_NAME_FIRST}][{ENV_NAME_REST}]*"
"""A valid environment variable name, the one rule (stacks/config.py for env.secrets' keys, inpod/lib/usersecrets.py,
and ssh-session.sh as the glob classes `[$CONTRACT_ENV_NAME_FIRST]` / `[!$CONTRACT_ENV_NAME_REST]`)."""
WORKSPACE_ENV = "ML_DEV_WORKSPACE"
WORKSPACE_DEFAULT = "/workspace"
"""$ML_DEV_WORKSPACE: the shared workspace volume's mount (components/pod.py sets it; this is the programs' fallback)."""
SHELL_DEFAULTS = {
    STATE_DIR_ENV: STATE_DIR,
    CLUSTER_DIR_ENV: CLUSTER_MOUNT,
    IDLE_SETTINGS_ENV: IDLE_SETTINGS,
    CHECKPOINT_GRACE_ENV: str(GRACE_DEFAULT),
    CHECKPOINT_SIGNAL_ENV: SIGNAL_DEFAULT,
    SECRETS_DIR_ENV: SECRETS_MOUNT,
    SSH_SECRET_DIR_ENV: SSH_SECRET_MOUNT,
    WORKSPACE_ENV: WORKSPACE_DEFAULT,
    SECRET_VALUE_MAX_ENV: str(SECRET_VALUE_MAX),
}
"""The defaults of these names in the shell files: `${NAME:-$CONTRACT_<fact>}`, the fact read from contract.env
(`shell_env()`); tests/core/test_pod_contract.py holds each to this table."""
CONTRACT_ENV_FILE = "contract.env"
"""This module's facts for the shell files (they cannot import it): `shell_env()`, shipped beside them."""


def shell_env() -> str:
    """contract.env: every string and integer fact of this module as `CONTRACT_<NAME>='<value>'`, a tuple of names as
    its words; the shell files source it from beside themselves (a shell file spells no path, default or state-
    directory name of its own: tests/core/test_pod_contract.py). Generated into inpod/sh/contract.env
    (`python -m tools.contract_env --write`); a stale copy fails the contract gate."""
    lines = [
        "# shellcheck shell=sh",
        "# Generated from inpod/contract.py by `python -m tools.contract_env --write`; edit that file, not this one.",
    ]
    for name, value in globals().items():
        if not name.isupper() or name.startswith("_"):
            continue
        if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            value = " ".join(value)
        if type(value) in (str, int):
            text = str(value)
            assert "'" not in text and "\n" not in text, f"{name}: a fact the shell reads needs no quoting"
            lines.append(f"CONTRACT_{name}='{text}'")
    return "\n".join(lines) + "\n"
