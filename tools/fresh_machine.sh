#!/usr/bin/env bash
# The suite on a fresh Debian 12 as a new user meets it (not part of `make test`; needs root, debootstrap and the
# network: Debian's mirror and PyPI):
#   tools/fresh_machine.sh DIR build   debootstrap --variant=minbase bookworm into DIR (required + Essential
#                                      packages and apt only), then python3, make and git, and a clone of this
#                                      repository at DIR/work/ml-dev-env (../shared beside it when SHARED names one)
#   tools/fresh_machine.sh DIR root    `make test` there as root (proc, sys and dev mounted)
#   tools/fresh_machine.sh DIR user    `make test` as a user without sudo, from a mode-700 clone in their home
#   tools/fresh_machine.sh DIR all     the three in order (default)
#   tools/fresh_machine.sh DIR venv    only `make venv` as root (a quick check that the machine gets going)
# Each run's output goes to DIR/make-test-<who>.log; its last pytest lines are printed (the summaries to report).
# MIRROR (default http://deb.debian.org/debian) and SHARED (a shared/ tree to put beside the clone) are optional;
# CA_BUNDLE (a PEM file) is for a network whose proxy re-signs TLS: pip and git inside then trust it (PIP_CERT,
# SSL_CERT_FILE), nothing else of the machine changes. PYTEST_ARGS goes to both `make test` runs (e.g. --durations=30).
set -euo pipefail
usage() { echo "usage: $0 DIR [build|root|user|all|venv]" >&2; exit 2; }
[ $# -ge 1 ] || usage
DIR="$(realpath -m "$1")"
PHASE="${2:-all}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "error: $0 needs root (debootstrap, chroot, mounts)" >&2; exit 1; }

MOUNTED=()
mount_all() {
  # The root must be a mount point, as on a real machine: unshare --mount (the simulated pods) makes / private,
  # which a plain directory refuses ("cannot change root filesystem propagation").
  if ! mountpoint -q "$DIR"; then mount --bind "$DIR" "$DIR"; mount --make-private "$DIR"; MOUNTED=("$DIR"); fi
  for m in proc sys dev dev/pts dev/shm; do
    mkdir -p "$DIR/$m"
    mountpoint -q "$DIR/$m" && continue
    case "$m" in
      proc) mount -t proc proc "$DIR/proc" ;;
      sys) mount -t sysfs sys "$DIR/sys" ;;
      dev) mount --bind /dev "$DIR/dev" ;;
      dev/pts) mount --bind /dev/pts "$DIR/dev/pts" ;;
      dev/shm) mount -t tmpfs -o mode=1777 shm "$DIR/dev/shm" ;;  # as on a machine: chromium's shared memory as any user
    esac
    MOUNTED=("$DIR/$m" "${MOUNTED[@]}")
  done
  cp /etc/resolv.conf "$DIR/etc/resolv.conf"
}
unmount_all() {
  for m in "${MOUNTED[@]}"; do umount -l "$m" || true; done
}
trap unmount_all EXIT
CA_ENV=()
if [ -n "${CA_BUNDLE:-}" ]; then
  CA_ENV=(PIP_CERT=/etc/ml-dev-fresh-ca.pem SSL_CERT_FILE=/etc/ml-dev-fresh-ca.pem GIT_SSL_CAINFO=/etc/ml-dev-fresh-ca.pem)
fi
in_root() {
  [ -z "${CA_BUNDLE:-}" ] || [ ! -d "$DIR/etc" ] || cp "$CA_BUNDLE" "$DIR/etc/ml-dev-fresh-ca.pem"
  chroot "$DIR" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "${CA_ENV[@]}" "$@"
}

build() {
  command -v debootstrap >/dev/null || { echo "error: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  [ -e "$DIR/etc/debian_version" ] || debootstrap --variant=minbase bookworm "$DIR" "$MIRROR"
  mount_all
  in_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq --no-install-recommends python3 make git ca-certificates >/dev/null
  mkdir -p "$DIR/work" "$DIR/src"
  rm -rf "$DIR/work/ml-dev-env"
  git clone -q --no-hardlinks "$SRC" "$DIR/work/ml-dev-env"
  if [ -n "${SHARED:-}" ]; then rm -rf "$DIR/work/shared"; cp -a "$SHARED" "$DIR/work/shared"; fi
  echo "built: $(in_root python3 --version), $(in_root make --version | head -1), $(in_root git --version)"
  echo "not installed yet: $(for p in python3-venv iproute2 openmpi-bin; do in_root dpkg -s $p >/dev/null 2>&1 || printf '%s ' $p; done)"
}

summary() {  # the lines to report: pytest's result line and the missing-interpreter line
  grep -E "^(=+ )?[0-9]+ (passed|failed)|^CPython missing here|^make: \*\*\*|error:" "$1" | tail -5 || true
}

as_root() {
  mount_all
  local log="$DIR/make-test-root.log"
  echo "make test as root in /work/ml-dev-env (log: $log)"
  in_root env PYTEST_ARGS="${PYTEST_ARGS:-}" bash -c 'cd /work/ml-dev-env && make test' >"$log" 2>&1 && rc=0 || rc=$?
  echo "exit status $rc"; summary "$log"
  return "$rc"
}

as_user() {
  mount_all
  local log="$DIR/make-test-user.log"
  in_root id tester >/dev/null 2>&1 || in_root useradd -m -s /bin/bash tester
  in_root bash -c 'command -v sudo' >/dev/null && { echo "error: sudo is installed in $DIR: the user run must have none" >&2; exit 1; }
  rm -rf "$DIR/home/tester/ml-dev-env"
  git clone -q --no-hardlinks "$DIR/work/ml-dev-env" "$DIR/home/tester/ml-dev-env"
  in_root chown -R tester: /home/tester/ml-dev-env
  chmod 700 "$DIR/home/tester/ml-dev-env"
  if [ -d "$DIR/work/shared" ]; then rm -rf "$DIR/home/tester/shared"; cp -a "$DIR/work/shared" "$DIR/home/tester/shared"; in_root chown -R tester: /home/tester/shared; fi
  echo "make test as tester (no sudo) in a mode-700 clone (log: $log)"
  in_root runuser -u tester -- env PYTEST_ARGS="${PYTEST_ARGS:-}" bash -c 'cd ~/ml-dev-env && make test' >"$log" 2>&1 && rc=0 || rc=$?
  echo "exit status $rc"; summary "$log"
  return "$rc"
}

case "$PHASE" in
  build) build ;;
  root) as_root ;;
  user) as_user ;;
  all) build; as_root; as_user ;;
  venv) mount_all; in_root bash -c 'cd /work/ml-dev-env && make venv' ;;
  *) usage ;;
esac
