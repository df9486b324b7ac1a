"""The shared leak scan: a secret value found nowhere it must not be (issue: Secrets reach every rank and nowhere else).

Every launch test can call it, so later features inherit it:

    from tests.podsim.leakscan import LeakScan, SSH_ARGV_PROGRAM
    sim = PodSim(result, image_programs=SSH_ARGV_PROGRAM, ...)   # every SSH client of the pods logs its argv
    with LeakScan(sim, [value]) as scan:                          # /proc/*/cmdline of every pod process, every 50 ms
        out = sim.exec(0, "ml-dev run -- ...")
        scan.text("run output", out.stdout + out.stderr)
    scan.pods_state()      # every file under each pod's state dir logs/, and the SSH connections' commands
    scan.render(result)    # the render's objects and outputs (mock engine), as `make render` writes them
    assert scan.hits == [] # each hit names where, never the value

A hit is `<where>: <what>` with the value replaced by `<VALUE>`: the scan's own messages leak nothing. Short-lived
processes are sampled, not traced: a process that lives less than the interval may be missed by the cmdline sampler,
which is why the SSH clients' argv is also recorded at exec (SSH_ARGV_PROGRAM) and every file is read whole.

Scenarios that start launches, agents and stops (their pods from a render listing `env.secrets`) add:

    with LeakScan(sim, [value], environ=True) as scan:  # also /proc/*/environ: only a rank's processes may hold it
        ...
    scan.pods_files()        # every file under each live pod's whole state dir (records, heartbeats, session.env, ...)
    scan.container_logs()    # each pod's container output (`oc logs`), which outlives the pod
    assert scan.hits == [] and len(scan.holders_on("job.py")) == len(sim.pods)   # it reached every rank, only ranks

A process may hold a value in its environment only where the value is read from the mount for it: below an SSH
session (inpod/sh/ssh-session.sh exports the listed keys for every connection), a rank agent (`ml-dev _rank` sets
them for its rank only, inpod/ml_dev/launch.py cmd_rank), a shell a person opens (an interactive or login shell:
`bash -i`, `bash -l`, `sh -i`, a login shell's `-bash`; env.sh sources inpod/sh/user-secrets.sh) or a Jupyter
kernel (its IPython start-up file loads them). Anything else holding it (PID 1 and the agents and servers
startup.sh starts, the JupyterLab server among them, the stop hook, a plain `oc exec -- cmd`, the launcher itself)
is a hit: that is where container env would put it.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inpod import contract

SSH_ARGV_LOG = "/run/podsim-image/ssh-argv.log"
SSH_ARGV_PROGRAM = {
    # ahead of /usr/bin on the image's PATH (Debian's default: /usr/local/bin first): every `ssh` a pod runs by name
    # (ml-dev, rsync -e, pdsh's ssh rcmd, mpirun's plm_rsh_agent) logs its argv, the remote command included
    "/usr/local/bin/ssh": (
        "#!/bin/sh\n"
        f"{{ for a in \"$@\"; do printf '%s\\037' \"$a\"; done; printf '\\n'; }} >> {SSH_ARGV_LOG} 2>/dev/null\n"
        'exec /usr/bin/ssh "$@"\n'
    )
}
"""`PodSim(image_programs=...)`: an `ssh` in the image that records the command of every SSH connection."""


def opened(argv: list[bytes]) -> bool:
    """A shell a person opens (interactive or login: its start files source env.sh) or a Jupyter kernel."""
    name = os.path.basename(argv[0]) if argv else b""
    if name.startswith(b"-"):
        return True  # a login shell (argv[0] `-bash`: login(1), sshd, `exec -l`)
    if name in (b"bash", b"sh", b"dash") and any(a[:1] == b"-" and a[1:2] != b"-" and (b"i" in a or b"l" in a) for a in argv[1:2]):
        return True
    return any(b"ipykernel_launcher" in a or a == b"ipykernel" for a in argv[1:4])


class LeakScan:
    """Where `needles` appear: the sampled /proc/*/cmdline of every process of every pod, and what is handed to it."""

    def __init__(self, sim: Any, needles: Sequence[str], interval: float = 0.05, environ: bool = False) -> None:
        self.sim, self.needles, self.interval = sim, [n for n in needles if n], interval
        assert self.needles and all(len(n) >= 8 for n in self.needles), "a needle short enough to occur by chance"
        self.hits: list[str] = []
        self.samples = 0
        self.processes_seen: set[tuple[int, str]] = set()
        # environ=True: each sample also reads the environment of every pod process (see the module docstring);
        # `holders`: (pod, cmdline) of the rank-side processes seen holding a value (the value reached them)
        self.environ = environ
        self.holders: set[tuple[str, str]] = set()
        self._rank_processes: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, daemon=True)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ the sampler

    def __enter__(self) -> LeakScan:
        self._namespaces = {os.readlink(f"/proc/{pod.pid}/ns/pid"): pod.name for pod in self.sim.pods if pod.pid}
        self._own_namespace = os.readlink("/proc/self/ns/pid")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """The sampler stops (before the files are read, or a leak is planted); again is harmless."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """One pass over /proc: the cmdline of every process in a pod's PID namespace (and its environ, `environ`)."""
        if self.environ:
            self._refresh_namespaces()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                namespace = os.readlink(f"/proc/{entry}/ns/pid")
                pod = self._namespaces.get(namespace)
                if pod is None:
                    continue
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = Path(f"/proc/{entry}/environ").read_bytes() if self.environ else b""
            except OSError:
                continue
            self.processes_seen.add((int(entry), pod))
            self._find(f"/proc/{entry}/cmdline on {pod}", cmdline)
            if environ and any(n.encode() in environ for n in self.needles):
                self._held(int(entry), namespace, pod, cmdline, environ)
        with self._lock:
            self.samples += 1

    def _refresh_namespaces(self) -> None:
        """Pods started again since (a restart, a rolling update) are sampled too: PID 1's namespace, by pod."""
        for pod in self.sim.pods:
            try:
                namespace = os.readlink(f"/proc/{pod.pid}/ns/pid") if pod.pid else ""
            except OSError:
                continue
            if namespace and namespace != self._own_namespace:
                self._namespaces.setdefault(namespace, pod.name)

    def _held(self, pid: int, namespace: str, pod: str, cmdline: str, environ: bytes) -> None:
        """A process of `pod` holds a value in its environment: a rank's (recorded in `holders`) or a hit."""
        rank_side = self._rank_side(pid, namespace, environ)
        if rank_side is None:  # it (or an ancestor) ended while we looked: the next sample decides
            return
        if rank_side:
            with self._lock:
                self.holders.add((pod, cmdline.strip()))
            return
        items = [item for item in environ.split(b"\0") if any(n.encode() in item for n in self.needles)]
        keys = ", ".join(sorted({item.split(b"=", 1)[0].decode(errors="replace") for item in items}))
        shown = cmdline.strip()
        for needle in self.needles:
            shown = shown.replace(needle, "<VALUE>")
        line = f"/proc/{pid}/environ on {pod}: {keys} holds the value in `{shown[:160]}`, which no SSH session or rank agent started"
        with self._lock:
            if line not in self.hits:
                self.hits.append(line)

    def _rank_side(self, pid: int, namespace: str, environ: bytes) -> bool | None:
        """Whether the process is a rank's: started by an SSH connection (sshd sets SSH_CONNECTION for every session,
        openssh-portable session.c do_setup_env; its descendants inherit it), itself or below a rank agent (`ml-dev
        _rank`) or an sshd, or seen so before (a rank's process re-parented to PID 1 while its pod stops stays one).
        None: it or an ancestor ended while we looked."""
        if (b"\0" + environ).find(b"\0SSH_CONNECTION=") >= 0:
            return True
        chain: list[tuple[int, str]] = []
        current, verdict = pid, False
        for _ in range(64):
            try:
                stat = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
                argv = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")
                comm = Path(f"/proc/{current}/comm").read_text().strip()
            except (OSError, IndexError):
                return None
            identity = (current, stat[19])  # the pid and its start time (stat field 22): a pid reused is another process
            if identity in self._rank_processes or b"_rank" in argv[1:4] or (current != pid and comm.startswith("sshd")) or opened(argv):
                verdict = True
                break
            chain.append(identity)
            parent = int(stat[1])
            try:
                if parent <= 0 or os.readlink(f"/proc/{parent}/ns/pid") != namespace:
                    break
            except OSError:
                return None
            current = parent
        if verdict:
            with self._lock:
                self._rank_processes.update(chain)
        return verdict

    # ------------------------------------------------------------------------------------------ what else is scanned

    def _find(self, where: str, text: str) -> None:
        for needle in self.needles:
            if needle in text:
                shown = text.replace(needle, "<VALUE>")
                at = shown.index("<VALUE>")
                with self._lock:
                    line = f"{where}: ...{shown[max(0, at - 80) : at + 40]}..."
                    if line not in self.hits:
                        self.hits.append(line)

    def text(self, where: str, text: str | bytes) -> None:
        self._find(where, text.decode(errors="replace") if isinstance(text, bytes) else text)

    def files(self, where: str, paths: Iterable[Path]) -> int:
        """Every file under `paths` (read whole); returns how many were read."""
        count = 0
        for root in paths:
            for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                count += 1
                self.text(f"{where} {path.name}", data)
        return count

    def pods_state(self) -> int:
        """Each pod's state dir `logs/` and the commands of the SSH connections its clients opened."""
        count = 0
        for pod in self.sim.pods:
            count += self.files(f"{pod.name} logs/", [pod.path(f"{contract.STATE_DIR}/logs")])
            log = pod.path(SSH_ARGV_LOG)
            if log.is_file():
                for line in log.read_text(errors="replace").splitlines():
                    self.text(f"SSH command from {pod.name}", line.replace("\037", " "))
                    count += 1
        return count

    def pods_files(self, inside: Sequence[str] = (contract.STATE_DIR,)) -> int:
        """Every file under `inside` (default: the whole state dir: logs/, heartbeats, status and stop records,
        rank.env, session.env) of each pod that still runs (a terminated pod's /tmp went with its container); returns
        how many were read."""
        count = 0
        own = os.readlink("/proc/self/ns/pid")
        for pod in self.sim.pods:
            try:
                if not pod.pid or os.readlink(f"/proc/{pod.pid}/ns/pid") == own:
                    continue
            except OSError:
                continue
            count += self.files(f"{pod.name}", [pod.path(path) for path in inside])
        return count

    def container_logs(self) -> int:
        """Each pod's container output (what `oc logs` shows: PID 1's stdout and stderr), which outlives the pod."""
        count = 0
        for pod in self.sim.pods:
            if pod.log.is_file():
                count += self.files(f"{pod.name} container log", [pod.log])
        return count

    def holders_on(self, program: str) -> set[str]:
        """The pods on which a rank-side process whose cmdline names `program` was seen holding a value."""
        return {pod for pod, cmdline in set(self.holders) if program in cmdline}  # a copy: the sampler adds meanwhile

    def render(self, result: Any, written: Path | None = None) -> None:
        """The program's objects and outputs (the mock engine's record), and `make render`'s files when given."""
        self.text("rendered objects", json.dumps([r.inputs for r in result.resources], default=str))
        self.text("stack outputs", json.dumps(getattr(result, "outputs", {}), default=str))
        if written is not None:
            self.files("render output", [written])

    def ssh_commands(self) -> list[str]:
        """The recorded SSH commands (argv joined), every pod."""
        out = []
        for pod in self.sim.pods:
            log = pod.path(SSH_ARGV_LOG)
            if log.is_file():
                out += [line.replace("\037", " ") for line in log.read_text(errors="replace").splitlines()]
        return out


def list_secret(objects: dict[str, Any], secret: str, key: str) -> None:
    """A stack's objects (render_stack's `mutate`) with `env.secrets` listing `secret`'s `key`, as a user lists a Secret
    they made with `oc create secret generic` (its value: PodSim(namespace_secrets=...), never the stack's config)."""
    env = dict(objects.get("env") or {})
    env["secrets"] = [*(env.get("secrets") or []), {"secret": secret, "keys": [key]}]
    objects["env"] = env


def new_value() -> str:
    """A random 32-character value, as the issue's measurements use."""
    return secrets.token_urlsafe(24)[:32]


def scan_texts(needles: Sequence[str], texts: Mapping[str, str]) -> list[str]:
    """The hits of `needles` in named texts (no pods)."""
    hits = []
    for where, text in texts.items():
        for needle in needles:
            if needle and needle in text:
                hits.append(f"{where}: contains the value")
    return hits
