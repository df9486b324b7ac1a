# shellcheck shell=bash
# ml-dev-env idle-stop warning for interactive shells (sourced from ~/.bashrc; oc rsh, ssh, IDE terminals).
# The idle agent writes $ML_DEV_STATE_DIR/idle-warning while a stop is pending and removes it on activity.
# The contract's state directory and file name, read once here (in subshells: the shell gets no CONTRACT_* variables).
# shellcheck source=contract.env
__ml_dev_idle_dir="$(. "$(dirname "${BASH_SOURCE[0]}")/contract.env" && printf '%s' "$CONTRACT_STATE_DIR")"
# shellcheck source=contract.env
__ml_dev_idle_file="$(. "$(dirname "${BASH_SOURCE[0]}")/contract.env" && printf '%s' "$CONTRACT_IDLE_WARNING_FILE")"
__ml_dev_idle_warning() {
  local f="${ML_DEV_STATE_DIR:-$__ml_dev_idle_dir}/$__ml_dev_idle_file"
  [ -r "$f" ] && printf '\033[1;33m%s\033[0m\n' "$(cat "$f")" >&2
  return 0
}
case "$-" in
  *i*)
    case ";${PROMPT_COMMAND:-};" in
      *";__ml_dev_idle_warning;"*) ;;
      *) PROMPT_COMMAND="__ml_dev_idle_warning${PROMPT_COMMAND:+;$PROMPT_COMMAND}" ;;
    esac
    ;;
esac
