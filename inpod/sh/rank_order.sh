# shellcheck shell=bash
# Rack-aware rank order for the startup script's rank computation (docs/operate/fabric-check.md).
# Sourced from the startup ConfigMap directory (/opt/ml-dev-env), next to fabric_check.py and fabric.json.
#
#   ml_dev_rank_order NAMESPACE POD...   prints the pods (given in ordinal order) in rank order, space-separated.
#
# Without fabricCheck.nodeRacks, or when anything is missing (python3, the program, API access), it prints
# the pods unchanged: rank = ordinal. With nodeRacks, pod 0 stays rank 0 (MASTER_ADDR does not move) and
# the others follow rack by rack, read from the pods' spec.nodeName. The answer is only used when it is
# a permutation of the input.
# shellcheck source=contract.env
. "$(dirname "${BASH_SOURCE[0]}")/contract.env"  # the facts of inpod/contract.py (CONTRACT_*), shipped beside this file
ml_dev_rank_order() {
  local ns="$1"
  shift
  local here ordered
  here="$(dirname "${BASH_SOURCE[0]}")"
  local settings="$here/$CONTRACT_FABRIC_SETTINGS_FILE"
  # $ordered is split on purpose: one pod name per word, compared as a set with the input.
  # shellcheck disable=SC2086
  if [ -r "$here/fabric_check.py" ] && [ -r "$settings" ] && command -v python3 >/dev/null 2>&1 \
    && ordered="$(python3 "$here/fabric_check.py" --config "$settings" rank-order --pods "$*" --from-api --namespace "$ns")" \
    && [ "$(printf '%s\n' $ordered | sort | paste -sd' ' -)" = "$(printf '%s\n' "$@" | sort | paste -sd' ' -)" ]; then
    printf '%s\n' "$ordered"
  else
    printf '%s\n' "$*"
  fi
}
