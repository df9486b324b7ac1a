#!/bin/bash
# ml-dev-env pod startup (mounted from the <app>-startup ConfigMap, run as the main container's command).
#
# 1. raises memlock when the stack grants it (never fatal: a refused `ulimit` only warns),
# 2. computes this pod's rank from its StatefulSet ordinal,
# 3. writes the DeepSpeed hostfile and an env file for shells (`oc rsh`, VSCode terminals),
# 4. starts the enabled dev servers on pod 0 only (workers start none),
# 5. marks the pod ready and waits until it is stopped.
#
# Inputs (container env, set by the GpuCluster component):
#   APP_NAME HEADLESS_SERVICE POD_NAMESPACE NNODES GPUS_PER_NODE MASTER_ADDR MASTER_PORT
#   ML_DEV_MEMLOCK=none|scc|privileged   ML_DEV_HCA_MODE=explicit|auto
#   ML_DEV_SERVERS="vscode jupyter tensorboard"   ML_DEV_AUTH=oauth-proxy|token
#   ML_DEV_WORKSPACE (/workspace)  ML_DEV_STATE_DIR (/tmp/ml-dev-env)  TENSORBOARD_LOGDIR
#   PASSWORD (code-server, token mode)  JUPYTER_TOKEN (token mode)
set -euo pipefail

log() { printf '[ml-dev-env] %s\n' "$*"; }

: "${APP_NAME:?APP_NAME is not set}"
: "${HEADLESS_SERVICE:?HEADLESS_SERVICE is not set}"
: "${POD_NAMESPACE:?POD_NAMESPACE is not set}"
: "${NNODES:?NNODES is not set}"
: "${GPUS_PER_NODE:?GPUS_PER_NODE is not set}"
WORKSPACE="${ML_DEV_WORKSPACE:-/workspace}"
STATE_DIR="${ML_DEV_STATE_DIR:-/tmp/ml-dev-env}"
SERVERS="${ML_DEV_SERVERS:-}"
AUTH="${ML_DEV_AUTH:-oauth-proxy}"
mkdir -p "$STATE_DIR/logs"
rm -f "$STATE_DIR/ready"
# OpenShift may run an arbitrary UID whose HOME is not writable: give the servers a home of their own.
if [ -z "${HOME:-}" ] || [ ! -w "${HOME}" ]; then
  export HOME="$STATE_DIR/home"
  mkdir -p "$HOME"
fi
export JUPYTER_RUNTIME_DIR="${JUPYTER_RUNTIME_DIR:-$STATE_DIR/jupyter-runtime}"

# --- 1. memlock ---------------------------------------------------------------------------------
case "${ML_DEV_MEMLOCK:-none}" in
  scc|privileged)
    if ulimit -l unlimited 2>/dev/null; then
      log "memlock: unlimited"
    else
      log "WARNING: could not raise memlock (now $(ulimit -l) KiB); RDMA may fail with IBV_WC_LOC_PROT_ERR." \
          "Check that the service account is bound to the SCC (security.memlock)."
    fi
    ;;
  *) log "memlock: $(ulimit -l) KiB (not raised: security.memlock.mode is none)" ;;
esac

# --- 2. rank ------------------------------------------------------------------------------------
POD="${POD_NAME:-${HOSTNAME:-}}"
ORDINAL="${POD##*-}"
case "$ORDINAL" in
  ''|*[!0-9]*) log "ERROR: cannot derive the StatefulSet ordinal from pod name '$POD'"; exit 1 ;;
esac
if [ -n "${NODE_RANK:-}" ] && [ "$NODE_RANK" != "$ORDINAL" ]; then
  log "WARNING: NODE_RANK=$NODE_RANK disagrees with the pod ordinal $ORDINAL; using $ORDINAL"
fi
NODE_RANK="$ORDINAL"
if [ "$NODE_RANK" -ge "$NNODES" ]; then
  log "ERROR: pod ordinal $NODE_RANK is outside NNODES=$NNODES"
  exit 1
fi
export NODE_RANK
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))
export WORLD_SIZE

# --- 3. RDMA devices (opt-in auto-detection), hostfile, env file -------------------------------
if [ "${ML_DEV_HCA_MODE:-explicit}" = "auto" ] && [ -z "${NCCL_IB_HCA:-}" ]; then
  # `ibv_devinfo -l` prints a "N HCAs found:" header and tab-indented names: keep only the names.
  detected="$(ibv_devinfo -l 2>/dev/null | grep -v 'HCAs found' | sed 's/^[[:space:]]*//;s/[[:space:]]*$//' | grep -v '^$' | sort | paste -sd, - || true)"
  if [ -n "$detected" ]; then
    export NCCL_IB_HCA="$detected"
    log "NCCL_IB_HCA auto-detected: $NCCL_IB_HCA"
  else
    log "WARNING: hcaMode auto found no RDMA devices; NCCL will choose"
  fi
fi

HOSTFILE="${DEEPSPEED_HOSTFILE:-$WORKSPACE/.deepspeed/hostfile}"
write_hostfile() {
  local tmp
  mkdir -p "$(dirname "$HOSTFILE")" && tmp="$(mktemp "$HOSTFILE.XXXXXX")" || return 1
  for ((i = 0; i < NNODES; i++)); do
    printf '%s-%d.%s.%s.svc.cluster.local slots=%d\n' "$APP_NAME" "$i" "$HEADLESS_SERVICE" "$POD_NAMESPACE" "$GPUS_PER_NODE"
  done > "$tmp" && mv -f "$tmp" "$HOSTFILE"
}
if ! write_hostfile 2>/dev/null; then
  # an unwritable workspace must not crash-loop the pod; the hostfile goes to the state dir instead
  log "WARNING: cannot write $HOSTFILE (is the workspace writable?); using $STATE_DIR/hostfile"
  HOSTFILE="$STATE_DIR/hostfile"
  write_hostfile
fi

{
  printf 'export NODE_RANK=%q NNODES=%q GPUS_PER_NODE=%q WORLD_SIZE=%q\n' "$NODE_RANK" "$NNODES" "$GPUS_PER_NODE" "$WORLD_SIZE"
  printf 'export MASTER_ADDR=%q MASTER_PORT=%q DEEPSPEED_HOSTFILE=%q\n' "${MASTER_ADDR:-}" "${MASTER_PORT:-29500}" "$HOSTFILE"
  env | { grep -E '^(NCCL|TORCH_NCCL|UCX)_' || true; } | sort | while IFS='=' read -r key value; do printf 'export %s=%q\n' "$key" "$value"; done
} > "$STATE_DIR/env.sh"

log "pod $POD: NODE_RANK=$NODE_RANK of NNODES=$NNODES, $GPUS_PER_NODE GPUs each, WORLD_SIZE=$WORLD_SIZE"
log "master: ${MASTER_ADDR:-?}:${MASTER_PORT:-29500}; hostfile: $HOSTFILE"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || log "WARNING: nvidia-smi failed"
fi

# --- fabric check hold (fabricCheck.onDeploy; README "Fabric check") ----------------------------
# Pod 0 only. `fabric_check.py hold` returns at once unless fabric.json has onDeploy; then it retries
# preflight + gate until they pass or onDeployTimeoutSeconds, and keeps holding until a passing
# `fabric_check.py gate` or `fabric_check.py release`. Dev servers and readiness wait for it.
FABRIC_CHECK="${BASH_SOURCE[0]%/*}/fabric_check.py"
if [ "$NODE_RANK" -eq 0 ] && [ -r "$FABRIC_CHECK" ] && command -v python3 >/dev/null 2>&1; then
  python3 "$FABRIC_CHECK" hold &
  FABRIC_PID=$!
  trap 'kill "$FABRIC_PID" 2>/dev/null; exit 0' TERM INT
  wait "$FABRIC_PID" || log "WARNING: the fabric check hold failed (exit $?); starting the dev servers"
  trap - TERM INT
fi

# --- 4. dev servers (pod 0 only) ----------------------------------------------------------------
if [ "$AUTH" = "token" ]; then BIND=0.0.0.0; else BIND=127.0.0.1; fi
PIDS=()
start() {  # start <name> <command...>
  local name="$1"; shift
  log "starting $name: $*"
  "$@" >"$STATE_DIR/logs/$name.log" 2>&1 &
  PIDS+=("$!")
}

if [ "$NODE_RANK" -eq 0 ]; then
  for server in $SERVERS; do
    case "$server" in
      vscode)
        if [ "$AUTH" = "token" ]; then
          : "${PASSWORD:?token mode needs PASSWORD for code-server}"
          start vscode code-server --bind-addr "$BIND:8080" --auth password --disable-telemetry "$WORKSPACE"
        else
          # Only reachable through the OAuth proxy sidecar on this pod's loopback.
          start vscode code-server --bind-addr "$BIND:8080" --auth none --disable-telemetry "$WORKSPACE"
        fi
        ;;
      jupyter)
        if [ "$AUTH" = "token" ]; then
          : "${JUPYTER_TOKEN:?token mode needs JUPYTER_TOKEN}"
          start jupyter jupyter lab --no-browser --allow-root --ip="$BIND" --port=8888 --ServerApp.root_dir="$WORKSPACE" \
            --IdentityProvider.token="$JUPYTER_TOKEN"
        else
          # --allow-root: RDMA pods run as UID 0 (SCC capabilities only apply to root)
          start jupyter jupyter lab --no-browser --allow-root --ip="$BIND" --port=8888 --ServerApp.root_dir="$WORKSPACE" \
            --IdentityProvider.token= --ServerApp.allow_remote_access=True --ServerApp.trust_xheaders=True
        fi
        ;;
      tensorboard)
        mkdir -p "${TENSORBOARD_LOGDIR:-$WORKSPACE/tensorboard}"
        start tensorboard tensorboard --logdir "${TENSORBOARD_LOGDIR:-$WORKSPACE/tensorboard}" --host "$BIND" --port 6006
        ;;
      *) log "WARNING: unknown dev server '$server' ignored" ;;
    esac
  done
else
  log "worker pod: no dev servers (they run on ${APP_NAME}-0)"
fi

# --- 5. ready, then wait ------------------------------------------------------------------------
SLEEP_PID=""
stop() {
  log "stopping"
  kill "${PIDS[@]}" $SLEEP_PID 2>/dev/null || true
  exit 0
}
trap stop TERM INT
touch "$STATE_DIR/ready"
log "ready"
while true; do
  sleep 3600 &
  SLEEP_PID=$!
  wait "$SLEEP_PID" || true
done
