#!/bin/bash
# ml-dev-env pod startup (mounted from the <app>-startup ConfigMap, run as the main container's command).
#
# 1. raises memlock when the stack grants it (never fatal: a refused `ulimit` only warns),
# 2. sets up the persistent per-pod HOME (caches, IDE state, `pip install --user`, shell history),
# 3. computes this pod's rank from the cluster ConfigMap and writes rank.env and the DeepSpeed hostfile,
# 4. starts the enabled dev servers on pod 0 only (workers start none), without the rank values in their
#    environment (new kernels and terminals read rank.env when they start),
# 5. marks the pod ready, then re-reads the cluster ConfigMap every ML_DEV_POLL_SECONDS and rewrites
#    rank.env and the hostfile in place when it changed (a new node count restarts nothing; running
#    processes keep the values they started with, new shells and launches see the new ones); the
#    rack-aware order (an API read) is checked every ML_DEV_RACK_POLL_SECONDS.
#
# An unwritable path never stops it (no crash loop): each one degrades with a WARNING.
#
# Inputs (container env set by the GpuCluster component; none of it depends on the node count):
#   POD_NAME   ML_DEV_CLUSTER_DIR (/etc/ml-dev-env/cluster): its cluster.env holds NNODES GPUS_PER_NODE
#   APP_NAME HEADLESS_SERVICE POD_NAMESPACE MASTER_PORT as KEY=value lines (the same names in the
#   environment are the fallback)   ML_DEV_HOME (persistent HOME)   ML_DEV_POLL_SECONDS (2)
#   ML_DEV_RACK_POLL_SECONDS (10)
#   ML_DEV_MEMLOCK=none|scc|privileged   ML_DEV_HCA_MODE=explicit|auto
#   ML_DEV_SERVERS="vscode jupyter tensorboard"   ML_DEV_AUTH=oauth-proxy|token
#   ML_DEV_WORKSPACE (/workspace)  ML_DEV_STATE_DIR (/tmp/ml-dev-env)  TENSORBOARD_LOGDIR
#   PASSWORD (code-server, token mode)  JUPYTER_TOKEN (token mode)
#   ML_DEV_CHECKPOINT_GRACE_SECONDS (30)  ML_DEV_CHECKPOINT_SIGNAL (SIGTERM): what a stop gives each rank
#
# Outputs (the rank contract: other tools read these files and never recompute ranks):
#   $ML_DEV_STATE_DIR/rank.env   `export KEY='value'` lines: ML_DEV_POD NODE_RANK NNODES GPUS_PER_NODE
#       WORLD_SIZE MASTER_ADDR MASTER_PORT PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE PET_MASTER_ADDR
#       PET_MASTER_PORT DEEPSPEED_HOSTFILE ML_DEV_HOSTS ML_DEV_PODS (+ NCCL_IB_HCA when auto-detected)
#   $DEEPSPEED_HOSTFILE          `<pod fqdn> slots=<gpus>` per line, in rank order
#   $ML_DEV_STATE_DIR/env.sh     sources rank.env and sets the HOME caches; sourced by ~/.bashrc,
#                                ~/.profile, $ENV (`oc rsh`'s /bin/sh) and /etc/profile.d in our images
#   $IPYTHONDIR/profile_default/startup/00-ml-dev-env-rank.py   loads rank.env into every new IPython kernel
#   $ML_DEV_STATE_DIR/ready      the readiness probe's file
set -euo pipefail

log() { printf '[ml-dev-env] %s\n' "$*"; }
warn() { log "WARNING: $*"; }

# shellcheck source=contract.env
. "$(dirname "${BASH_SOURCE[0]}")/contract.env"  # the facts of inpod/contract.py (CONTRACT_*), shipped beside this file
WORKSPACE="${ML_DEV_WORKSPACE:-$CONTRACT_WORKSPACE_DEFAULT}"
STATE_DIR="${ML_DEV_STATE_DIR:-$CONTRACT_STATE_DIR}"
CLUSTER_FILE="${ML_DEV_CLUSTER_DIR:-$CONTRACT_CLUSTER_MOUNT}/$CONTRACT_CLUSTER_ENV_FILE"
# a file read every 2 s costs next to nothing; the rack-aware order asks the API server (every pod), so less often
POLL="${ML_DEV_POLL_SECONDS:-2}"
RACK_POLL="${ML_DEV_RACK_POLL_SECONDS:-10}"
RACK_POLL="${RACK_POLL%%.*}"  # whole seconds ($SECONDS)
SERVERS="${ML_DEV_SERVERS:-}"
AUTH="${ML_DEV_AUTH:-oauth-proxy}"
if ! mkdir -p "$STATE_DIR/$CONTRACT_STATE_LOGS_DIR" 2>/dev/null || [ ! -w "$STATE_DIR" ]; then
  if fallback="$(mktemp -d "${TMPDIR:-/tmp}/ml-dev-env.XXXXXX" 2>/dev/null)" && mkdir -p "$fallback/$CONTRACT_STATE_LOGS_DIR"; then
    warn "cannot write $STATE_DIR; using $fallback (the readiness probe will not see this pod ready)"
    STATE_DIR="$fallback"
  else
    # Nothing to write to: keep going (servers log to the pod log), never crash-loop.
    warn "cannot write $STATE_DIR nor ${TMPDIR:-/tmp}: no rank.env, env.sh, server log files or ready file" \
         "(the pod stays unready; is /tmp a writable emptyDir?)"
  fi
fi
export ML_DEV_STATE_DIR="$STATE_DIR"  # the dev servers' kernels find rank.env through it
rm -f "$STATE_DIR/$CONTRACT_READY_FILE" 2>/dev/null || true

POD="${POD_NAME:-${HOSTNAME:-}}"
ORDINAL="${POD##*-}"
case "$ORDINAL" in
  ''|*[!0-9]*) log "ERROR: cannot derive the StatefulSet ordinal from pod name '$POD'"; exit 1 ;;
esac

# --- 1. memlock ---------------------------------------------------------------------------------
case "${ML_DEV_MEMLOCK:-none}" in
  scc|privileged)
    if ulimit -l unlimited 2>/dev/null; then
      log "memlock: unlimited"
    else
      warn "could not raise memlock (now $(ulimit -l) KiB); RDMA may fail with IBV_WC_LOC_PROT_ERR." \
           "Check that the service account is bound to the SCC (security.memlock)."
    fi
    ;;
  *) log "memlock: $(ulimit -l) KiB (not raised: security.memlock.mode is none)" ;;
esac

# --- 2. persistent HOME -------------------------------------------------------------------------
setup_home() {  # setup_home DIR: create it (the first time: mode 700 and /etc/skel), succeed when writable
  local dir="$1"
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir" 2>/dev/null || return 1
    chmod 700 "$dir" 2>/dev/null || true
    if [ -d /etc/skel ]; then cp -Rn /etc/skel/. "$dir/" 2>/dev/null || true; fi
  fi
  [ -w "$dir" ]
}
WANT_HOME="${ML_DEV_HOME:-${HOME:-}}"
if [ -n "$WANT_HOME" ] && setup_home "$WANT_HOME"; then
  export HOME="$WANT_HOME"
else
  if [ -n "$WANT_HOME" ]; then
    warn "cannot create or write HOME $WANT_HOME (is the volume writable for UID $(id -u)?);" \
         "HOME is $STATE_DIR/home, which does not survive a restart"
  fi
  export HOME="$STATE_DIR/home"
  mkdir -p "$HOME" 2>/dev/null || warn "cannot create $HOME either"
fi
# The servers' caches and state follow HOME (explicitly: an image may point them elsewhere).
export XDG_CACHE_HOME="$HOME/.cache" XDG_CONFIG_HOME="$HOME/.config" XDG_DATA_HOME="$HOME/.local/share"
export PIP_CACHE_DIR="$HOME/.cache/pip" JUPYTER_CONFIG_DIR="$HOME/.jupyter" JUPYTER_DATA_DIR="$HOME/.local/share/jupyter"
export IPYTHONDIR="$HOME/.ipython" HISTFILE="$HOME/.bash_history"
export JUPYTER_RUNTIME_DIR="${JUPYTER_RUNTIME_DIR:-$STATE_DIR/jupyter-runtime}"  # sockets: not on NFS
case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) export PATH="$HOME/.local/bin:$PATH" ;; esac

# --- 3. RDMA devices (opt-in auto-detection), rank, hostfile, rank.env --------------------------
if [ "${ML_DEV_HCA_MODE:-explicit}" = "auto" ] && [ -z "${NCCL_IB_HCA:-}" ]; then
  # `ibv_devinfo -l` prints a "N HCAs found:" header and tab-indented names: keep only the names.
  detected="$(ibv_devinfo -l 2>/dev/null | grep -v 'HCAs found' | sed 's/^[[:space:]]*//;s/[[:space:]]*$//' | grep -v '^$' | sort | paste -sd, - || true)"
  if [ -n "$detected" ]; then
    export NCCL_IB_HCA="$detected"
    DETECTED_HCA="$detected"
    log "NCCL_IB_HCA auto-detected: $NCCL_IB_HCA"
  else
    warn "hcaMode auto found no RDMA devices; NCCL will choose"
  fi
fi

# Values from the environment, used where cluster.env lacks a key.
ENV_NNODES="${NNODES:-}" ENV_GPUS_PER_NODE="${GPUS_PER_NODE:-}" ENV_APP_NAME="${APP_NAME:-}"
ENV_HEADLESS_SERVICE="${HEADLESS_SERVICE:-}" ENV_POD_NAMESPACE="${POD_NAMESPACE:-}" ENV_MASTER_PORT="${MASTER_PORT:-$CONTRACT_MASTER_PORT}"

read_cluster_env() {  # sets C_<KEY> from the environment, then cluster.env; fails (CLUSTER_PROBLEM) on a bad value
  local line key value
  C_NNODES="$ENV_NNODES" C_GPUS_PER_NODE="$ENV_GPUS_PER_NODE" C_APP_NAME="$ENV_APP_NAME"
  C_HEADLESS_SERVICE="$ENV_HEADLESS_SERVICE" C_POD_NAMESPACE="$ENV_POD_NAMESPACE" C_MASTER_PORT="$ENV_MASTER_PORT"
  if [ -r "$CLUSTER_FILE" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      key="${line%%=*}" value="${line#*=}"
      value="${value%\"}" value="${value#\"}"
      case "$key" in
        NNODES|GPUS_PER_NODE|APP_NAME|HEADLESS_SERVICE|POD_NAMESPACE|MASTER_PORT) printf -v "C_$key" '%s' "$value" ;;
      esac
    done < "$CLUSTER_FILE"
  fi
  for key in NNODES GPUS_PER_NODE MASTER_PORT; do
    value="C_$key"
    case "${!value}" in
      ''|*[!0-9]*|0) CLUSTER_PROBLEM="$key='${!value}' (from $CLUSTER_FILE or the environment) is not a positive integer"; return 1 ;;
    esac
  done
  for key in APP_NAME HEADLESS_SERVICE POD_NAMESPACE; do
    value="C_$key"
    case "${!value}" in
      ''|*[!a-z0-9.-]*) CLUSTER_PROBLEM="$key='${!value}' (from $CLUSTER_FILE or the environment) is not a DNS name"; return 1 ;;
    esac
  done
}

# The rank order, decided in this one place: RANK_PODS lists the pod names in rank order and
# NODE_RANK is this pod's index in it. Rank = StatefulSet ordinal, unless fabricCheck.nodeRacks is set:
# then ml_dev_rank_order (rank_order.sh, docs/operate/fabric-check.md) groups the pods by rack, pod 0 first.
FABRIC_DIR="$(dirname "${BASH_SOURCE[0]}")"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # logical: the mount path (the stop trap needs it early)
RACK_AWARE=""
if [ -r "$FABRIC_DIR/rank_order.sh" ] && [ -r "$FABRIC_DIR/$CONTRACT_FABRIC_SETTINGS_FILE" ] && command -v python3 >/dev/null 2>&1 \
  && python3 -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1])).get("nodeRacks"))' "$FABRIC_DIR/$CONTRACT_FABRIC_SETTINGS_FILE" 2>/dev/null; then
  # shellcheck source=rank_order.sh
  . "$FABRIC_DIR/rank_order.sh" && RACK_AWARE=1
fi
compute_rank() {
  local i
  RANK_PODS=()
  for ((i = 0; i < C_NNODES; i++)); do RANK_PODS+=("$C_APP_NAME-$i"); done
  if [ -n "$RACK_AWARE" ]; then read -r -a RANK_PODS <<<"$(ml_dev_rank_order "$C_POD_NAMESPACE" "${RANK_PODS[@]}")"; fi
  NODE_RANK=""
  for i in "${!RANK_PODS[@]}"; do
    if [ "${RANK_PODS[$i]}" = "$POD" ]; then NODE_RANK="$i"; fi
  done
  [ -n "$NODE_RANK" ]
}

q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }  # single-quote a value for sh

write_file() {  # write_file PATH CONTENT: atomically (temporary file in the same directory, then mv)
  local tmp
  mkdir -p "$(dirname "$1")" 2>/dev/null && tmp="$(mktemp "$1.XXXXXX" 2>/dev/null)" || return 1
  if printf '%s' "$2" > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$1"; then return 0; fi
  rm -f "$tmp"
  return 1
}

# under the environment's name (`<app>`, the pod's name without its ordinal): environments that mount one workspace
# claim each write their own
HOSTFILE="${DEEPSPEED_HOSTFILE:-$WORKSPACE/.deepspeed/${POD%-*}/hostfile}"
refresh_rank() {  # read cluster.env, write the hostfile and rank.env, export the values; fails with a warning
  local pod hosts=() pods=() lines="" master
  if ! read_cluster_env; then
    warn "$CLUSTER_PROBLEM; rank.env is not written until $CLUSTER_FILE is fixed"
    return 1
  fi
  if ! compute_rank; then
    warn "pod $POD is not one of the NNODES=$C_NNODES pods of $CLUSTER_FILE (a scale-down or scale-up in progress?);" \
         "rank.env is not written until it is"
    return 1
  fi
  for pod in "${RANK_PODS[@]}"; do
    pods+=("$pod")
    hosts+=("$pod.$C_HEADLESS_SERVICE.$C_POD_NAMESPACE.svc.cluster.local")
    lines+="${hosts[-1]} slots=$C_GPUS_PER_NODE"$'\n'
  done
  if ! write_file "$HOSTFILE" "$lines"; then
    if [ "$HOSTFILE" = "$STATE_DIR/hostfile" ] || ! write_file "$STATE_DIR/hostfile" "$lines"; then
      warn "cannot write $HOSTFILE"
      return 1
    fi
    # an unwritable workspace must not crash-loop the pod; the hostfile goes to the state dir instead
    warn "cannot write $HOSTFILE (is the workspace writable?); using $STATE_DIR/hostfile"
    HOSTFILE="$STATE_DIR/hostfile"
  fi
  master="${hosts[0]}"
  local content
  content="$(
    printf '# ml-dev-env rank wiring, rewritten in place by the startup script when the node count changes.\n'
    printf 'export ML_DEV_POD=%s\n' "$(q "$POD")"
    printf 'export NODE_RANK=%s\n' "$(q "$NODE_RANK")"
    printf 'export NNODES=%s\n' "$(q "$C_NNODES")"
    printf 'export GPUS_PER_NODE=%s\n' "$(q "$C_GPUS_PER_NODE")"
    printf 'export WORLD_SIZE=%s\n' "$(q "$((C_NNODES * C_GPUS_PER_NODE))")"
    printf 'export MASTER_ADDR=%s\n' "$(q "$master")"
    printf 'export MASTER_PORT=%s\n' "$(q "$C_MASTER_PORT")"
    # torchrun reads PET_<FLAG> as the default of --<flag>: plain `torchrun train.py` works in every pod.
    printf 'export PET_NNODES=%s\n' "$(q "$C_NNODES")"
    printf 'export PET_NODE_RANK=%s\n' "$(q "$NODE_RANK")"
    printf 'export PET_NPROC_PER_NODE=%s\n' "$(q "$C_GPUS_PER_NODE")"
    printf 'export PET_MASTER_ADDR=%s\n' "$(q "$master")"
    printf 'export PET_MASTER_PORT=%s\n' "$(q "$C_MASTER_PORT")"
    printf 'export DEEPSPEED_HOSTFILE=%s\n' "$(q "$HOSTFILE")"
    printf 'export ML_DEV_HOSTS=%s\n' "$(q "${hosts[*]}")"
    printf 'export ML_DEV_PODS=%s\n' "$(q "${pods[*]}")"
    if [ -n "${DETECTED_HCA:-}" ]; then printf 'export NCCL_IB_HCA=%s\n' "$(q "$DETECTED_HCA")"; fi
  )"
  if ! write_file "$STATE_DIR/$CONTRACT_RANK_ENV_FILE" "$content"$'\n'; then
    warn "cannot write $STATE_DIR/$CONTRACT_RANK_ENV_FILE"
    return 1
  fi
  # shellcheck source=/dev/null
  . "$STATE_DIR/$CONTRACT_RANK_ENV_FILE"  # for the log lines below; the dev servers are started without these (see start)
  log "pod $POD: NODE_RANK=$NODE_RANK of NNODES=$NNODES, $GPUS_PER_NODE GPUs each, WORLD_SIZE=$WORLD_SIZE"
  log "master: $MASTER_ADDR:$MASTER_PORT; hostfile: $HOSTFILE; rank.env: $STATE_DIR/$CONTRACT_RANK_ENV_FILE"
}

LAST_CLUSTER="$(cat "$CLUSTER_FILE" 2>/dev/null || true)"
refresh_rank || true

# Shells: env.sh sources rank.env (so every new shell sees the current values) and sets the HOME caches.
if ! {
  printf '# ml-dev-env: written by the pod startup script; sourced by login and interactive shells.\n'
  printf 'if [ -r %s ]; then . %s; fi\n' "$(q "$STATE_DIR/$CONTRACT_RANK_ENV_FILE")" "$(q "$STATE_DIR/$CONTRACT_RANK_ENV_FILE")"
  for key in HOME XDG_CACHE_HOME XDG_CONFIG_HOME XDG_DATA_HOME PIP_CACHE_DIR JUPYTER_CONFIG_DIR JUPYTER_DATA_DIR IPYTHONDIR \
             JUPYTER_RUNTIME_DIR; do
    printf 'export %s=%s\n' "$key" "$(q "${!key}")"
  done
  # shellcheck disable=SC2016  # expanded by the sourcing shell
  printf 'case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) export PATH="$HOME/.local/bin:$PATH" ;; esac\n'
  # env.secrets' keys, read from the mount when the shell starts (a rotated Secret reaches the next terminal); the
  # mount path, never the resolved one (the kubelet's ..<timestamp> directory goes at the next ConfigMap update)
  # shellcheck disable=SC2016  # expanded by the sourcing shell
  printf 'if [ -r "${ML_DEV_DIR:-%s}/user-secrets.sh" ]; then . "${ML_DEV_DIR:-%s}/contract.env"; . "${ML_DEV_DIR:-%s}/user-secrets.sh"; fi\n' \
    "$SCRIPT_DIR" "$SCRIPT_DIR" "$SCRIPT_DIR"
  env | { grep -E '^(NCCL|TORCH_NCCL|UCX)_' || true; } | sort | while IFS='=' read -r key value; do printf 'export %s=%s\n' "$key" "$(q "$value")"; done
} 2>/dev/null > "$STATE_DIR/$CONTRACT_SHELL_ENV_FILE"; then
  warn "cannot write $STATE_DIR/$CONTRACT_SHELL_ENV_FILE; shells will not see rank.env"
fi
HOOK="if [ -r $(q "$STATE_DIR/$CONTRACT_SHELL_ENV_FILE") ]; then . $(q "$STATE_DIR/$CONTRACT_SHELL_ENV_FILE"); fi  # ml-dev-env: rank.env and HOME caches"
for rc in "$HOME/.bashrc" "$HOME/.profile" "$HOME/.bash_profile"; do
  # bash login shells read only the first of .bash_profile/.bash_login/.profile: hook an existing .bash_profile too
  if [ "$rc" = "$HOME/.bash_profile" ] && [ ! -e "$rc" ]; then continue; fi
  if grep -qxF "$HOOK" "$rc" 2>/dev/null; then continue; fi
  printf '%s\n' "$HOOK" >> "$rc" 2>/dev/null || warn "cannot add the rank.env line to $rc; in shells run: . $STATE_DIR/$CONTRACT_SHELL_ENV_FILE"
done

# Kernels: IPython runs the files of $IPYTHONDIR/profile_default/startup/ in every new kernel (also on a
# kernel restart). This one loads the current rank.env, so a kernel started after a count change sees it, and
# env.secrets' keys from the mount.
IPY_STARTUP="$IPYTHONDIR/profile_default/startup/00-ml-dev-env-rank.py"
IPY_CODE="$(cat <<'PY'
# ml-dev-env: written by the pod startup script at every pod start (edits are overwritten).
# Loads $ML_DEV_STATE_DIR/rank.env (`export KEY='value'` lines) into this kernel's environment: the Jupyter
# server is started without these values, so a kernel (re)started after a node-count change sees the new ones.
def _ml_dev_env_load_rank():
    import os
    import shlex

    path = os.path.join(os.environ.get("ML_DEV_STATE_DIR", "@CONTRACT_STATE_DIR@"), "@CONTRACT_RANK_ENV_FILE@")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            os.environ[key] = value


_ml_dev_env_load_rank()
del _ml_dev_env_load_rank


# env.secrets' keys from this pod's own mount (never the server's env, which has none): read when the kernel
# starts, so a rotated Secret reaches the next kernel. The startup ConfigMap's inpod/lib/usersecrets.py reads them
# (the same rules and refusal words as SSH sessions and ranks); the package leaves the kernel's modules again.
def _ml_dev_env_load_secrets():
    import os
    import sys

    mount = os.environ.get("ML_DEV_DIR", "/opt/ml-dev-env")
    sys.path.insert(0, mount)
    try:
        from inpod.lib import usersecrets

        values, refused = usersecrets.read_values()
    except Exception as exc:  # an older mount, an unreadable one: the kernel starts without them
        print("ml-dev-env: env.secrets not loaded: %s" % exc, file=sys.stderr)
        return
    finally:
        sys.path.remove(mount)
        for name in [m for m in sys.modules if m == "inpod" or m.startswith("inpod.")]:
            del sys.modules[name]
    os.environ.update(values)
    for line in refused:
        print(line, file=sys.stderr)


_ml_dev_env_load_secrets()
del _ml_dev_env_load_secrets


# `%%ranks`: a cell on every warm rank (`ml-dev ranks start`; inpod/ml_dev/notebook.py, imported at its first use)
def _ml_dev_env_ranks_magic():
    import os
    import sys

    try:
        ipython = get_ipython()  # noqa: F821 (IPython's, in a startup file)
    except NameError:
        return

    def ranks(line, cell):
        mount = os.environ.get("ML_DEV_DIR", "/opt/ml-dev-env")
        sys.path.insert(0, mount)
        try:
            from inpod.ml_dev import notebook
        finally:
            sys.path.remove(mount)
        return notebook.ranks_magic(line, cell)

    ipython.register_magic_function(ranks, "cell", "ranks")


_ml_dev_env_ranks_magic()
del _ml_dev_env_ranks_magic
PY
)"
IPY_CODE="${IPY_CODE//@CONTRACT_STATE_DIR@/$CONTRACT_STATE_DIR}"  # the contract's facts into the kernel's Python
IPY_CODE="${IPY_CODE//@CONTRACT_RANK_ENV_FILE@/$CONTRACT_RANK_ENV_FILE}"
write_file "$IPY_STARTUP" "$IPY_CODE"$'\n' || warn "cannot write $IPY_STARTUP; Jupyter kernels will not see rank.env (in a notebook: %env or os.environ)"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || warn "nvidia-smi failed"
fi

# --- 4. dev servers (pod 0 only: the dev Service selects the pod named <app>-0) ------------------
# Behind the OAuth proxy a server needs only loopback. In token mode the router dials the pod IP: the servers still
# listen on loopback, and forward.py listens on the pod IP bound to the interface that holds it (code-server and
# Jupyter cannot bind to an interface) and copies each connection there. Never a wildcard: nothing of ours answers
# on the SR-IOV interfaces (net1..N), which NetworkPolicy does not cover.
BIND=127.0.0.1 BIND_HOSTPORT=127.0.0.1
FORWARD=()
forward() {  # forward <port>: token mode, the pod IP's <port> to loopback's
  if [ "$AUTH" = "token" ] && [ -n "${POD_IP:-}" ]; then FORWARD+=("$(pod_ip_port "$1")"); fi
}
# the idle agent asks Jupyter whether it is in use where Jupyter listens
export ML_DEV_JUPYTER_URL="${ML_DEV_JUPYTER_URL:-http://$BIND_HOSTPORT:8888}"
PIDS=()
# The dev servers start WITHOUT the rank.env values in their environment: a server lives through count
# changes, and what it passes on (a Jupyter kernel inherits the server's environment, also after a kernel
# restart) would stay the count it started with. Kernels load the current rank.env at start (IPython startup
# file below); terminals are bash, which sources it through ~/.bashrc -> env.sh.
RANK_KEYS=(ML_DEV_POD NODE_RANK NNODES GPUS_PER_NODE WORLD_SIZE MASTER_ADDR MASTER_PORT PET_NNODES PET_NODE_RANK
           PET_NPROC_PER_NODE PET_MASTER_ADDR PET_MASTER_PORT DEEPSPEED_HOSTFILE ML_DEV_HOSTS ML_DEV_PODS)
UNSET_RANK=()
for key in "${RANK_KEYS[@]}"; do UNSET_RANK+=(-u "$key"); done
start() {  # start <name> <command...>
  local name="$1"; shift
  log "starting $name: $*"
  if [ -w "$STATE_DIR/$CONTRACT_STATE_LOGS_DIR" ]; then
    env "${UNSET_RANK[@]}" "$@" >"$STATE_DIR/$CONTRACT_STATE_LOGS_DIR/$name.log" 2>&1 &
  else
    env "${UNSET_RANK[@]}" "$@" 2>&1 &
  fi
  PIDS+=("$!")
}
SLEEP_PID=""
# A stop (idle stop, suspend, destroy, pod deletion) sends SIGTERM to PID 1, this script. It forwards the
# stop to the ranks of running `ml-dev run` jobs and waits up to lifecycle.checkpointGraceSeconds for them
# to save a checkpoint and exit (checkpoint_stop.sh, also the preStop hook), and only then stops the dev
# servers and sshd (a rank's SSH channel must outlive its checkpoint).
stop() {
  trap '' TERM INT
  log "stopping"
  bash "$SCRIPT_DIR/checkpoint_stop.sh" || true
  kill "${PIDS[@]}" $SLEEP_PID 2>/dev/null || true
  exit 0
}
trap stop TERM INT
# an early exit (a `${VAR:?}` below, set -e) must not leave the started children running
trap 'if [ "${#PIDS[@]}" -gt 0 ]; then kill "${PIDS[@]}" 2>/dev/null || true; fi' EXIT

# --- SSH fabric on every pod (dev loop: sshd.sh, next to this script in the startup ConfigMap) ----
# Supervised: restarted when it exits (back-off up to 60 s); exit 0 means the image has no sshd. The
# readiness probe (components/pod.py) fails while $STATE_DIR/ssh/wanted exists and sshd.pid names no live
# process: a pod whose image has sshd is not Ready without it.
supervise_sshd() {
  local delay=1 child="" code
  trap 'if [ -n "$child" ]; then kill "$child" 2>/dev/null; fi; exit 0' TERM INT
  while true; do
    bash "$SCRIPT_DIR/sshd.sh" &
    child=$!
    code=0
    wait "$child" || code=$?
    child=""
    if [ "$code" -eq 0 ]; then rm -f "$STATE_DIR/ssh/wanted"; return 0; fi
    log "sshd exited with status $code; restarting in $delay s"
    sleep "$delay"
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}
if [ -r "$SCRIPT_DIR/sshd.sh" ]; then
  if PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v sshd >/dev/null 2>&1; then
    { mkdir -p "$STATE_DIR/ssh" && : > "$STATE_DIR/ssh/wanted"; } 2>/dev/null || true
  fi
  log "starting sshd (supervised): bash $SCRIPT_DIR/sshd.sh"
  # without the rank values (sshd.sh snapshots its env as the sessions' container env)
  if [ -w "$STATE_DIR/$CONTRACT_STATE_LOGS_DIR" ]; then
    (unset "${RANK_KEYS[@]}"; supervise_sshd) >"$STATE_DIR/$CONTRACT_STATE_LOGS_DIR/sshd.log" 2>&1 &
  else
    (unset "${RANK_KEYS[@]}"; supervise_sshd) 2>&1 &
  fi
  PIDS+=("$!")
fi

# --- idle agent (lifecycle; every pod reports its activity, pod 0 decides) ---------------------
# Started when its settings are mounted (/etc/ml-dev-env/lifecycle/idle.json, updated in place; the agent
# only reports while idleStop is off). It ships next to this script in the startup ConfigMap. Started
# before the fabric hold: idle stop must work whatever the hold does (it may wait without end).
export ML_DEV_IDLE_SETTINGS="${ML_DEV_IDLE_SETTINGS:-$CONTRACT_IDLE_SETTINGS}"
if [ -f "$ML_DEV_IDLE_SETTINGS" ] && [ -f "$SCRIPT_DIR/idle_agent.py" ] && command -v python3 >/dev/null 2>&1; then
  start idle-agent python3 "$SCRIPT_DIR/idle_agent.py" run
  # interactive shells print the pending idle-stop warning at each prompt
  if ! grep -qs 'idle-warning.sh' "$HOME/.bashrc"; then
    printf '[ -r %s ] && . %s  # ml-dev-env: idle-stop warning\n' "$(q "$SCRIPT_DIR/idle-warning.sh")" "$(q "$SCRIPT_DIR/idle-warning.sh")" \
      >> "$HOME/.bashrc" 2>/dev/null || warn "cannot add the idle-warning line to $HOME/.bashrc"
  fi
fi

# --- the OAuth proxies' pod-IP side (every pod: each has the proxy sidecars, whose readiness probes dial the pod IP) --
# The proxies listen on 127.0.0.1:<port> (components/pod.py proxy_containers): a Go listener binds an address, not an
# interface, so on the pod IP it would also answer a peer that routes the pod IP via an SR-IOV interface (net1..N).
# forward.py owns <pod IP>:<port>, bound to the interface that holds the pod IP, and copies each connection to the
# proxy. No such interface: it refuses to start, naming the address; the line goes to the pod log too, and the
# proxies' readiness probes keep the pod unready.
start_forward() {  # start_forward <name> <host:port>...: forward.py; an ERROR in the pod log when it does not listen
  local name="$1" out="$STATE_DIR/$CONTRACT_STATE_LOGS_DIR/$1.log" i
  shift
  start "$name" python3 "$SCRIPT_DIR/forward.py" "$@"
  [ -w "$STATE_DIR/$CONTRACT_STATE_LOGS_DIR" ] || return 0  # its output is the pod log already
  for ((i = 0; i < 100; i++)); do
    if [ "$(grep -c '^forward: .* -> ' "$out" 2>/dev/null)" -ge "$#" ]; then return 0; fi
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      log "ERROR: $name did not start: $(tail -n 1 "$out" 2>/dev/null) (nothing answers on the pod IP's ports $*)"
      return 1
    fi
    sleep 0.1
  done
  warn "$name: not listening after 10 s (see $out)"
}
pod_ip_port() { if [[ "$POD_IP" == *:* ]]; then printf '[%s]:%s' "$POD_IP" "$1"; else printf '%s:%s' "$POD_IP" "$1"; fi; }
if [ "$AUTH" = "oauth-proxy" ] && [ -n "${ML_DEV_PROXY_PORTS:-}" ]; then
  if [ -z "${POD_IP:-}" ]; then
    log "ERROR: no POD_IP in the environment: the OAuth proxies' ports ($ML_DEV_PROXY_PORTS) answer nowhere"
  else
    proxy_items=()
    for port in $ML_DEV_PROXY_PORTS; do proxy_items+=("$(pod_ip_port "$port")"); done
    start_forward proxy-forward "${proxy_items[@]}" || true
  fi
fi

# --- fabric check hold (fabricCheck.onDeploy; docs/operate/fabric-check.md) ----------------------------
# Pod 0 only. `fabric_check.py hold` returns at once unless fabric.json has onDeploy; then it retries
# preflight + gate until they pass or onDeployTimeoutSeconds, and keeps holding until a passing
# `fabric_check.py gate` or `fabric_check.py release`. Dev servers and readiness wait for it.
# (It reaches the pods over the SSH fabric, so it comes after sshd starts.)
if [ "$ORDINAL" -eq 0 ] && [ -r "$FABRIC_DIR/fabric_check.py" ] && command -v python3 >/dev/null 2>&1; then
  python3 "$FABRIC_DIR/fabric_check.py" hold &
  FABRIC_PID=$!
  trap 'kill "$FABRIC_PID" 2>/dev/null; stop' TERM INT
  wait "$FABRIC_PID" || warn "the fabric check hold failed (exit $?); starting the dev servers"
  trap stop TERM INT
fi

if [ "$ORDINAL" -eq 0 ]; then
  for server in $SERVERS; do
    case "$server" in
      vscode)
        dirs=(--user-data-dir "$XDG_DATA_HOME/code-server" --extensions-dir "$XDG_DATA_HOME/code-server/extensions")
        if [ "$AUTH" = "token" ]; then
          : "${PASSWORD:?token mode needs PASSWORD for code-server}"
          start vscode code-server --bind-addr "$BIND_HOSTPORT:8080" --auth password --disable-telemetry "${dirs[@]}" "$WORKSPACE"
          forward 8080
        else
          # Only reachable through the OAuth proxy sidecar on this pod's loopback.
          start vscode code-server --bind-addr "$BIND_HOSTPORT:8080" --auth none --disable-telemetry "${dirs[@]}" "$WORKSPACE"
        fi
        ;;
      jupyter)
        # With the idle stop on, a kernel idle for lifecycle.idleTimeout is culled, an open tab's too: a forgotten
        # notebook frees its GPU memory while others keep the environment up (jupyter_server
        # services/kernels/kernelmanager.py MappingKernelManager: cull_idle_timeout, default 0 = never;
        # cull_connected, default False; a busy kernel is never culled, cull_busy False)
        cull=()
        if [ -f "$ML_DEV_IDLE_SETTINGS" ] && idle_timeout="$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print(int(s["idleTimeoutSeconds"]) if s.get("enabled") else "")' "$ML_DEV_IDLE_SETTINGS" 2>/dev/null)" && [ -n "$idle_timeout" ]; then
          cull=(--MappingKernelManager.cull_idle_timeout="$idle_timeout" --MappingKernelManager.cull_connected=True
            --MappingKernelManager.cull_interval="${ML_DEV_JUPYTER_CULL_INTERVAL:-60}")
        fi
        if [ "$AUTH" = "token" ]; then
          : "${JUPYTER_TOKEN:?token mode needs JUPYTER_TOKEN}"
          # allow_remote_access: the router's Host header, through forward.py (jupyter_server serverapp.py
          # ServerApp.allow_remote_access: a loopback-bound server refuses other Host names without it)
          start jupyter jupyter lab --no-browser --allow-root --ip="$BIND" --port=8888 --ServerApp.root_dir="$WORKSPACE" \
            --IdentityProvider.token="$JUPYTER_TOKEN" --ServerApp.allow_remote_access=True ${cull[@]+"${cull[@]}"}
          forward 8888
        else
          # --allow-root: RDMA pods run as UID 0 (SCC capabilities only apply to root)
          start jupyter jupyter lab --no-browser --allow-root --ip="$BIND" --port=8888 --ServerApp.root_dir="$WORKSPACE" \
            --IdentityProvider.token= --ServerApp.allow_remote_access=True --ServerApp.trust_xheaders=True ${cull[@]+"${cull[@]}"}
        fi
        ;;
      tensorboard)
        logdir="${TENSORBOARD_LOGDIR:-$WORKSPACE/tensorboard}"
        if ! mkdir -p "$logdir" 2>/dev/null; then
          warn "cannot create $logdir (is the workspace writable?); TensorBoard shows runs once it exists"
        fi
        start tensorboard tensorboard --logdir "$logdir" --host "$BIND" --port 6006
        forward 6006
        ;;
      home)
        # the environment's home page (home_page.py, next to this script); behind its OAuth proxy. It binds
        # $POD_IP and 127.0.0.1, never a wildcard.
        home_listen=127.0.0.1:8090
        if [ -n "${POD_IP:-}" ]; then
          if [[ "$POD_IP" == *:* ]]; then home_listen="[$POD_IP]:8090,$home_listen"; else home_listen="$POD_IP:8090,$home_listen"; fi
        fi
        if command -v python3 >/dev/null 2>&1; then
          start home python3 "$(dirname "${BASH_SOURCE[0]}")/home_page.py" serve --listen "$home_listen"
        else
          warn "no python3 in the image: no home page"
        fi
        ;;
      *) warn "unknown dev server '$server' ignored" ;;
    esac
  done
  if [ "${#FORWARD[@]}" -gt 0 ]; then
    start_forward forward "${FORWARD[@]}" || true
  fi
else
  log "worker pod: no dev servers (they run on the pod named ${C_APP_NAME:-${APP_NAME:-<app>}}-0)"
fi

# --- 5. ready, then follow the cluster ConfigMap -------------------------------------------------
log "ready"  # before the ready file: whoever sees the file also finds this line in the log
touch "$STATE_DIR/$CONTRACT_READY_FILE" 2>/dev/null || warn "cannot create $STATE_DIR/$CONTRACT_READY_FILE"
while true; do
  sleep "$POLL" &
  SLEEP_PID=$!
  wait "$SLEEP_PID" || true
  # The kubelet replaces the mounted file atomically (within its sync period, about a minute).
  current="$(cat "$CLUSTER_FILE" 2>/dev/null || true)"
  if [ "$current" != "$LAST_CLUSTER" ]; then
    LAST_CLUSTER="$current"
    log "$CLUSTER_FILE changed: rewriting rank.env and the hostfile (running processes keep their values)"
    refresh_rank || true
  elif [ -n "$RACK_AWARE" ] && [ "$SECONDS" -ge "${RACK_DUE:-0}" ]; then
    RACK_DUE=$((SECONDS + RACK_POLL))
    if [ "$( (compute_rank && printf '%s' "${RANK_PODS[*]}") 2>/dev/null)" != "${RANK_PODS[*]:-}" ]; then
      log "pod placement changed the rack-aware rank order: rewriting rank.env and the hostfile"
      refresh_rank || true
    fi
  fi
done
