"""ml-dev sync: the synced tree (git + .ml-devignore rules), its hash and cache, and the sync to every pod (`_apply` on the receiving pod).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

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


def tree_hash(root: Path, files: list[str]) -> str:
    cache = HashCache(root)
    h = hashlib.sha256()
    for rel in sorted(files):
        if not os.path.lexists(root / rel):
            h.update(f"missing\0{rel}\n".encode())
            continue
        mode, digest = cache.digest(root, rel)
        h.update(f"{mode} {digest} {rel}\n".encode())
    cache.save()
    return h.hexdigest()


# ------------------------------------------------------------------------------- remote helpers


def cmd_apply(args: argparse.Namespace) -> int:
    """(on a receiving pod) delete what an earlier sync brought and is gone now; print the tree hash."""
    root = Path(args.root)
    files = [p for p in sys.stdin.buffer.read().decode().split("\0") if p]
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
    print(tree_hash(root, files))
    return 0


def sync(cluster: Cluster, root: Path, quiet: bool = False) -> str:
    """Make the tree at `root` the same on every pod; returns its hash (verified on every pod)."""
    if root == Path("/"):
        die(f"refusing to sync {root}: run ml-dev from your project directory (or pass --no-sync)")
    files = [f for f in tree_files(root) if not cluster.is_per_pod(root / f)]
    local_hash = tree_hash(root, files)
    if cluster.is_shared(root):
        if not quiet:
            print(f"ml-dev: {root} is on shared storage: nothing to sync ({len(files)} files, tree {local_hash[:12]})", flush=True)
        return local_hash
    listing = ("\0".join(files)).encode()
    rsync_list = listing + b"\0" if files else b""
    rsh = cluster.rsh()

    sent: dict[int, int] = {}

    def push(rank: int) -> str:
        host = cluster.hosts[rank]
        mkdir = cluster.ssh(rank, ["mkdir", "-p", str(root)])
        mk = subprocess.run(mkdir, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if mk.returncode != 0:
            raise RuntimeError(f"mkdir {root}: {mk.stderr.strip()}")
        got = ""
        # rsync's quick check (size + mtime, to the nanosecond with --modify-window=-1) misses a same-size
        # rewrite within one timestamp tick: when the hashes differ, compare contents (--checksum) once.
        for extra in ([], ["--checksum"]):
            res = subprocess.run(
                [
                    "rsync",
                    "-a",
                    "--stats",
                    "--modify-window=-1",
                    *extra,
                    "--from0",
                    "--files-from=-",
                    "-e",
                    rsh,
                    f"{root}/",
                    f"{host}:{root}/",
                ],
                input=rsync_list,
                capture_output=True,
                check=False,
            )
            if res.returncode != 0:
                raise RuntimeError(f"rsync exited {res.returncode}: {res.stderr.decode(errors='replace').strip()}")
            stats = re.search(rb"Total bytes sent: ([\d,.]+)", res.stdout)
            sent[rank] = sent.get(rank, 0) + (int(re.sub(rb"[,.]", b"", stats.group(1))) if stats else 0)
            remote = [PY, str(HERE / "ml-dev"), "_apply", "--root", str(root)]
            res = subprocess.run(cluster.ssh(rank, remote), input=listing, capture_output=True, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"hash: {res.stderr.decode(errors='replace').strip()}")
            got = res.stdout.decode().strip()
            if got == local_hash:
                break
        return got

    started = time.monotonic()
    results = parallel(push, [r for r in range(len(cluster.hosts)) if r != cluster.me])
    problems = []
    for rank, got in sorted(results.items()):
        if isinstance(got, Exception):
            problems.append(f"{cluster.label(rank)}: sync failed: {got}; its sshd log: {cluster.sshd_log_command(rank)}")
        elif got != local_hash:
            problems.append(f"{cluster.label(rank)}: tree hash {str(got)[:12]} differs from {local_hash[:12]} here")
    if problems:
        die("\n  ".join(problems))
    if not quiet:
        print(
            f"ml-dev: synced {root} ({len(files)} files, tree {local_hash[:12]}) to {len(results)} pods in "
            f"{time.monotonic() - started:.1f} s, {sum(sent.values())} bytes sent",
            flush=True,
        )
    return local_hash


def cmd_sync(args: argparse.Namespace) -> int:
    cluster = Cluster()
    wait_reachable(cluster, args.timeout)
    sync(cluster, tree_root(Path.cwd()))
    return 0
