#!/usr/bin/env bash
# Compile the direct pins (*.in) into hash-locked requirement sets with uv.
#   tools/lock.sh           rewrite steps/requirements.txt (the tools image), requirements-dev.txt,
#                           requirements.txt, policy/requirements.txt, images/base-requirements-py*.txt
#   tools/lock.sh --check   fail (exit 1) when a lock is out of date with its .in file
# The tools image's lock (its Python is 3.11 too) comes first: the dev lock includes it through
# steps/requirements-test.txt, so the tests run the step programs on exactly those pins. The dev lock (what .venv gets) is next; the runtime lock (what `pulumi up` installs) and the
# policy pack's lock are resolved with it as a constraint, so every set pins the same versions.
# (In --check mode a stale dev lock fails first, so constraining by the committed one is exact.)
# The base image's lock is compiled once per Python its presets' base images run (images/presets.yaml
# `python`) for manylinux x86_64 (the hashes cover every file of each pinned release, aarch64 wheels too),
# with images/base-overrides.txt keeping the base-owned packages out.
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-.venv/bin/uv}"
compile() {  # compile <in> <out> [constraint]
  "$UV" pip compile --quiet --python-version 3.11 --generate-hashes --no-header --annotation-style line \
    "$1" ${3:+-c "$3"} -o "$2"
}
BASE_PYTHONS="$(.venv/bin/python -c 'from core.presets import base_lock_pythons; print(" ".join(base_lock_pythons()))')"
compile_base() {  # compile_base <python version> <out>
  "$UV" pip compile --quiet --python-version "$1" --python-platform x86_64-manylinux_2_28 --generate-hashes \
    --no-header --annotation-style line --override images/base-overrides.txt images/base-requirements.in -o "$2"
}
LOCKS="steps/requirements.txt requirements-dev.txt requirements.txt policy/requirements.txt"
for v in $BASE_PYTHONS; do LOCKS="$LOCKS images/base-requirements-py$v.txt"; done
check=false; [ "${1:-}" = "--check" ] && check=true
out=.
if $check; then
  out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT
  mkdir -p "$out/policy" "$out/steps" "$out/images"
  for f in $LOCKS; do cp "$f" "$out/$f"; done
fi
compile steps/requirements.in "$out/steps/requirements.txt"
compile requirements-dev.in "$out/requirements-dev.txt"
compile requirements.in "$out/requirements.txt" requirements-dev.txt
compile policy/requirements.in "$out/policy/requirements.txt" requirements-dev.txt
for v in $BASE_PYTHONS; do compile_base "$v" "$out/images/base-requirements-py$v.txt"; done
if $check; then
  for f in $LOCKS; do
    cmp -s "$out/$f" "$f" || { echo "$f is out of date with ${f%.txt}.in: run make lock"; exit 1; }
  done
fi
