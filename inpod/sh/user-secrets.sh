# shellcheck shell=sh
# ml-dev-env: env.secrets' keys from this pod's own Secret mounts, exported into the shell that sources this file
# (POSIX sh: bash, and dash for `oc rsh`'s $ENV). Sourced by ssh-session.sh (every SSH session: ml-dev's ranks,
# pdsh/DeepSpeed, mpirun's daemons, `ssh <pod> cmd`) and by $ML_DEV_STATE_DIR/env.sh (every interactive or login
# shell: JupyterLab and VS Code terminals, `oc exec ... bash -l`, `oc rsh`): each reads the mount when it starts, so
# a rotated Secret reaches the next session or terminal. The volumes hold only the listed keys. A value is in no argv
# and no file (`export` is a builtin; `cat` gets the path); trailing newlines go, as in inpod/lib/usersecrets.py.
# A value that cannot travel in an environment (longer than ML_DEV_SECRET_VALUE_MAX bytes, a NUL byte, not UTF-8;
# inpod/contract.py SECRET_VALUE_MAX) is left unset with one line on stderr, the words of inpod/lib/usersecrets.py
# refusal_line: the shell and every command in it still work.
# Its sourcer has sourced contract.env (the CONTRACT_* facts of inpod/contract.py) first: ssh-session.sh at its top,
# env.sh on the line before this file's (startup.sh). POSIX sh has no BASH_SOURCE to find this file's own folder.
# One refusal per shell: a login shell sources this file up to four times (/etc/profile.d, /etc/bash.bashrc, ~/.profile,
# ~/.bashrc each source env.sh) and an SSH login once more in ssh-session.sh before its `exec -l`. What was said is
# kept in ML_DEV_SECRETS_TOLD (names and reasons, never a value): ssh-session.sh exports it to the login shell it
# execs; here it becomes a plain shell variable (unset, then set: POSIX sh leaves it unexported), so no child of the
# shell inherits it and a new shell (`bash`, a rank) says it again.
_mde_told="${ML_DEV_SECRETS_TOLD-}"
unset ML_DEV_SECRETS_TOLD
_mde_dir="${ML_DEV_SECRETS_DIR:-$CONTRACT_SECRETS_MOUNT}"
_mde_max="${ML_DEV_SECRET_VALUE_MAX:-$CONTRACT_SECRET_VALUE_MAX}"
for _mde_f in "$_mde_dir"/*/*; do
  _mde_k="${_mde_f##*/}"
  # contract.ENV_NAME_PATTERN as globs: the classes unquoted, so that their ranges are ranges
  # shellcheck disable=SC2254
  case "$_mde_k" in [$CONTRACT_ENV_NAME_FIRST]*) ;; *) continue ;; esac
  # shellcheck disable=SC2254
  case "$_mde_k" in *[!$CONTRACT_ENV_NAME_REST]*) continue ;; esac
  if [ -f "$_mde_f" ] && [ -r "$_mde_f" ]; then
    _mde_size="$(wc -c < "$_mde_f" | tr -d ' ')" _mde_why=""
    if [ "$_mde_size" -gt "$_mde_max" ]; then
      _mde_why="is $_mde_size bytes"
    elif [ "$(LC_ALL=C tr -d '\000' < "$_mde_f" | wc -c | tr -d ' ')" -ne "$_mde_size" ]; then
      _mde_why="holds a NUL byte"
    elif ! iconv -f UTF-8 -t UTF-8 < "$_mde_f" > /dev/null 2>&1; then
      _mde_why="is not UTF-8 text"
    fi
    if [ -n "$_mde_why" ]; then
      _mde_s="${_mde_f%/*}"
      _mde_s="${_mde_s##*/}"
      case "$_mde_told" in
        *"<$_mde_s/$_mde_k $_mde_why>"*) ;;
        *)
          _mde_told="$_mde_told<$_mde_s/$_mde_k $_mde_why>"
          # shellcheck disable=SC2016  # the backquotes are text of the message
          printf 'Secret %s key %s %s: refused, the key is not set (env.secrets values are UTF-8 text without NUL bytes, at most %s bytes each); fix the value in the Secret (`oc edit secret %s`)\n' \
            "$_mde_s" "$_mde_k" "$_mde_why" "$_mde_max" "$_mde_s" >&2
          ;;
      esac
      continue
    fi
    export "$_mde_k=$(cat "$_mde_f")"
  fi
done
if [ -n "$_mde_told" ]; then ML_DEV_SECRETS_TOLD="$_mde_told"; fi
unset _mde_dir _mde_max _mde_f _mde_k _mde_size _mde_why _mde_s _mde_told
