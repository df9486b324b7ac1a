#!/bin/bash
# ml-dev-env SSH fabric: every SSH session runs through this script (sshd ForceCommand).
#
# 1. Activity record: $ML_DEV_STATE_DIR/ssh-sessions/<pid> exists while the session lives. The
#    session keeps this PID (`exec` below), so counting live sessions is: files whose PID is alive
#    and whose first line equals field 22 of /proc/<pid>/stat (its start time; a reused PID differs).
# 2. The container's environment (the pod env, like `oc exec`), the rank environment (rank.env) and the keys of
#    env.secrets from this pod's Secret mounts.
# 3. Runs the requested command (ssh host cmd, rsync, pdsh, sftp) or a login shell.
# The record's lines: start time, user, $SSH_CLIENT (address, port: one TCP connection), and $ML_DEV_RUN, the
# pid of the `ml-dev` launcher that opened the session (ml-dev's ssh sends it, `SendEnv`, and sshd.sh's `AcceptEnv` takes
# it; empty: a person's session; inpod/contract.py RUN_ENV). The home page counts people's connections, not ml-dev's.
OPENED_BY="${ML_DEV_RUN:-}"
unset ML_DEV_RUN
# shellcheck source=contract.env
. "$(dirname "${BASH_SOURCE[0]}")/contract.env"  # the facts of inpod/contract.py (CONTRACT_*), shipped beside this file
STATE_DIR="${ML_DEV_STATE_DIR:-$CONTRACT_STATE_DIR}"
if [ -r "$STATE_DIR/$CONTRACT_SSH_SESSION_ENV_FILE" ]; then
  # shellcheck disable=SC1090
  . "$STATE_DIR/$CONTRACT_SSH_SESSION_ENV_FILE"
fi
STATE_DIR="${ML_DEV_STATE_DIR:-$STATE_DIR}"
# the launcher (`ml-dev`) and its helpers, next to this script in the startup ConfigMap
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case ":$PATH:" in *":$HERE:"*) ;; *) export PATH="$PATH:$HERE" ;; esac
sessions="$STATE_DIR/$CONTRACT_SSH_SESSIONS_DIR"
if [ -d "$sessions" ]; then
  read -r -a stat < "/proc/$$/stat" || stat=()
  printf '%s\n%s\n%s\n%s\n' "${stat[21]:-}" "${USER:-}" "${SSH_CLIENT:-}" "$OPENED_BY" > "$sessions/$$" 2>/dev/null || true
fi
if [ -r "$STATE_DIR/$CONTRACT_RANK_ENV_FILE" ]; then
  # shellcheck disable=SC1090
  . "$STATE_DIR/$CONTRACT_RANK_ENV_FILE"
fi
# env.secrets: each listed key from this pod's own mount, for every connection (user-secrets.sh, next to this script).
# shellcheck source=user-secrets.sh
. "$HERE/user-secrets.sh"
cd "$HOME" 2>/dev/null || true
cmd="${SSH_ORIGINAL_COMMAND:-}"
case "$cmd" in
  # a login shell sources env.sh, and with it user-secrets.sh, again: it is told what this session already said
  "") if [ -n "${ML_DEV_SECRETS_TOLD:-}" ]; then export ML_DEV_SECRETS_TOLD; fi; exec -l "${SHELL:-/bin/bash}" ;;
  internal-sftp|sftp|*/sftp-server)
    for server in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/ssh/sftp-server; do
      if [ -x "$server" ]; then exec "$server"; fi
    done
    echo "no sftp-server in this image" >&2
    exit 1
    ;;
  *) exec "${SHELL:-/bin/bash}" -c "$cmd" ;;
esac
