#!/bin/bash
# ml-dev-env SSH fabric: one unprivileged OpenSSH sshd per pod, on a fixed non-root port.
#
# Started by the startup script (mounted from the <app>-startup ConfigMap next to it); runs sshd in
# the foreground (`exec`), so the startup script stops it with the other servers.
#
# Inputs (files): the <app>-ssh Secret at $ML_DEV_SSH_SECRET_DIR (default /etc/ml-dev-env/ssh):
#   host_ed25519_key[.pub]  the stack's host key (one per stack, stable across restarts)
#   id_ed25519[.pub]        the stack's client key (pod-to-pod: launcher, pdsh, DeepSpeed, MPI)
#   authorized_keys         the stack key + the users' keys from `ml-dev-env:ssh.authorizedKeys`
# Inputs (the contract of inpod/contract.py): the rendered container env (ML_DEV_STATE_DIR, ML_DEV_CLUSTER_DIR);
#   APP_NAME HEADLESS_SERVICE POD_NAMESPACE from $ML_DEV_CLUSTER_DIR/cluster.env; ML_DEV_SSH_PORT (2222) and
#   ML_DEV_SSH_USER (login name of a UID without a passwd entry; ml-dev) from devloop.env next to this script.
#   A variable of the same name in the environment is the fallback where a file lacks the key.
#   ML_DEV_SSH_LISTEN (listen addresses, space-separated) from the environment only; default $POD_IP and
#   127.0.0.1, never a wildcard: nothing answers on the SR-IOV interfaces net1..N, which NetworkPolicy does
#   not cover. A non-loopback address is also bound to the interface that holds it (`ip -o addr`; the runtime
#   calls the pod network's eth0, cri-o/ocicni pkg/ocicni/types.go DefaultInterfaceName, but a CNI may name it
#   otherwise; no interface holds it: sshd does not start, saying so), so a peer on net1..N that
#   routes the pod IP via net1 is refused too (Linux accepts a packet for any local address on any
#   interface, net/ipv4/route.c ip_route_input_slow RTN_LOCAL): OpenSSH's `ListenAddress ... rdomain`
#   is SO_BINDTODEVICE on Linux (openssh-portable openbsd-compat/port-net.c sys_set_rdomain), which an
#   unprivileged process may set since Linux 5.7 (net/core/sock.c sock_bindtoindex_locked).
#
# Outputs under $ML_DEV_STATE_DIR/ssh (mode 0700, owned by the pod's UID):
#   sshd_config, host key copy, client key copy, client.conf (Port/IdentityFile/known_hosts for the
#   stack's pods; `Include`d from ~/.ssh/config), known_hosts, session.env (the container env that
#   SSH sessions get, like `oc exec`), nss.env (only when nss_wrapper provides the passwd entry).
# Live SSH sessions: one file per session in $ML_DEV_STATE_DIR/ssh-sessions/<pid> (see ssh-session.sh).
#
# Login user: the pod's UID. RDMA pods of an SCC run as UID 0: root may log in with a key only
# (PermitRootLogin prohibit-password). TCP pods run as OpenShift's arbitrary UID with GID 0, which has
# no passwd entry in most images: this script adds one (`ml-dev`), in /etc/passwd when the image made
# it group-writable (the stack's base image does), else through nss_wrapper (LD_PRELOAD) when the
# image has libnss_wrapper.
#
# StrictModes stays on. sshd (misc.c safe_path) refuses authorized_keys when the file or any directory
# from it up to the login user's home directory is group- or world-writable or owned by someone else.
# OpenShift's layout makes image directories root-owned and group-writable (GID 0, g=u), so the keys
# never live there: the login user's home is a directory this UID owns (its HOME when it owns it,
# else $ML_DEV_STATE_DIR/home), this script removes group/world write from it, and writes
# <home>/.ssh (0700) and <home>/.ssh/ml-dev-env_authorized_keys (0600) itself from the read-only Secret.
set -euo pipefail

log() { printf '[ml-dev-env sshd] %s\n' "$*"; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # logical: the mount path, not the kubelet's ..data target
# shellcheck source=contract.env
. "$(dirname "${BASH_SOURCE[0]}")/contract.env"  # the facts of inpod/contract.py (CONTRACT_*), shipped beside this file
CLUSTER_FILE="${ML_DEV_CLUSTER_DIR:-$CONTRACT_CLUSTER_MOUNT}/$CONTRACT_CLUSTER_ENV_FILE"
fact() {  # fact KEY FILE: KEY's value in a KEY=value file, else $KEY from the environment, else empty
  local key="$1" line value="${!1:-}"
  if [ -r "$2" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in "$key="*) value="${line#*=}" ;; esac
    done < "$2"
  fi
  value="${value%\"}" value="${value#\"}" value="${value%\'}" value="${value#\'}"
  printf '%s' "$value"
}
STATE_DIR="${ML_DEV_STATE_DIR:-$CONTRACT_STATE_DIR}"
SECRET_DIR="${ML_DEV_SSH_SECRET_DIR:-$CONTRACT_SSH_SECRET_MOUNT}"
PORT="$(fact ML_DEV_SSH_PORT "$HERE/$CONTRACT_DEVLOOP_ENV_FILE")"
PORT="${PORT:-$CONTRACT_SSH_PORT}"
LISTEN="${ML_DEV_SSH_LISTEN:-${POD_IP:+$POD_IP }127.0.0.1}"
LOGIN="$(fact ML_DEV_SSH_USER "$HERE/$CONTRACT_DEVLOOP_ENV_FILE")"
LOGIN="${LOGIN:-ml-dev}"
D="$STATE_DIR/ssh"

SSHD="$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v sshd || true)"
if [ "${1:-}" = "--inetd" ]; then
  # Laptop access (`oc exec -i <pod> -- bash /opt/ml-dev-env/sshd.sh --inetd` as ssh's ProxyCommand): one
  # sshd for this connection on stdin/stdout, with the configuration the pod's sshd uses.
  if [ -r "$D/nss.env" ]; then
    # shellcheck disable=SC1091
    . "$D/nss.env"
  fi
  [ -r "$D/sshd_config" ] || { log "ERROR: $D/sshd_config is missing: has the pod's sshd started?" >&2; exit 1; }
  exec "$SSHD" -i -f "$D/sshd_config"
fi
# Exit codes: 0 = no sshd in this image (nothing to supervise); anything else = the startup script restarts it.
if [ -z "$SSHD" ]; then
  log "WARNING: no sshd in this image (install openssh-server): no SSH fabric on this pod"
  exit 0
fi
for f in host_ed25519_key id_ed25519 id_ed25519.pub authorized_keys; do
  if [ ! -r "$SECRET_DIR/$f" ]; then
    log "ERROR: cannot read $SECRET_DIR/$f as UID $(id -u) (groups $(id -G)): no SSH fabric on this pod (not Ready)"
    exit 3
  fi
done
APP="$(fact APP_NAME "$CLUSTER_FILE")" HEADLESS="$(fact HEADLESS_SERVICE "$CLUSTER_FILE")" NS="$(fact POD_NAMESPACE "$CLUSTER_FILE")"
for v in APP HEADLESS NS; do
  case "${!v}" in
    ''|*[!a-z0-9.-]*)
      log "ERROR: $CLUSTER_FILE has no valid APP_NAME, HEADLESS_SERVICE and POD_NAMESPACE (got '$APP' '$HEADLESS' '$NS'): no SSH fabric on this pod"
      exit 3 ;;
  esac
done
umask 077
mkdir -p "$D" "$STATE_DIR/$CONTRACT_SSH_SESSIONS_DIR"
chmod 0700 "$D"
chmod 1777 "$STATE_DIR/$CONTRACT_SSH_SESSIONS_DIR" 2>/dev/null || true
# Private keys must be owned by us with mode 0600 (sshd/ssh refuse others); Secret files are not.
install -m 0600 "$SECRET_DIR/host_ed25519_key" "$D/host_ed25519_key"
install -m 0600 "$SECRET_DIR/id_ed25519" "$D/id_ed25519"
install -m 0644 "$SECRET_DIR/id_ed25519.pub" "$D/id_ed25519.pub"

# --- a passwd entry for this UID ---------------------------------------------------------------
uid="$(id -u)"
gid="$(id -g)"
entry="$(getent passwd "$uid" || true)"
if [ -n "$entry" ]; then
  LOGIN="${entry%%:*}"
  PW_DIR="$(printf '%s' "$entry" | cut -d: -f6)"
else
  if [ -n "${HOME:-}" ] && [ -d "$HOME" ] && [ "$(stat -c %u "$HOME")" = "$uid" ]; then
    PW_DIR="$HOME"
  else
    PW_DIR="$STATE_DIR/home"
  fi
  line="$LOGIN:x:$uid:$gid:ml-dev-env user:$PW_DIR:/bin/bash"
  if [ -w /etc/passwd ]; then
    printf '%s\n' "$line" >> /etc/passwd
    log "passwd entry added to /etc/passwd: $LOGIN ($uid)"
  else
    wrapper=""
    for candidate in /usr/lib/*/libnss_wrapper.so /usr/lib64/libnss_wrapper.so /usr/lib/libnss_wrapper.so; do
      if [ -r "$candidate" ]; then wrapper="$candidate"; break; fi
    done
    if [ -z "$wrapper" ]; then
      log "WARNING: UID $uid has no passwd entry, /etc/passwd is read-only and libnss_wrapper is missing: sshd cannot log anyone in"
    else
      { cat /etc/passwd; printf '%s\n' "$line"; } > "$D/passwd"
      cat /etc/group > "$D/group"
      chmod 0644 "$D/passwd" "$D/group"
      printf 'export LD_PRELOAD=%q NSS_WRAPPER_PASSWD=%q NSS_WRAPPER_GROUP=%q\n' "$wrapper" "$D/passwd" "$D/group" > "$D/nss.env"
      chmod 0644 "$D/nss.env"
      # shellcheck disable=SC1091
      . "$D/nss.env"
      log "passwd entry through nss_wrapper: $LOGIN ($uid)"
    fi
  fi
fi

# --- authorized keys under a home directory that passes StrictModes ----------------------------
mkdir -p "$PW_DIR"
if [ "$(stat -c %u "$PW_DIR")" = "$uid" ]; then
  chmod go-w "$PW_DIR"
else
  log "WARNING: home $PW_DIR of $LOGIN is not owned by UID $uid: StrictModes may refuse its keys"
fi
mkdir -p "$PW_DIR/.ssh"
chmod 0700 "$PW_DIR/.ssh"
install -m 0600 "$SECRET_DIR/authorized_keys" "$PW_DIR/.ssh/ml-dev-env_authorized_keys"

# --- client side: every pod of the stack by short name and by cluster DNS name ----------------
# A pod's /etc/hosts holds only itself and cluster DNS answers `<pod>.<headless>` (the resolv.conf search
# path starts at <ns>.svc.cluster.local): the first block maps a short name to the pod's headless name, so
# `ssh <app>-1`, pdsh -w <app>-[0-1] and DeepSpeed's launcher reach it (ssh_config: first value wins).
hosts="$APP-* *.$HEADLESS.$NS.svc.cluster.local *.$HEADLESS"
known=""
for pattern in $hosts; do known="${known:+$known,}[$pattern]:$PORT"; done
printf '%s %s\n' "$known" "$(cut -d' ' -f1,2 "$SECRET_DIR/host_ed25519_key.pub")" > "$D/known_hosts"
cat > "$D/client.conf" <<CONF
# written by sshd.sh: the stack's pods (ml-dev-env SSH fabric)
Host $APP-* !*.*
    HostName %h.$HEADLESS.$NS.svc.cluster.local
Host $hosts
    Port $PORT
    IdentityFile $D/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $D/known_hosts
    StrictHostKeyChecking yes
    PasswordAuthentication no
    ServerAliveInterval 15
CONF
chmod 0644 "$D/client.conf" "$D/known_hosts"
include="Include $D/client.conf"
if [ ! -f "$PW_DIR/.ssh/config" ] || ! grep -qxF "$include" "$PW_DIR/.ssh/config"; then
  { printf '%s\n' "$include"; cat "$PW_DIR/.ssh/config" 2>/dev/null || true; } > "$PW_DIR/.ssh/config.new"
  chmod 0600 "$PW_DIR/.ssh/config.new"
  mv -f "$PW_DIR/.ssh/config.new" "$PW_DIR/.ssh/config"
fi

# --- the environment SSH sessions get (what `oc exec` would give: the container's env) ---------
export -p | grep -Ev '^declare -x (HOME|PWD|OLDPWD|SHLVL|_|TERM|USER|LOGNAME|SHELL|MAIL|SSH_[A-Z_]*|LD_PRELOAD|NSS_WRAPPER_[A-Z]*)=' \
  > "$STATE_DIR/$CONTRACT_SSH_SESSION_ENV_FILE" || true
chmod 0644 "$STATE_DIR/$CONTRACT_SSH_SESSION_ENV_FILE"

# --- sshd -------------------------------------------------------------------------------------
# sshd applies only its first SetEnv line: one line for everything
setenv=""
if [ -f "$D/nss.env" ]; then
  setenv="LD_PRELOAD=$LD_PRELOAD NSS_WRAPPER_PASSWD=$NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP=$NSS_WRAPPER_GROUP"
fi
if [ -n "${HOME:-}" ] && [ "$HOME" != "$PW_DIR" ] && [ -d "$HOME" ] && [[ "$HOME" != *[[:space:]]* ]]; then
  # sessions get the container's HOME (its dotfiles, like `oc exec`); the keys stay under $PW_DIR
  setenv="${setenv:+$setenv }HOME=$HOME"
fi
if [ "$uid" = 0 ]; then
  # Root's sshd chroots its pre-authentication child into /run/sshd (sshd-session.c/sshd-auth.c
  # privsep_preauth_child: always when UID 0); an unprivileged sshd does not. CRI-O's default
  # capabilities (internal/config/capabilities Default()) lack SYS_CHROOT, so UID-0 pods need it added.
  # It also demotes that child (setgroups, setresuid): SETGID and SETUID, which an SCC's requiredDropCapabilities
  # would remove (SCC admission adds them to the container's drop list).
  capeff="$(awk '/^CapEff:/ {print $2}' /proc/self/status)"
  if [ -n "$capeff" ] && (( ((16#$capeff >> 18) & 1) == 0 )); then
    log "ERROR: this pod runs as root without CAP_SYS_CHROOT, which root's sshd needs (privilege separation): add SYS_CHROOT" \
        "to ml-dev-env:security.memlock.capabilities (the SCC must allow it). No SSH fabric on this pod."
    exit 4
  fi
  if [ -n "$capeff" ] && (( ((16#$capeff >> 6) & 3) != 3 )); then
    log "ERROR: this pod runs as root without CAP_SETGID/CAP_SETUID, which root's sshd needs to demote its pre-auth child:" \
        "the SCC's requiredDropCapabilities must not list SETUID or SETGID (oc get scc <name> -o jsonpath='{.requiredDropCapabilities}')." \
        "No SSH fabric on this pod."
    exit 4
  fi
  mkdir -p /run/sshd && chmod 0755 /run/sshd
fi
sftp=""
for candidate in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/ssh/sftp-server; do
  if [ -x "$candidate" ]; then sftp="Subsystem sftp $candidate"; break; fi
done
holder() {  # the interface that holds address $1 (`ip -o addr`: "2: ens3    inet 10.128.0.10/23 ..."), never a name assumed
  ip -o addr show 2>/dev/null | awk -v a="$1" '{ split($4, p, "/"); if (p[1] == a) { print $2; exit } }'
}
LISTEN_LINES=""
for a in $LISTEN; do  # loopback: lo only by nature (a packet for 127/8 from outside is a martian); others: their interface
  case "$a" in
    127.*|::1|\[::1\]*) LISTEN_LINES+="ListenAddress $a"$'\n' ;;
    *)
      addr="${a#[}" addr="${addr%%]*}"
      iface="$(holder "$addr")"
      if [ -z "$iface" ]; then
        log "ERROR: no interface of this pod holds $addr (ML_DEV_SSH_LISTEN/POD_IP): sshd does not listen on an address it cannot bind to its interface"
        exit 1
      fi
      LISTEN_LINES+="ListenAddress $a rdomain ${iface%%@*}"$'\n' ;;
  esac
done
listen_lines() { printf '%s' "$LISTEN_LINES"; }
write_sshd_config() {
cat > "$D/sshd_config" <<CONF
# written by sshd.sh (ml-dev-env SSH fabric); unprivileged: no PAM, no privilege separation user
Port $PORT
$(listen_lines)
HostKey $D/host_ed25519_key
PidFile $D/sshd.pid
AuthorizedKeysFile .ssh/ml-dev-env_authorized_keys .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PermitEmptyPasswords no
StrictModes yes
UsePAM no
PermitUserEnvironment no
AcceptEnv ML_DEV_RUN
AllowUsers $LOGIN
X11Forwarding no
AllowTcpForwarding yes
PrintMotd no
MaxStartups 64:30:256
LogLevel INFO
ForceCommand /bin/bash $HERE/ssh-session.sh
${setenv:+SetEnv $setenv}
$sftp
CONF
chmod 0600 "$D/sshd_config"
}
write_sshd_config
if ! checked="$("$SSHD" -t -f "$D/sshd_config" 2>&1)"; then
  # a kernel before 5.7 refuses SO_BINDTODEVICE without CAP_NET_RAW; an sshd built without rdomain support
  log "ERROR: sshd refuses its config (ListenAddress ... rdomain <the interface that holds the address>): $checked"
  exit 1
fi
# Keys added to ml-dev-env:ssh.authorizedKeys reach the pods without a restart: kubelet updates the
# mounted Secret in place, this loop copies authorized_keys again when it changed (sshd reads the file
# at every login); a `cmp` every 5 s costs next to nothing. It stays a child of sshd (exec keeps the
# PID), so it ends with the pod.
REFRESH="${ML_DEV_SSH_REFRESH_SECONDS:-5}"
(
  while sleep "$REFRESH" && kill -0 $$ 2>/dev/null; do  # ends with sshd (a restarted sshd starts its own)
    if ! cmp -s "$SECRET_DIR/authorized_keys" "$PW_DIR/.ssh/ml-dev-env_authorized_keys"; then
      install -m 0600 "$SECRET_DIR/authorized_keys" "$PW_DIR/.ssh/ml-dev-env_authorized_keys.new" &&
        mv -f "$PW_DIR/.ssh/ml-dev-env_authorized_keys.new" "$PW_DIR/.ssh/ml-dev-env_authorized_keys" &&
        log "authorized_keys updated from $SECRET_DIR"
    fi
  done
) </dev/null &
# The start ledger's `sshd` phase (inpod/lib/ledger.py): sshd writes its PidFile once it listens (openssh-portable
# sshd.c main: server_listen() binds and listens on every ListenAddress, then "Write out the pid file after the sigterm
# handler is setup and the listen sockets are bound", then server_accept_loop; never under -d, and this is -D -e); the
# first sshd of this container records the time, once (noclobber)
(
  mkdir -p "$STATE_DIR/$CONTRACT_START_MARKS_DIR"
  for _ in $(seq 300); do
    if [ -s "$D/sshd.pid" ]; then
      (set -C; date +%s.%N >"$STATE_DIR/$CONTRACT_START_MARKS_DIR/$CONTRACT_START_SSHD") 2>/dev/null
      break
    fi
    sleep 0.1
  done
) </dev/null >/dev/null 2>&1 &
log "sshd for $LOGIN (UID $uid) on port $PORT${LISTEN:+ at $LISTEN}; home $PW_DIR"
exec "$SSHD" -D -e -f "$D/sshd_config"
