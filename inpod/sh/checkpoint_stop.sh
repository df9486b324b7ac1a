#!/bin/bash
# ml-dev-env checkpoint stop: run by the main container's preStop hook and by PID 1's stop trap (startup.sh).
#
# Every `ml-dev rank` agent running in this pod (one per rank of an `ml-dev run` job; its PID names its
# record $ML_DEV_STATE_DIR/heartbeat/rank-<pid>.json) gets SIGTERM; the agent sends
# $ML_DEV_CHECKPOINT_SIGNAL (default SIGTERM) to its rank's process group, so the job can save a
# checkpoint, and kills the group only after $ML_DEV_CHECKPOINT_GRACE_SECONDS. This script waits until
# every agent has exited or that grace has passed, then returns 0. A second run (the trap after the
# preStop hook) finds no live agent and returns at once. An agent still at its gate (heartbeat/gate-<pid>.json,
# the tree being copied) gets the same SIGTERM: it tells its launcher this pod is stopping and ends at once.
#
# The kubelet runs the preStop hook first and only then sends SIGTERM to PID 1, both within the pod's
# terminationGracePeriodSeconds (kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go,
# killContainer: `gracePeriod = gracePeriod - m.executePreStopHook(...)`, then StopContainer with the rest,
# at least minimumGracePeriodInSeconds = 2). The stack sets that period to the checkpoint grace plus a margin.
set -u
# shellcheck source=contract.env
. "$(dirname "${BASH_SOURCE[0]}")/contract.env"  # the facts of inpod/contract.py (CONTRACT_*), shipped beside this file
STATE_DIR="${ML_DEV_STATE_DIR:-$CONTRACT_STATE_DIR}"
GRACE="${ML_DEV_CHECKPOINT_GRACE_SECONDS:-$CONTRACT_GRACE_DEFAULT}"
case "$GRACE" in '' | *[!0-9]*) GRACE=$CONTRACT_GRACE_DEFAULT ;; esac
log() { printf '[ml-dev-env] %s\n' "$*"; }
running() { # running PID: alive and not a zombie (field 3 of /proc/PID/stat, after the command in parentheses)
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

# The marker tells `ml-dev status` that this pod is stopping (its ranks are saving).
date +%s >"$STATE_DIR/$CONTRACT_STOPPING_MARKER" 2>/dev/null || true
agents=()
# gate-<pid>.json: an agent still at its gate (the tree being copied): it names the stop to its launcher and ends
for record in "$STATE_DIR/$CONTRACT_HEARTBEAT_DIR"/rank-*.json "$STATE_DIR/$CONTRACT_HEARTBEAT_DIR/$CONTRACT_GATE_RECORD_PREFIX"*.json; do
  [ -e "$record" ] || continue
  pid="${record##*/rank-}"
  pid="${pid##*/"$CONTRACT_GATE_RECORD_PREFIX"}"
  pid="${pid%.json}"
  case "$pid" in '' | *[!0-9]*) continue ;; esac
  if running "$pid"; then agents+=("$pid"); fi
done
if [ "${#agents[@]}" -eq 0 ]; then exit 0; fi
log "stop: ${#agents[@]} rank(s) of ml-dev run get ${ML_DEV_CHECKPOINT_SIGNAL:-$CONTRACT_SIGNAL_DEFAULT} and up to ${GRACE}s to save a checkpoint"
kill -TERM "${agents[@]}" 2>/dev/null || true
deadline=$((SECONDS + GRACE + 1))
while [ "$SECONDS" -lt "$deadline" ]; do
  alive=()
  for pid in "${agents[@]}"; do
    if running "$pid"; then alive+=("$pid"); fi
  done
  if [ "${#alive[@]}" -eq 0 ]; then
    log "stop: every rank has exited"
    exit 0
  fi
  sleep 0.2
done
log "stop: rank agent(s) ${alive[*]} still running after ${GRACE}s; they kill their ranks now"
exit 0
