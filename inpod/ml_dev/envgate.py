"""One environment on every rank: each rank's fingerprint, taken by its rank agent at the gate beside the tree hash
(sync.serve_gate); the launcher's comparison is envdrift.py (the drift gate of `ml-dev run`), which no rank agent
imports.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.

A fingerprint (contract.FINGERPRINT_FIELDS) is what a rank's program would meet: the `python3` its PATH finds (path,
version), every distribution installed on that interpreter's sys.path (name and version from the `.dist-info` /
`.egg-info` folder names, as importlib.metadata's fast path reads them: no package is imported), the CUDA and NCCL
libraries the dynamic loader would map (path and sha256), PYTHONPATH, and the shape of sys.path (each entry, whether it
exists, and for an entry outside site-packages and the standard library the top-level names it offers: a PYTHONPATH
entry that shadows a package). HOME's own path is written `~` (per-pod HOMEs differ in their path only).

Nothing that does not change what a program loads is a difference: the order of a folder's entries, bytecode caches
(`__pycache__`, `.pyc`), timestamps.

The fingerprint is cached in the pod's state directory until something under the environment's paths changes: the
interpreter file, the modification time of every sys.path folder, of every library folder searched, of the loader's
cache, the libraries found, and the variables that steer the search (CACHE_ENV).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, Mapping

from .. import contract
from ..lib.pod import env_records_dir
from .common import STATE_DIR

CACHE_FILE = "envgate-cache.json"
"""$ML_DEV_STATE_DIR/envgate-cache.json: the last fingerprint and the signature it was taken under (per pod)."""
CACHE_ENV = (
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONSAFEPATH",
    "VIRTUAL_ENV",
    "HOME",
    "LD_LIBRARY_PATH",
)
"""The variables that steer which interpreter, packages and libraries a rank meets."""
LOADER_CACHE = "/etc/ld.so.cache"
DEFAULT_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
"""The loader's trusted directories after its cache (glibc elf/dl-load.c _dl_map_object, _dl_map_new_object in newer
releases: DT_RPATH, LD_LIBRARY_PATH (__rtld_env_path_list), DT_RUNPATH, then /etc/ld.so.cache (elf/dl-cache.c
_dl_load_cache_lookup), then the system directories). A program's own RPATH/RUNPATH is not known here: a library
pip placed beside a package (`nvidia/*/lib`, PyTorch's RUNPATH) is fingerprinted as a wheel's (`libraries`)."""
PROBE = (
    "import json, sys; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], 'executable': sys.executable, "
    "'prefix': sys.base_prefix, 'path': [p for p in sys.path if p]}))"
)
Fingerprint = Dict[str, object]
RACY_NS = 2_000_000_000


def which(name: str, path: str) -> str:
    for d in path.split(os.pathsep):
        candidate = os.path.join(d or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


def mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def file_sig(path: str) -> list[int]:
    try:
        st = os.stat(path)
    except OSError:
        return [-1, -1, -1]
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def home_form(value: str, home: str) -> str:
    """`value` with HOME's own path written `~` (a per-pod HOME differs in its path only)."""
    if home and home.strip("/") and (value == home or value.startswith(home.rstrip("/") + "/")):
        return "~" + value[len(home.rstrip("/")) :]
    return value


def norm_name(name: str) -> str:
    """A distribution's name as PEP 503 normalises it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_version(folder: str) -> str:
    for meta in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, meta), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return "?"


def distributions(entries: list[str]) -> dict[str, str]:
    """name -> version of every distribution on `entries` (sys.path), the first of a name winning as
    importlib.metadata.version finds it (CPython Lib/importlib/metadata/__init__.py: Distribution.from_name takes the
    first that MetadataPathFinder.find_distributions yields, searching sys.path in order with FastPath)."""
    found: dict[str, str] = {}
    for entry in entries:
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for item in names:
            stem, dot, kind = item.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            name, _, version = stem.partition("-")  # `{name}-{version}.dist-info`, the name's `-` escaped as `_`
            if not version or kind == "egg-info":
                version = read_version(os.path.join(entry, item)) if os.path.isdir(os.path.join(entry, item)) else (version or "?")
            found.setdefault(norm_name(name), version.split("-py")[0] if kind == "egg-info" else version)
    return found


def top_names(entry: str) -> list[str]:
    """The top-level names an import can find in `entry` (modules, packages, extensions), caches left out."""
    try:
        items = os.listdir(entry)
    except OSError:
        return []
    out = set()
    for item in items:
        if item == "__pycache__" or item.endswith((".pyc", ".dist-info", ".egg-info", ".pth")) or item.startswith("."):
            continue
        if item.endswith(".py") or ".cpython-" in item or item.endswith((".so", ".abi3.so")):
            out.add(item.split(".", 1)[0])
        elif "." not in item and os.path.isdir(os.path.join(entry, item)):
            out.add(item)
    return sorted(out)


def holds_something(entry: str) -> bool:
    """A site-packages folder or the standard library that is there and not empty (caches and dot files aside): an
    empty user site (pip made it, then uninstalled) is the same as none."""
    if os.path.isfile(entry):
        return True
    try:
        return any(item != "__pycache__" and not item.startswith(".") for item in os.listdir(entry))
    except OSError:
        return False


def site_like(entry: str, prefix: str) -> bool:
    """A site-packages folder or the standard library: its content is the distributions' or the interpreter's."""
    base = os.path.basename(entry.rstrip("/"))
    return base in ("site-packages", "dist-packages") or (bool(prefix) and entry.startswith(prefix.rstrip("/") + "/lib"))


SAMPLE_BYTES = 4 << 20
"""A library larger than 2 x this is hashed over its size, first and last SAMPLE_BYTES (NVIDIA's libraries run to
hundreds of MiB: cuDNN's, cuBLAS's); a smaller one whole. Two builds of a library differ in their ELF headers and
section table (at the ends), so a sample tells them apart at a bounded cost."""


def sha256(path: str) -> str:
    """The content hash of a library (whole, or sampled: SAMPLE_BYTES)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= 2 * SAMPLE_BYTES:
                h.update(f.read())
            else:
                h.update(b"%d\0" % size + f.read(SAMPLE_BYTES))
                f.seek(size - SAMPLE_BYTES)
                h.update(f.read(SAMPLE_BYTES))
    except OSError:
        return ""
    return h.hexdigest()


def loader_cache() -> list[tuple[str, str]]:
    """(soname, path) of the loader's cache, in its order (`ldconfig -p`)."""
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/usr/bin/ldconfig"):
        if os.path.exists(tool):
            try:
                out = subprocess.run([tool, "-p"], capture_output=True, timeout=10, check=False).stdout.decode(errors="replace")
            except (OSError, subprocess.SubprocessError):
                return []
            pairs = []
            for line in out.splitlines()[1:]:
                name, sep, path = line.strip().partition(" => ")
                if sep:
                    pairs.append((name.split(" ", 1)[0], path.strip()))
            return pairs
    return []


def pick(names: list[str], stem: str) -> str:
    """Of the files named `<stem>.so*` in one folder, the one a program linked against `<stem>.so.<major>` maps: the
    highest `.so.<major>`, else the shortest name."""
    majors = [n for n in names if re.fullmatch(re.escape(stem) + r"\.so\.\d+", n)]
    if majors:
        return max(majors, key=lambda n: int(n.rsplit(".", 1)[1]))
    return min(names, key=len)


def libraries(ld_path: str, entries: list[str], home: str) -> dict[str, list[str]]:
    """stem -> [path, sha256] of each library of contract.FINGERPRINT_LIBRARIES the loader would map, in its order:
    LD_LIBRARY_PATH, its cache, the system folders; and each one a pip wheel placed under a sys.path entry
    (`nvidia/<part>/lib`, where PyTorch's RPATH points)."""
    found: dict[str, list[str]] = {}
    dirs = [d for d in ld_path.split(":") if d]
    cache = loader_cache() if os.path.exists(LOADER_CACHE) else []
    for stem in contract.FINGERPRINT_LIBRARIES:
        path = ""
        for d in dirs:
            try:
                names = [n for n in os.listdir(d) if n.startswith(stem + ".so")]
            except OSError:
                continue
            if names:
                path = os.path.join(d, pick(names, stem))
                break
        if not path:
            path = next((p for name, p in cache if name.startswith(stem + ".so")), "")
        if not path:
            for d in DEFAULT_LIB_DIRS:
                names = [n for n in os.listdir(d) if n.startswith(stem + ".so")] if os.path.isdir(d) else []
                if names:
                    path = os.path.join(d, pick(names, stem))
                    break
        if path:
            found[stem] = [home_form(path, home), sha256(path)]
    for entry in entries:
        nv = os.path.join(entry, "nvidia")
        if not os.path.isdir(nv):
            continue
        for part in sorted(os.listdir(nv)):
            lib = os.path.join(nv, part, "lib")
            names = sorted(n for n in os.listdir(lib) if ".so" in n) if os.path.isdir(lib) else []
            for n in names:
                stem = n.split(".so", 1)[0]
                if stem in contract.FINGERPRINT_LIBRARIES:
                    found.setdefault(f"wheel:{stem}", [home_form(os.path.join(lib, n), home), sha256(os.path.join(lib, n))])
    return found


def probe(python: str, env: Mapping[str, str]) -> dict[str, object]:
    """The interpreter's own answer: version, executable, sys.path (as a rank's program would see it: its env)."""
    try:
        res = subprocess.run([python, "-c", PROBE], env=dict(env), cwd="/", capture_output=True, timeout=30, check=False)
        got = json.loads(res.stdout.decode(errors="replace").strip().splitlines()[-1])
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return {}


def take(env: Mapping[str, str]) -> tuple[Fingerprint, list[str]]:
    """The fingerprint, and the folders and files whose change makes it stale."""
    home = env.get("HOME", "")
    python = which("python3", env.get("PATH", os.defpath))
    got = probe(python, env) if python else {}
    listed = got.get("path")
    entries = [str(p) for p in listed] if isinstance(listed, list) else []
    prefix = str(got.get("prefix") or "")
    shape = []
    for entry in entries:
        site = site_like(entry, prefix)
        names = top_names(entry) if os.path.isdir(entry) and not site else []
        shape.append([home_form(entry, home), holds_something(entry) if site else bool(names) or os.path.isfile(entry), names])
    libs = libraries(env.get("LD_LIBRARY_PATH", ""), entries, home)
    version = str(got.get("version") or "")
    fp: Fingerprint = {
        "python": {"path": home_form(python, home), "real": os.path.realpath(python) if python else "", "version": version},
        "distributions": distributions(entries),
        "libraries": libs,
        "pythonpath": [home_form(p, home) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p],
        "sys_path": shape,
    }
    user_site = os.path.join(home, ".local", "lib", "python" + ".".join(version.split(".")[:2]), "site-packages") if home else ""
    watched = [*entries, *(d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d), *DEFAULT_LIB_DIRS, user_site]
    return fp, watched


def signature(env: Mapping[str, str], watched: list[str], libs: Mapping[str, object]) -> list[object]:
    python = which("python3", env.get("PATH", os.defpath))
    home = env.get("HOME", "")
    lib_files = [str(v[0]) if isinstance(v, list) and v else "" for v in libs.values()]
    lib_files = [home + p[1:] if p.startswith("~/") and home else p for p in lib_files]  # home_form's `~` back
    return [
        [env.get(k, "") for k in CACHE_ENV],
        python,
        file_sig(os.path.realpath(python)) if python else [],
        [mtime(p) for p in watched],
        mtime(LOADER_CACHE),
        [file_sig(p) for p in lib_files],
    ]


def fingerprint(env: Mapping[str, str], cache_dir: Path | None = None) -> Fingerprint:
    """This rank's fingerprint (contract.FINGERPRINT_FIELDS), from the cache while nothing it watches changed."""
    cache = (cache_dir or STATE_DIR) / CACHE_FILE
    try:
        held = json.loads(cache.read_text())
        watched = [str(p) for p in held["watched"]]
        fp = held["fingerprint"]
        if held["signature"] == json.loads(json.dumps(signature(env, watched, fp.get("libraries") or {}))):
            return dict(fp)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    started = time.time_ns()
    fp, watched = take(env)
    record = {"fingerprint": fp, "watched": watched, "signature": signature(env, watched, fp["libraries"])}  # type: ignore[arg-type]
    if max([mtime(p) for p in watched] + [mtime(LOADER_CACHE)]) + RACY_NS >= started:
        return fp  # a folder changed within the last 2 s: the same time may hide the next change (git's "racy" case)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{CACHE_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(record))
        tmp.replace(cache)
    except OSError:
        pass
    return fp


def digest(fp: Mapping[str, object]) -> str:
    """sha256 of the fingerprint's canonical JSON (keys sorted): equal digests, equal fingerprints. A different digest
    says nothing more: the fingerprints themselves are compared (`differences`)."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def answer(fp: Fingerprint, expected: object) -> dict[str, object]:
    """(a rank agent) what its gate answer carries for its fingerprint: the launcher's digest (`expected`, the gate
    question's `env_digest`) alone when it is this fingerprint's, the whole fingerprint otherwise (no digest asked:
    a launcher from before it)."""
    if isinstance(expected, str) and expected and digest(fp) == expected:
        return {"env_digest": expected}
    return {"env": fp}


def records() -> Path:
    return env_records_dir() / contract.ENV_GATE_DIR


def pip_applied(home: str) -> int:
    """How many commands of the pip log (install.py) this pod ran, by its HOME's record."""
    try:
        return int((Path(home) / contract.ENV_PIP_APPLIED).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
