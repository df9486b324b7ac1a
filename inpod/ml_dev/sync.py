"""ml-dev sync: the synced tree (git + .ml-devignore rules), its hash and cache, and the sync to every pod (`_apply` on the receiving pod).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.

Why one module: the tree's listing, its hash and its copy are one definition of `the synced tree`; the hash a pod
answers and the files the copy sends must come from the same rules.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .. import contract
from ..lib import usersecrets
from . import envgate, fanout
from .common import HERE, IGNORE_FILE, PY, STATE_DIR, SYNC_MANIFEST, Cluster, die, parallel, wait_reachable

# ------------------------------------------------------------------------------------------ tree


def git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, check=False)
    except FileNotFoundError:  # an image without git: plain directories
        return None


def tree_root(cwd: Path) -> Path:
    top = git("-C", str(cwd), "rev-parse", "--show-toplevel")
    path = top.stdout.decode().strip() if top and top.returncode == 0 else ""
    return Path(path) if path else cwd


def _ignore_patterns(root: Path, extra_files: list[str]) -> list[str]:
    patterns = [SYNC_MANIFEST, ".git/"]
    for name in extra_files:
        f = root / name
        if f.is_file():
            patterns += [ln.strip() for ln in f.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return patterns


def ignored(rel: str, patterns: list[str]) -> bool:
    """gitignore-style: `name` matches any path component, `a/b` and `/a` are anchored at the root,
    a trailing `/` matches directories only. (No `!` negation.)"""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # every directory above, then the file
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        body = pattern.rstrip("/")
        anchored = "/" in body
        body = body.lstrip("/")
        targets = prefixes[:-1] if dir_only else prefixes
        if any(fnmatch.fnmatchcase(t if anchored else t.rsplit("/", 1)[-1], body) for t in targets):
            return True
    return False


def tree_files(root: Path) -> list[str]:
    """Relative paths of the synced tree, sorted."""
    listed = git("-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed and listed.returncode == 0 and (root / ".git").exists():
        candidates = {p for p in listed.stdout.decode().split("\0") if p}
        patterns = _ignore_patterns(root, [IGNORE_FILE])
    else:
        candidates = set()
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                candidates.add(name if rel_dir == "." else f"{rel_dir}/{name}")
        patterns = _ignore_patterns(root, [IGNORE_FILE, ".gitignore"])
    out = []
    for rel in candidates:
        path = root / rel
        if not os.path.lexists(path) or ignored(rel, patterns):
            continue
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            out.append(rel)
    return sorted(out)


RACY_NS = 2_000_000_000


class HashCache:
    """sha256 per file keyed by (size, mtime_ns, inode): unchanged files are not read again.

    A file modified less than 2 s before it was hashed is hashed again next time (file timestamps are
    coarse: a same-size rewrite within one tick keeps size and mtime; git calls this "racy")."""

    def __init__(self, root: Path) -> None:
        key = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        self.path = STATE_DIR / "tree-cache" / f"{key}.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.new: dict[str, list[object]] = {}

    def digest(self, root: Path, rel: str) -> tuple[str, str]:
        path = root / rel
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return "120000", hashlib.sha256(os.readlink(path).encode()).hexdigest()
        mode = "100755" if st.st_mode & 0o111 else "100644"
        sig = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.data.get(rel)
        if cached and len(cached) == 5 and cached[:3] == sig and st.st_mtime_ns + RACY_NS < int(cached[4]):
            digest, hashed_at = str(cached[3]), int(cached[4])
        else:
            hashed_at = time.time_ns()
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            digest = h.hexdigest()
        self.new[rel] = [*sig, digest, hashed_at]
        return mode, digest

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}")
            tmp.write_text(json.dumps(self.new))
            tmp.replace(self.path)
        except OSError:
            pass


def tree_entries(root: Path, files: list[str]) -> dict[str, tuple[str, str, int]]:
    """{path: (mode, sha256, size)} of the listed files that exist (symlinks: sha256 of the target's name)."""
    cache = HashCache(root)
    out = {}
    for rel in sorted(files):
        if os.path.lexists(root / rel):
            mode, digest = cache.digest(root, rel)
            out[rel] = (mode, digest, os.lstat(root / rel).st_size)
    cache.save()
    return out


def tree_hash(root: Path, files: list[str], entries: dict[str, tuple[str, str, int]] | None = None) -> str:
    found = tree_entries(root, files) if entries is None else entries
    h = hashlib.sha256()
    for rel in sorted(files):
        if rel not in found:
            h.update(f"missing\0{rel}\n".encode())
            continue
        mode, digest, _ = found[rel]
        h.update(f"{mode} {digest} {rel}\n".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------- remote helpers


def apply_listing(root: Path, files: list[str]) -> str:
    """(on a receiving pod) delete what an earlier sync brought and is gone now, record the listing as the manifest;
    returns the tree hash."""
    manifest = root / SYNC_MANIFEST
    try:
        before = set(manifest.read_text().split("\0"))
    except OSError:
        before = set()
    for rel in sorted(before - set(files) - {""}):
        path = root / rel
        if ".." in Path(rel).parts or not os.path.lexists(path):
            continue
        if os.path.islink(path) or path.is_file():
            path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(f".{os.getpid()}")
    tmp.write_text("\0".join(files))
    tmp.replace(manifest)
    return tree_hash(root, files)


def listed_files(data: bytes) -> list[str]:
    return [p for p in data.decode().split("\0") if p]


def cmd_apply(args: argparse.Namespace) -> int:
    """(on a receiving pod) delete what an earlier sync brought and is gone now; print the tree hash."""
    print(apply_listing(Path(args.root), listed_files(sys.stdin.buffer.read())))
    return 0


def recorded_hash(root: Path) -> str:
    """The hash of the tree the last sync left at `root`: the files its manifest lists, hashed through the hash cache
    (a stat per file, no content read unless a file changed). Makes the root, where a copy lands."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        die(f"cannot make {root} here: {exc}", code=2)
    try:
        files = listed_files((root / SYNC_MANIFEST).read_bytes())
    except OSError:
        files = []
    return tree_hash(root, files)


def cmd_check(args: argparse.Namespace) -> int:
    """(on every other pod, one round trip: `ml-dev sync`) the hash of the tree the last sync left here."""
    print(recorded_hash(Path(args.root)))
    return 0


# ------------------------------------------------------------------------ the rank agent's gate (ml-dev run)

GATE_MARK = "ml-dev: GATE "
"""The rank agent's answer line (stdout) while it waits at the gate: JSON, `tree` (the hash of the tree it holds) and
`secrets` (env.secrets' keys present on its pod, {secret: {KEY: present}}, names only)."""


POD_STOP_MARK = "ml-dev: STOP: "
"""A rank agent's line (stderr) when its pod stops it; `ml-dev run` reads it and stops every other rank at once (at the
gate: no rank starts, and the launch is named a stop)."""


def watch_stop_at_gate(interval: float = 0.1) -> Callable[[], None]:
    """(the agent at its gate) Name a stop of this pod to the launcher while the tree is copied, so a drain during the
    copy reads as a stop, not as a copy that failed. The agent's gate record (heartbeat/gate-<pid>.json) has the stop
    hook (checkpoint_stop.sh) send it SIGTERM and wait for it, while the pod's sshd still carries the line; the
    `stopping` marker the hook writes first is watched too. Returns what ends the watch (the gate is over)."""
    import threading

    marker = STATE_DIR / contract.STOPPING_MARKER
    pod = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME", "?")
    said = f"{POD_STOP_MARK}pod {pod} is stopping (its stop hook ran during the tree copy); no rank started\n".encode()
    gate = threading.Lock()  # held by the gate; the watcher ends the agent only while it is
    done = threading.Event()

    def stop_here() -> None:
        try:
            os.write(2, said)
        except OSError:
            pass
        os._exit(0)

    def on_stop(_signum: int, _frame: object) -> None:
        stop_here()

    def watch() -> None:
        while not done.wait(interval):
            if not marker.exists():
                continue
            with gate:
                if not done.is_set():
                    stop_here()
                return

    record = STATE_DIR / contract.HEARTBEAT_DIR / f"{contract.GATE_RECORD_PREFIX}{os.getpid()}.json"
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"pid": os.getpid(), "gate": True, "at": time.time()}))
    except OSError:
        pass
    before = signal.signal(signal.SIGTERM, on_stop)

    def leave() -> None:
        """The gate is over (`go`, EOF): from here the rank agent's own signal handling stops the rank."""
        with gate:
            done.set()
        signal.signal(signal.SIGTERM, before)
        try:
            record.unlink()
        except OSError:
            pass

    threading.Thread(target=watch, daemon=True).start()
    return leave


def raw_line(fd: int) -> bytes | None:
    """One line from a raw fd, no deadline (the launcher may copy to other pods first); None at EOF."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        data += chunk
    return data[:-1]


def read_exact(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(1 << 20, size - len(data)))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def serve_gate(spec: dict[str, object], env: dict[str, str] | None = None) -> bool:
    """(the rank agent of `ml-dev run`, before its rank starts) answer the hash of the tree at the gate's root (and
    which of the listed Secret keys its pod holds: the launch's Secret check rides on the same answer), then
    follow the launcher's words on stdin: `apply <n>` + the launching pod's file list (n bytes: deletions, manifest,
    hash, answered again, after the launcher's rsync), `patch <n>` + a small change (n bytes, apply_patch: the
    changed files written here, then what `apply` does; answered again, `refused` saying why when nothing was
    written), `go` (start the rank); EOF: the launch stopped, nothing starts. On `go` the tree's hash is checked
    once more against the launching pod's (a relay's copy landed since the first answer): a rank never starts on a
    tree that differs. With `env` in the spec the answer holds this rank's environment fingerprint too (envgate.py:
    the rank's own variables `env`, cached until the environment's folders change), or only its digest when that is
    the spec's `env_digest` (the launcher's guess: envdrift.Guess)."""
    root = Path(str(spec.get("root") or "")) if spec.get("root") else None
    expect = str(spec.get("hash") or "")
    held = recorded_hash(root) if root else ""
    raw = spec.get("secrets")
    listed = [(str(pair[0]), str(pair[1])) for pair in raw] if isinstance(raw, list) else []
    found = usersecrets.presence(listed) if listed else {}
    unusable = usersecrets.refused() if listed else []  # values that cannot travel (usersecrets.value_refusal)

    rank_env = env if env is not None else dict(os.environ)
    environment = envgate.fingerprint(rank_env) if spec.get("env") else None

    def answer(refused: str = "") -> None:
        said: dict[str, object] = {"tree": held, "secrets": found}
        if environment is not None:
            said.update(envgate.answer(environment, spec.get("env_digest")))
            said["pip_applied"] = envgate.pip_applied(rank_env.get("HOME", ""))
        if unusable:
            said["refused_secrets"] = unusable
        if refused:
            said["refused"] = refused
        os.write(1, (GATE_MARK + json.dumps(said) + "\n").encode())

    def words() -> bool:
        nonlocal held, environment
        while True:
            line = raw_line(0)
            if line is None:
                return False
            word, _, arg = line.decode(errors="replace").partition(" ")
            if word == "go":
                if root and expect and held != expect:
                    held = recorded_hash(root)
                    if held != expect:
                        die(f"tree {root} here is {held[:12]}, not the launching pod's {expect[:12]}: the rank does not start", code=3)
                return True
            if word == "env" and environment is not None:  # after the pip log's replay here: the fingerprint again
                environment = envgate.fingerprint(rank_env)
                answer()
                continue
            if word in ("apply", "patch") and root and arg.isdigit():
                data = read_exact(0, int(arg))
                if data is None:
                    return False
                if word == "apply":
                    held = apply_listing(root, listed_files(data))
                    answer()
                    continue
                held, refused = apply_patch(root, data)
                answer(refused)
                continue
            die(f"unexpected word from the launcher at the gate: {line[:40]!r}", code=2)

    leave = watch_stop_at_gate()
    try:
        answer()
        return words()
    finally:
        leave()


# ------------------------------------------------------------------ a small change through the gate (ml-dev run)

PATCH_MODE_BITS = 0o777
"""The permission bits a patched file gets from the launching pod's copy (rsync -a's --perms, without set-id bits)."""

Patch = Callable[[int, bytes], "tuple[str, str]"]
"""patch(rank, payload) -> (hash, error): the rank agent waiting at that pod's gate writes a small change (`patch`
word, serve_gate) and answers the hash of its tree; error: why it did not (refused, its session ended)."""


def changed_since(entries: dict[str, tuple[str, str, int]], record: dict[str, object], their_hash: str) -> list[str] | None:
    """The files whose mode or content differ from this pod's record of the tree it sent last, when a pod holds that
    tree (`their_hash` is the record's); None when it holds another one (then what it lacks is unknown here)."""
    old = record.get("files") if record.get("hash") and record.get("hash") == their_hash else None
    if not isinstance(old, dict):
        return None
    return [rel for rel, (mode, digest, _) in sorted(entries.items()) if list(old.get(rel) or [])[:2] != [mode, digest]]


def patch_payload(root: Path, changed: list[str], listing: bytes) -> bytes | None:
    """(the launching pod) `patch`'s bytes: a JSON line {"files": [{path, mode, size, mtime_ns}]}, the files' bytes
    one after the other, then the launching pod's file list (NUL-separated, as `apply` gets it). None when a changed
    path is not a regular file here (a symlink, gone since it was hashed): rsync copies that change."""
    files: list[dict[str, object]] = []
    blobs = []
    for rel in changed:
        try:
            st = os.lstat(root / rel)
            if not stat.S_ISREG(st.st_mode):
                return None
            with open(root / rel, "rb") as f:
                data = f.read()
        except OSError:
            return None
        files.append({"path": rel, "mode": st.st_mode & PATCH_MODE_BITS, "size": len(data), "mtime_ns": st.st_mtime_ns})
        blobs.append(data)
    return json.dumps({"files": files}).encode() + b"\n" + b"".join(blobs) + listing


def unsafe_path(root: Path, rel: str, allowed: set[str]) -> str:
    """Why the patch may not write `rel` under `root` ("" when it may): only a path of the launching pod's list, plain
    relative (no leading `/`, no `..`, `.` or empty part), and never through a symlink or over a directory here."""
    if rel not in allowed:
        return "not in the launching pod's file list"
    parts = rel.split("/")
    if rel.startswith("/") or "\0" in rel or any(part in ("", ".", "..") for part in parts):
        return "not a plain relative path (absolute, or a '..', '.' or empty part)"
    for depth in range(1, len(parts)):
        above = root.joinpath(*parts[:depth])
        if os.path.islink(above):
            return f"goes through the symlink {'/'.join(parts[:depth])} here"
        if os.path.lexists(above) and not above.is_dir():
            return f"{'/'.join(parts[:depth])} is not a directory here"
    if os.path.isdir(root / rel) and not os.path.islink(root / rel):
        return "a directory here"
    return ""


def write_atomically(path: Path, data: bytes, mode: int, mtime_ns: int) -> None:
    """`path` becomes `data` at once (a temporary file in the same directory, renamed over it), with the launching
    pod's permission bits and modification time (to the nanosecond: rsync's next quick check, size and mtime with
    --modify-window=-1, finds the file current)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".ml-dev-patch.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode & PATCH_MODE_BITS)
        os.utime(tmp, ns=(time.time_ns(), mtime_ns))
        os.replace(tmp, str(path))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def whole(value: object) -> int:
    """A whole number >= 0 of a patch's header, else -1."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def apply_patch(root: Path, payload: bytes) -> tuple[str, str]:
    """(the rank agent at its gate) write the changed files of `payload` (patch_payload), then what `apply` does
    (deletions, the manifest, the tree hash). Every path is checked before anything is written: a path the file
    list does not hold, an absolute one, one with `..`, or one through a symlink refuses the whole patch. Returns
    (the tree hash here, why nothing was written or "")."""
    head, newline, rest = payload.partition(b"\n")
    try:
        header = json.loads(head.decode()) if newline else None
    except ValueError:
        header = None
    files = header.get("files") if isinstance(header, dict) else None
    if not isinstance(files, list):
        return recorded_hash(root), "the patch has no JSON header with a file list"
    plan: list[tuple[str, int, int, int, int]] = []  # (path, mode, offset, size, mtime_ns)
    offset = 0
    for item in files:
        entry = item if isinstance(item, dict) else {}
        rel, mode, size, mtime_ns = entry.get("path"), whole(entry.get("mode")), whole(entry.get("size")), whole(entry.get("mtime_ns"))
        if not isinstance(rel, str) or min(mode, size, mtime_ns) < 0:
            return recorded_hash(root), f"a file entry of the patch is malformed: {str(item)[:80]}"
        plan.append((rel, mode, offset, size, mtime_ns))
        offset += size
    if offset > len(rest):
        return recorded_hash(root), f"the patch holds {len(rest)} bytes after its header, its files need {offset}"
    try:
        listing = listed_files(rest[offset:])
    except UnicodeDecodeError:
        return recorded_hash(root), "the patch's file list is not UTF-8"
    allowed = set(listing)
    for rel, *_ in plan:
        why = unsafe_path(root, rel, allowed)
        if why:
            return recorded_hash(root), f"{rel[:200]!r}: {why}"
    for rel, mode, start, size, mtime_ns in plan:
        try:
            write_atomically(root / rel, rest[start : start + size], mode, mtime_ns)
        except OSError as exc:
            return recorded_hash(root), f"cannot write {rel}: {exc}"
    return apply_listing(root, listing), ""


def gate_hop(cluster: Cluster, dst: int, payload: bytes, expect: str, patch: Patch) -> fanout.Hop:
    """One pod's copy through its gate: the agent writes the change and answers its hash (no rsync, no SSH session
    of its own)."""
    started = time.monotonic()
    got, error = patch(dst, payload)
    if not error and got != expect:
        error = f"tree hash {got[:12]} after the patch differs from {expect[:12]} here"
    out: fanout.Hop = {"src": cluster.me, "dst": dst, "hash": got, "sent": len(payload), "error": error, "source_failed": False}
    out.update(via="gate", seconds=round(time.monotonic() - started, 3))
    return out


def sent_record(root: Path) -> Path:
    """The launching pod's record of the tree it last synced from `root` (to estimate what a pod lacks)."""
    return STATE_DIR / "tree-sent" / f"{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.json"


def bytes_to_send(entries: dict[str, tuple[str, str, int]], record: dict[str, object], their_hash: str) -> int:
    """What a pod lacks: the changed files' sizes when it holds the tree this pod sent last, else the whole tree."""
    changed = changed_since(entries, record, their_hash)
    return sum(entries[rel][2] for rel in (entries if changed is None else changed))


class Tree:
    """The launching pod's tree at `root`, as every pod must hold it: its file list (per-pod paths left out), entries,
    hash, and this pod's record of the tree it synced last."""

    def __init__(self, cluster: Cluster, root: Path) -> None:
        if root == Path("/"):
            die(f"refusing to sync {root}: run ml-dev from your project directory (or pass --no-sync)")
        self.root = root
        self.files = [f for f in tree_files(root) if not cluster.is_per_pod(root / f)]
        self.entries = tree_entries(root, self.files)
        self.hash = tree_hash(root, self.files, self.entries)
        self.listing = ("\0".join(self.files)).encode()
        self.shared = cluster.is_shared(root)
        try:
            self.record = json.loads(sent_record(root).read_text())
        except (OSError, ValueError):
            self.record = {}


def sync(cluster: Cluster, root: Path, quiet: bool = False, timeout: float = 60) -> str:
    """Make the tree at `root` the same on every pod; returns its hash (verified on every pod).

    Every other pod answers the hash of what it holds (`_check`, which is also the reachability probe: the same
    wait and words as wait_reachable) unless the tree changed since this pod last synced it (then every pod gets
    the change without being asked); the pods whose hash differs get a copy (`copy`). `ml-dev run` asks its rank
    agents instead (their gate, serve_gate): the question and the rank start are one SSH session per pod."""
    tree = Tree(cluster, root)
    if tree.shared:
        wait_reachable(cluster, timeout)
        if not quiet:
            print(f"ml-dev: {root} is on shared storage: nothing to sync ({len(tree.files)} files, tree {tree.hash[:12]})", flush=True)
        return tree.hash
    started = time.monotonic()
    if tree.record.get("hash") and tree.record.get("hash") != tree.hash:
        # the tree changed since this pod last synced it: every pod that holds that tree needs the change, so ask
        # nothing (`ssh true`, no Python there) and copy; each copy ends with the hash checked on its pod
        answers = dict.fromkeys(wait_reachable(cluster, timeout), str(tree.record["hash"]))
    else:
        answers = wait_reachable(cluster, timeout, [PY, str(HERE / "ml-dev"), "_check", "--root", str(root)])
    copy(cluster, tree, answers, started, quiet)
    return tree.hash


def copy(
    cluster: Cluster,
    tree: Tree,
    answers: dict[int, str],
    started: float,
    quiet: bool = False,
    verify: fanout.Verify | None = None,
    patch: Patch | None = None,
) -> None:
    """Copy the tree to every pod whose answer (the hash it holds) differs: pushed from here at once or, above the
    threshold (contract.FANOUT_DEFAULTS), in rounds through pods that hold the verified tree (fanout.py). Dies
    naming every pod that never got it. `verify`: how `_apply` runs after a hop of this pod or, in rounds, of a
    relay (default: its own SSH command).

    `patch` (`ml-dev run`: the rank agent waiting at each pod's gate): in a direct push, a pod that answered the hash
    of the tree this pod sent last gets the files changed since through its gate (regular files, at most
    `patchBytes` in all) instead of an rsync hop; where that pod's hash then differs, an rsync hop with --checksum
    follows. Each hop records the way it took (`via`: gate or rsync)."""
    root, local_hash, entries, listing = tree.root, tree.hash, tree.entries, tree.listing
    cfg = fanout.settings()
    record = tree.record
    stale = [r for r, got in sorted(answers.items()) if got.strip() != local_hash]
    estimate = sum(bytes_to_send(entries, record, answers[r].strip()) for r in stale)
    fan = len(stale) >= max(2, cfg["minPods"]) and estimate >= cfg["minBytes"]
    say = (lambda line: None) if quiet else (lambda line: print(f"ml-dev: {line}", flush=True))
    stall = max(1, cfg["stallSeconds"])
    sent_last = str(record.get("hash") or "")
    payload = None
    if patch is not None and not fan and cfg["patchBytes"] > 0 and any(answers[r].strip() == sent_last for r in stale):
        changed = changed_since(entries, record, sent_last) or []
        small = sum(entries[rel][2] for rel in changed) <= cfg["patchBytes"]
        if small and all(entries[rel][0] != "120000" for rel in changed):
            payload = patch_payload(root, changed, listing)

    def push(rank: int) -> fanout.Hop:
        if payload is None or patch is None or answers[rank].strip() != sent_last:
            return fanout.hop(cluster, root, rank, listing, local_hash, stall, verify)
        through = gate_hop(cluster, rank, payload, local_hash, patch)
        if not through["error"]:
            return through
        say(f"{cluster.label(rank)}: the change through its gate did not land ({through['error']}): rsync with --checksum")
        res = fanout.hop(cluster, root, rank, listing, local_hash, stall, verify, checksum=True)
        res.update(gate_error=through["error"], seconds=round(float(res.get("seconds", 0)) + float(through["seconds"]), 3))
        return res

    if fan:
        say(f"{len(stale)} pods need the tree (about {estimate / 1e6:.1f} MB from here by a direct push): passing it on in rounds")
        hops, gave_up = fanout.fan_out(cluster, root, stale, listing, local_hash, cfg, say, verify)
    else:
        results = parallel(push, stale)
        hops, gave_up = [], {}  # one round: today's push
        for rank, got in sorted(results.items()):
            res: fanout.Hop = got if isinstance(got, dict) else {"src": cluster.me, "dst": rank, "hash": "", "sent": 0, "error": str(got)}
            res["round"] = 1
            hops.append(res)
            if res.get("error") or res.get("hash") != local_hash:
                gave_up[rank] = str(res.get("error") or "") or f"tree hash {str(res.get('hash'))[:12]} differs from {local_hash[:12]} here"
    rounds = max([int(h.get("round", 1)) for h in hops] or [0])
    write_last(cluster, root, local_hash, fan, rounds, hops, time.monotonic() - started)
    if gave_up:
        die("\n  ".join(f"{cluster.label(r)}: sync failed: {why}" for r, why in sorted(gave_up.items())))
    try:
        record_path = sent_record(root)
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps({"hash": local_hash, "files": {rel: list(e) for rel, e in entries.items()}}))
    except OSError:
        pass
    if not quiet:
        sent = sum(int(h.get("sent") or 0) for h in hops)
        mine = sum(int(h.get("sent") or 0) for h in hops if h.get("src") == cluster.me)
        how = f"{rounds} rounds" if fan else "direct push"
        gated = sum(1 for h in hops if h.get("via") == "gate" and not h.get("error"))
        ways = f", {gated} through the gate, {len(stale) - gated} by rsync" if stale else ""
        print(
            f"ml-dev: synced {root} ({len(tree.files)} files, tree {local_hash[:12]}) to {len(answers)} pods in "
            f"{time.monotonic() - started:.1f} s, {sent} bytes sent ({len(stale)} copied, {how}{ways}; {mine} bytes from this pod)",
            flush=True,
        )


LAST_SYNC = "sync-last.json"
"""$ML_DEV_STATE_DIR/sync-last.json on the launching pod: the last sync's hops (source, receiver, round, seconds,
bytes, `via`: gate or rsync; `gate_error`: why a change sent through the gate was copied by rsync after all), read
by `make bench-launch`."""


def write_last(cluster: Cluster, root: Path, tree: str, fan: bool, rounds: int, hops: list[fanout.Hop], seconds: float) -> None:
    data = {"root": str(root), "tree": tree, "fan_out": fan, "rounds": rounds, "seconds": round(seconds, 3), "hops": hops}
    try:
        tmp = STATE_DIR / f"{LAST_SYNC}.{os.getpid()}"
        tmp.write_text(json.dumps(data))
        tmp.replace(STATE_DIR / LAST_SYNC)
    except OSError:
        pass


def cmd_sync(args: argparse.Namespace) -> int:
    cluster = Cluster()
    sync(cluster, tree_root(Path.cwd()), timeout=args.timeout)
    return 0
