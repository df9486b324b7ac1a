#!/usr/bin/env bash
# Install each base-image lock (images/base-requirements-py<python>.txt) for real, the way
# images/base.Containerfile does (--require-hashes --no-deps), into a fresh venv of that Python, then
# `pip check`: the only complaints allowed are the base-owned packages the lock leaves out on purpose
# (torch, numpy: images/base-overrides.txt), which the base image provides. Needs the index (PyPI) and
# a CPython of each version: `python<version>` on PATH, pyenv's, or PYTHON<version without dot>=/path.
# Prints the download/install time per lock. Not part of `make test` (about 300 MB per lock).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
find_python() {  # find_python 3.12
  local v="$1" var="PYTHON${1//./}" c
  for c in "${!var:-}" "$(command -v "python$v" || true)" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v"; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys' 2>/dev/null && { echo "$c"; return; }
  done
  echo "no CPython $v found: install one or set $var" >&2; return 1
}
status=0
for v in $(.venv/bin/python -c 'from core.presets import base_lock_pythons; print(" ".join(base_lock_pythons()))'); do
  py="$(find_python "$v")"
  lock="images/base-requirements-py$v.txt"
  "$py" -m venv "$work/py$v"
  start=$(date +%s.%N)
  PIP_CONFIG_FILE=/dev/null DS_BUILD_OPS=0 "$work/py$v/bin/python" -m pip install --quiet --no-cache-dir \
    --require-hashes --no-deps -r "$lock" > "$work/pip$v.log" 2>&1 || { cat "$work/pip$v.log"; exit 1; }
  took=$(echo "$(date +%s.%N) - $start" | bc)
  count=$(grep -c '^[A-Za-z0-9]' "$lock")
  unexpected="$("$work/py$v/bin/python" -m pip check 2>&1 | grep -v -E 'requires (torch|numpy), which is not installed\.$' | grep -v '^No broken requirements found' || true)"
  if [ -n "$unexpected" ]; then
    echo "$lock: FAILED on Python $("$py" -V 2>&1 | cut -d' ' -f2): pip check:"; echo "$unexpected"; status=1
  else
    printf '%s: %d packages installed with hashes on Python %s in %.0f s; pip check: only torch/numpy (base-owned) missing\n' \
      "$lock" "$count" "$("$py" -V 2>&1 | cut -d' ' -f2)" "$took"
  fi
done
exit $status
