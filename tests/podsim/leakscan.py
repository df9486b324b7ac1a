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
"""

from __future__ import annotations

import json
import os
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


class LeakScan:
    """Where `needles` appear: the sampled /proc/*/cmdline of every process of every pod, and what is handed to it."""

    def __init__(self, sim: Any, needles: Sequence[str], interval: float = 0.05) -> None:
        self.sim, self.needles, self.interval = sim, [n for n in needles if n], interval
        assert self.needles and all(len(n) >= 8 for n in self.needles), "a needle short enough to occur by chance"
        self.hits: list[str] = []
        self.samples = 0
        self.processes_seen: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, daemon=True)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ the sampler

    def __enter__(self) -> LeakScan:
        self._namespaces = {os.readlink(f"/proc/{pod.pid}/ns/pid"): pod.name for pod in self.sim.pods if pod.pid}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """One pass over /proc: the cmdline of every process in a pod's PID namespace."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                pod = self._namespaces.get(os.readlink(f"/proc/{entry}/ns/pid"))
                if pod is None:
                    continue
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            self.processes_seen.add((int(entry), pod))
            self._find(f"/proc/{entry}/cmdline on {pod}", cmdline)
        with self._lock:
            self.samples += 1

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


def scan_texts(needles: Sequence[str], texts: Mapping[str, str]) -> list[str]:
    """The hits of `needles` in named texts (no pods)."""
    hits = []
    for where, text in texts.items():
        for needle in needles:
            if needle and needle in text:
                hits.append(f"{where}: contains the value")
    return hits
