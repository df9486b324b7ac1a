#!/usr/bin/env python3
"""Modelcar packaging benchmark: the product packager against the registry's raw ingest rate at the
same parallelism, the original approach (buildah bud + push) and the peer approach (olot + skopeo).

One run generates a synthetic model once (incompressible random bytes in safetensors-like shards
plus small JSON files) and pushes it to a local docker-registry with every approach:

  raw1 / raw2   the registry's blob-ingest rate with 1 / 2 parallel streams: digests computed
                beforehand (untimed), then one monolithic PUT per file, sent with sendfile().
                The physical reference at that parallelism.
  ours1 / ours2 steps/package.py --jobs 1 / --jobs 2, run as deployed (the tools image's file tree).
  s3read        the source read alone: every object read from a moto S3 server (one signed GET each, into one
                buffer, as the streaming packager reads), 2 streams.
  relay2        the least any streaming packager does: every object read from moto S3 as s3read does and sent
                as one monolithic PUT to the registry, SHA-256 computed on the way (the digest in the URL is
                the precomputed one), 2 streams. The physical reference for stream2's CPU and wall time.
  stream2       steps/package.py --source s3:// --jobs 2: S3 → registry in one pass, no model dir.
  basestream2   stream2 with the packager of another git revision (`--baseline REF`, e.g. main): A/B in the same rounds.
  baseours1/2   ours1/ours2 with the packager of `--baseline REF`, likewise.
  rerun2        stream2 run twice against one registry, only the second run timed: packaging an unchanged model again
                (this tree reads every layer the tag names from the source to check it, and sends nothing).
  basererun2    rerun2 with `--baseline REF`'s packager.
  buildah       `buildah bud` (FROM <base>, COPY models /models; vfs, chroot) + `buildah push`.
  olot          `skopeo copy` of the base into an OCI layout, `olot`, `skopeo copy --preserve-digests`.

Fair comparison: ours1 is judged against raw1 and ours2 against raw2 (equal parallelism). The
approaches are interleaved (round-robin, `--repeat` rounds, default 3), so drift of the machine
(page cache, other load) hits all of them alike; the report shows the median, the spread (min–max)
and the per-run values. CPU per approach (medians): `cpu: <x> CPU-s/GiB = <r> × sha256 floor (<f> CPU-s/GiB
in this run)` for the pushing process (user + system), where the floor is SHA-256 of the model's own bytes
in one process (memory-mapped, no copy), measured every round on the packager's CPUs; and the registry's and
the S3 server's CPU. With `--pin auto` (default) the packager (raw: the sending threads; s3read: the reading
threads), the registry and the S3 server each run on a third of the CPUs; on a 2-CPU machine the packager
gets one and the two servers share the other (so a relay there takes the sum of their work, not the
larger); no server ever shares the packager's cores. The report names the split and the load average at
start and end. Each run gets a fresh registry storage and
repository. A sampler polls the disk usage of the approach's scratch locations every 0.2 s; "peak
scratch" is the largest growth seen (node-ephemeral space needed besides the model directory).

Why one module: one benchmark, one command; its approaches share the registry, S3 and scratch rigs and the
round-robin runner, and a split would hand all of them through every function.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import http.client
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from inpod.lib import svgplot
from steps.embed import write_tree
from tests.fixtures.images import push_base
from tests.fixtures.registry import Registry, registry_available, run_registry
from tests.fixtures.s3 import S3Server, run_s3

ROOT = Path(__file__).resolve().parents[1]

MiB = 1 << 20
GiB = 1 << 30
SCRATCH_TARGET = 64 * MiB


@dataclass
class Result:
    name: str  # approach key
    seconds: float
    peak_scratch: int
    peak_rss: int
    cpu_user: float = 0.0  # the pushing process (ours: the step; raw: this benchmark's sending threads)
    cpu_sys: float = 0.0
    registry_cpu: float = 0.0  # docker-registry's own user + system seconds during the run
    source_cpu: float = 0.0  # the moto S3 server's user + system seconds during the run (s3read, relay2, stream2)

    def rate(self, model_bytes: int) -> float:
        return model_bytes / self.seconds / 1e6


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": MiB, "GIB": GiB, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


def human(num: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num < 1024:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.2f} GiB"


def allocated(path: Path) -> int:
    """Bytes allocated on disk under `path`, on its own file system only: a directory that is another mount (a
    chroot's /proc under /var/tmp on a shared machine) is not entered, and entries that vanish or cannot be read
    mid-walk (a process that ended) are ignored."""
    try:
        if not path.is_dir():
            return path.lstat().st_blocks * 512
        device = path.stat().st_dev
    except OSError:
        return 0
    total = 0
    for root, dirs, files in os.walk(path):
        for name in list(dirs):
            try:
                if os.lstat(os.path.join(root, name)).st_dev != device:
                    dirs.remove(name)
            except OSError:
                dirs.remove(name)
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class ScratchSampler:
    """Polls the growth of the given paths' disk usage in a thread; `peak` is the maximum seen."""

    def __init__(self, paths: list[Path], interval: float = 0.2) -> None:
        self.paths, self.interval = paths, interval
        self.baseline = {p: allocated(p) for p in paths}
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, sum(max(allocated(p) - self.baseline[p], 0) for p in self.paths))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ScratchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def process_cpu(pid: int) -> float:
    """User + system CPU seconds a running process has used (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def registry_pid(registry: Registry) -> int:
    """The docker-registry process serving `registry` (found by its config file on the command line)."""
    wanted = str(registry.root / "config.yml").encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if wanted in Path(entry.path, "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise SystemExit(f"cannot find the registry process for {registry.root}")


def pin(pid: int, cpus: set[int] | None) -> None:
    """Pin every thread of process `pid` to `cpus` (threads it starts later inherit it); None: no pinning."""
    if cpus:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), cpus)
            except ProcessLookupError:
                pass


def moto_pid(endpoint: str) -> int:
    """The moto server process listening at `endpoint` (by its command line: `-m moto.server ... -p <port>`)."""
    port = endpoint.rsplit(":", 1)[1].encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                args = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"moto.server" in args and port in args:
                return int(entry.name)
    raise SystemExit(f"cannot find the moto process for {endpoint}")


def source_cpu(env: Env) -> float:
    """CPU seconds the moto S3 server has used so far (0 without one)."""
    return process_cpu(moto_pid(env.s3.endpoint)) if env.s3 is not None else 0.0


def split_cpus(how: str, cpus: list[int] | None = None) -> tuple[set[int] | None, set[int] | None, set[int] | None]:
    """(packager CPUs, registry CPUs, S3 server CPUs). `auto` with three or more CPUs gives each of the three its own
    third (the packager the first, the S3 server the last; a 16-CPU machine: 5, 5, 6), so neither server shares a
    core with the packager nor with the other; with two the registry and the S3 server share the upper CPU (they
    then cannot run at once: a relay takes the sum of their times, not the larger). `none` pins nothing."""
    mine = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if how == "none" or len(mine) < 2:
        return None, None, None
    if len(mine) == 2:
        return {mine[0]}, {mine[1]}, {mine[1]}
    third = len(mine) // 3
    return set(mine[:third]), set(mine[third : 2 * third]), set(mine[2 * third :])


class Runner:
    """Runs commands with output in a log file; samples the resident memory of each command's process
    tree and sums the CPU time (user, system) of the commands (children's rusage from wait4)."""

    def __init__(self, logs: Path, cpus: set[int] | None = None) -> None:
        self.logs, self.cpus = logs, cpus
        self.peak_rss = 0
        self.cpu_user = self.cpu_sys = 0.0

    def __call__(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            cpus = self.cpus
            setup = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=setup)
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    self.cpu_user += usage.ru_utime
                    self.cpu_sys += usage.ru_stime
                    break
                self.peak_rss = max(self.peak_rss, tree_rss(proc.pid))
                time.sleep(0.2)
        if proc.returncode != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"{name} failed (exit {proc.returncode}); see {log}:\n" + "\n".join(tail))


def make_model(model_dir: Path, size: int, shards: int) -> list[Path]:
    """Incompressible shards totalling `size` bytes plus small JSON files; generated once."""
    model_dir.mkdir(parents=True)
    files = []
    base, extra = divmod(size, shards)
    for i in range(shards):
        path = model_dir / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        remaining = base + (1 if i < extra else 0)
        with open(path, "wb") as fh:
            while remaining:
                chunk = os.urandom(min(64 * MiB, remaining))
                fh.write(chunk)
                remaining -= len(chunk)
        files.append(path)
    small = {"config.json": {"architectures": ["MistralForCausalLM"], "hidden_size": 5120}, "generation_config.json": {"do_sample": True}}
    small["model.safetensors.index.json"] = {"weight_map": {f"layer.{i}": p.name for i, p in enumerate(files)}}
    small["tokenizer.json"] = {"model": {"vocab": {f"t{i}": i for i in range(20000)}}}
    for name, content in small.items():
        (model_dir / name).write_text(json.dumps(content))
        files.append(model_dir / name)
    return sorted(files)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * MiB):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def put_blob(registry: Registry, repo: str, path: Path, digest: str) -> None:
    """One monolithic upload: POST for a session, PUT ?digest= with the file as the body (sendfile)."""
    auth = "Basic " + base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=600)
    try:
        conn.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Authorization": auth, "Content-Length": "0"})
        resp = conn.getresponse()
        resp.read()
        location = resp.getheader("Location", "")
        sep = "&" if "?" in location else "?"
        conn.putrequest("PUT", f"{location}{sep}digest={digest}", skip_accept_encoding=True)
        headers = {"Authorization": auth, "Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)}
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        assert conn.sock is not None
        with open(path, "rb") as fh:
            conn.sock.sendfile(fh)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 201:
            raise SystemExit(f"raw PUT of {path.name} failed: HTTP {resp.status}")
    finally:
        conn.close()


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A thread-pool initializer that pins each worker thread to `cpus` (Linux: affinity is per thread)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def raw_ingest(
    registry: Registry, repo: str, files: list[Path], digests: dict[Path, str], streams: int, cpus: set[int] | None = None
) -> float:
    """Time monolithic uploads of every file, `streams` at a time (largest first, like the packager)."""
    order = sorted(files, key=lambda p: -p.stat().st_size)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams, initializer=pinned(cpus)) as pool:
        for future in [pool.submit(put_blob, registry, repo, path, digests[path]) for path in order]:
            future.result()
    return time.monotonic() - started


@dataclass
class Env:
    work: Path
    model_dir: Path
    files: list[Path]
    logs: Path
    digests: dict[Path, str]
    s3: S3Server | None = None  # moto S3 holding the same model under s3://bench/m/ (streaming approaches)
    cpus: set[int] | None = None  # where the packager (raw: the sending threads; s3read: the readers) runs
    server_cpus: set[int] | None = None  # where the registry runs (never the packager's CPUs)
    source_cpus: set[int] | None = None  # where the S3 server runs (never the packager's; the registry's only on 2 CPUs)
    baseline: Path | None = None  # another revision's steps tree (--baseline REF), for baseours1/2, basestream2 and basererun2


@contextmanager
def fresh_registry(env: Env, name: str, with_base: bool) -> Iterator[tuple[Registry, str]]:
    """A registry with empty storage for one approach (removed afterwards) and its base image."""
    with run_registry(env.work / "registries", name) as registry:
        pin(registry_pid(registry), env.server_cpus)
        yield registry, push_base(env.work / "registries" / name, registry, "base/shell:1") if with_base else ""
    shutil.rmtree(env.work / "registries" / name, ignore_errors=True)


def approach_raw(env: Env, name: str, streams: int = 1) -> Result:
    with fresh_registry(env, name, with_base=False) as (registry, _):
        tmp = env.work / name / "tmp"
        tmp.mkdir(parents=True)
        server = registry_pid(registry)
        server_cpu, before = process_cpu(server), resource.getrusage(resource.RUSAGE_SELF)
        with ScratchSampler([tmp]) as sampler:
            seconds = raw_ingest(registry, f"bench/{name}", env.files, env.digests, streams, env.cpus)
        after = resource.getrusage(resource.RUSAGE_SELF)
        registry_cpu = process_cpu(server) - server_cpu
    return Result(name, seconds, sampler.peak, 0, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, registry_cpu)


def approach_ours(env: Env, name: str, jobs: int = 2, baseline: bool = False) -> Result:
    """steps/package.py from the model directory (`baseline`: --baseline's packager, for A/B in the same rounds)."""
    scratch = env.work / name
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True)
    if baseline and env.baseline is None:
        raise SystemExit(f"{name}: needs --baseline REF")
    # as deployed: the tools image's file tree
    script = (env.baseline if baseline and env.baseline else write_tree(scratch / "image")) / "package.py"
    cache = env.model_dir.parent / f".{env.model_dir.name}.digests.json"
    cache.unlink(missing_ok=True)  # cold: every layer is hashed while it is uploaded
    run = Runner(env.logs, env.cpus)
    with fresh_registry(env, name, with_base=True) as (registry, base):
        authfile = registry.authfile(scratch / "auth.json")
        cmd = [sys.executable, str(script), "--model-dir", str(env.model_dir), "--image", f"{registry.host}/bench/{name}:v1"]
        cmd += ["--base-image", base, "--authfile", str(authfile), "--plain-http", "--progress-interval", "10", "--jobs", str(jobs)]
        server = registry_pid(registry)
        server_cpu = process_cpu(server)
        with ScratchSampler([tmp, cache, Path("/var/tmp")]) as sampler:
            started = time.monotonic()
            run(name, cmd, env={**os.environ, "TMPDIR": str(tmp)})
            seconds = time.monotonic() - started
        registry_cpu = process_cpu(server) - server_cpu
    return Result(name, seconds, sampler.peak, run.peak_rss, run.cpu_user, run.cpu_sys, registry_cpu)


def s3_get(env: Env, path: Path) -> http.client.HTTPConnection:
    """A SigV4-signed GET of the object of `path` under s3://bench/m/ (as the streaming packager signs it), sent."""
    assert env.s3 is not None
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest("GET", f"{env.s3.endpoint}/bench/m/{path.name}")
    S3SigV4Auth(Credentials(env.s3.access_key, env.s3.secret_key), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(env.s3.endpoint.split("://", 1)[1], timeout=600)
    conn.request("GET", f"/bench/m/{path.name}", headers=dict(req.headers.items()))
    return conn


def approach_s3read(env: Env, name: str, streams: int = 2) -> Result:
    """The source read alone: every object of the model read from S3 and discarded, `streams` at a time, the way
    the streaming packager reads it (one SigV4-signed GET per object, read into one 8 MiB buffer)."""

    def read(path: Path) -> None:
        conn = s3_get(env, path)
        try:
            resp = conn.getresponse()
            if resp.status != 200:
                raise SystemExit(f"s3read: GET {path.name}: HTTP {resp.status}")
            buf = bytearray(8 * MiB)
            while resp.readinto(buf):
                pass
        finally:
            conn.close()

    source, before = source_cpu(env), resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams, initializer=pinned(env.cpus)) as pool:
        for future in [pool.submit(read, p) for p in sorted(env.files, key=lambda p: -p.stat().st_size)]:
            future.result()
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return Result(name, seconds, 0, 0, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, 0.0, source_cpu(env) - source)


def relay_blob(env: Env, registry: Registry, repo: str, path: Path) -> None:
    """S3 GET → one monolithic registry PUT, hashed on the way: recv into one 8 MiB buffer, SHA-256, send."""
    auth = "Basic " + base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    src = s3_get(env, path)
    dst = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=600)
    try:
        got_resp = src.getresponse()
        if got_resp.status != 200:
            raise SystemExit(f"relay: GET {path.name}: HTTP {got_resp.status}")
        dst.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Authorization": auth, "Content-Length": "0"})
        resp = dst.getresponse()
        resp.read()
        location = resp.getheader("Location", "")
        dst.putrequest("PUT", f"{location}{'&' if '?' in location else '?'}digest={env.digests[path]}", skip_accept_encoding=True)
        for key, value in {
            "Authorization": auth,
            "Content-Type": "application/octet-stream",
            "Content-Length": str(path.stat().st_size),
        }.items():
            dst.putheader(key, value)
        dst.endheaders()
        h, buf = hashlib.sha256(), memoryview(bytearray(8 * MiB))
        while got := got_resp.readinto(buf):
            dst.send(buf[:got])
            h.update(buf[:got])
        resp = dst.getresponse()
        resp.read()
        if resp.status != 201 or "sha256:" + h.hexdigest() != env.digests[path]:
            raise SystemExit(f"relay PUT of {path.name} failed: HTTP {resp.status}")
    finally:
        src.close()
        dst.close()


def approach_relay(env: Env, name: str, streams: int = 2) -> Result:
    with fresh_registry(env, name, with_base=False) as (registry, _):
        server = registry_pid(registry)
        server_cpu, source, before = process_cpu(server), source_cpu(env), resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=streams, initializer=pinned(env.cpus)) as pool:
            order = sorted(env.files, key=lambda p: -p.stat().st_size)
            for future in [pool.submit(relay_blob, env, registry, f"bench/{name}", path) for path in order]:
                future.result()
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        registry_cpu = process_cpu(server) - server_cpu
    return Result(
        name, seconds, 0, 0, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, registry_cpu, source_cpu(env) - source
    )


def baseline_tree(ref: str, into: Path) -> Path:
    """The tools image's steps tree of revision `ref` of this repository (laid out by that revision's own embed.py)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "steps"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    code = f"from steps.embed import write_tree; from pathlib import Path; write_tree(Path({str(into / 'image')!r}))"
    subprocess.run([sys.executable, "-c", code], cwd=into, check=True)
    return into / "image" / "steps"


def approach_stream(env: Env, name: str, jobs: int = 2, baseline: bool = False, rerun: bool = False) -> Result:
    """ours with --source s3://: no model directory, no PVC; S3 → registry in one pass (`baseline`: --baseline's).
    `rerun`: the same command once more against the registry that now holds the tag, and only that second run is
    timed: what packaging an unchanged model again costs (this tree reads each layer the tag names from the source to
    check it, docs/models/registry.md; a packager that trusts the tag reads nothing)."""
    assert env.s3 is not None
    scratch = env.work / name
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True)
    if baseline and env.baseline is None:
        raise SystemExit(f"{name}: needs --baseline REF")
    # as deployed: the tools image's file tree
    script = (env.baseline if baseline and env.baseline else write_tree(scratch / "image")) / "package.py"
    run = Runner(env.logs, env.cpus)
    with fresh_registry(env, name, with_base=True) as (registry, base):
        authfile = registry.authfile(scratch / "auth.json")
        cmd = [sys.executable, str(script), "--source", "s3://bench/m", "--s3-endpoint-url", env.s3.endpoint, "--include", "*"]
        cmd += ["--image", f"{registry.host}/bench/{name}:v1", "--base-image", base, "--authfile", str(authfile), "--plain-http"]
        cmd += ["--progress-interval", "10", "--jobs", str(jobs)]
        if rerun:  # the first run, untimed (its own Runner: its CPU is not counted)
            Runner(env.logs, env.cpus)(name, cmd, env={**env.s3.env(), "TMPDIR": str(tmp)})
        server = registry_pid(registry)
        server_cpu, source = process_cpu(server), source_cpu(env)
        with ScratchSampler([tmp]) as sampler:
            started = time.monotonic()
            run(name, cmd, env={**env.s3.env(), "TMPDIR": str(tmp)})
            seconds = time.monotonic() - started
        registry_cpu = process_cpu(server) - server_cpu
    return Result(name, seconds, sampler.peak, run.peak_rss, run.cpu_user, run.cpu_sys, registry_cpu, source_cpu(env) - source)


def approach_buildah(env: Env, name: str) -> Result:
    scratch = env.work / name
    dirs = {k: scratch / k for k in ("root", "runroot", "tmp")}
    for d in dirs.values():
        d.mkdir(parents=True)
    run = Runner(env.logs, env.cpus)
    with fresh_registry(env, name, with_base=True) as (registry, base):
        containerfile = scratch / "Containerfile"
        containerfile.write_text(f"FROM {base}\nCOPY {env.model_dir.name} /models\n")
        creds = f"{registry.username}:{registry.password}"
        buildah = ["buildah", "--root", str(dirs["root"]), "--runroot", str(dirs["runroot"]), "--storage-driver", "vfs"]
        proc_env = {**os.environ, "TMPDIR": str(dirs["tmp"]), "BUILDAH_ISOLATION": "chroot"}
        with ScratchSampler([*dirs.values(), Path("/var/tmp")]) as sampler:
            started = time.monotonic()
            run(name, [*buildah, "bud", "--isolation", "chroot", "--tls-verify=false", "--creds", creds, "--layers=false",
                       "-f", str(containerfile), "-t", "localhost/bench:v1", str(env.model_dir.parent)], env=proc_env)  # fmt: skip
            run(name, [*buildah, "push", "--tls-verify=false", "--creds", creds, "localhost/bench:v1",
                       f"docker://{registry.host}/bench/{name}:v1"], env=proc_env)  # fmt: skip
            seconds = time.monotonic() - started
    return Result(name, seconds, sampler.peak, run.peak_rss, run.cpu_user, run.cpu_sys)


def approach_olot(env: Env, name: str) -> Result:
    scratch = env.work / name
    layout, tmp = scratch / "layout", scratch / "tmp"
    tmp.mkdir(parents=True)
    run = Runner(env.logs, env.cpus)
    olot = str(Path(sys.executable).with_name("olot"))
    with fresh_registry(env, name, with_base=True) as (registry, base):
        creds = f"{registry.username}:{registry.password}"
        proc_env = {**os.environ, "TMPDIR": str(tmp)}
        with ScratchSampler([layout, tmp, Path("/var/tmp")]) as sampler:
            started = time.monotonic()
            run(name, ["skopeo", "copy", "--src-tls-verify=false", "--src-creds", creds, f"docker://{base}", f"oci:{layout}:latest"],
                env=proc_env)  # fmt: skip
            run(name, [olot, str(layout), "--root-dir", str(env.model_dir), *map(str, env.files)], env=proc_env)
            run(name, ["skopeo", "copy", "--preserve-digests", "--dest-tls-verify=false", "--dest-creds", creds,
                       f"oci:{layout}:latest", f"docker://{registry.host}/bench/{name}:v1"], env=proc_env)  # fmt: skip
            seconds = time.monotonic() - started
    return Result(name, seconds, sampler.peak, run.peak_rss, run.cpu_user, run.cpu_sys)


# key: (title, function, the raw reference at the same parallelism)
APPROACHES: dict[str, tuple[str, Callable[[Env, str], Result], str | None]] = {
    "raw1": ("raw blob ingest, 1 stream", approach_raw, None),
    "raw2": ("raw blob ingest, 2 streams", functools.partial(approach_raw, streams=2), None),
    "ours1": ("ours: steps/package.py --jobs 1", functools.partial(approach_ours, jobs=1), "raw1"),
    "ours2": ("ours: steps/package.py --jobs 2 (default)", functools.partial(approach_ours, jobs=2), "raw2"),
    "baseours1": ("--baseline's steps/package.py --jobs 1", functools.partial(approach_ours, jobs=1, baseline=True), "raw1"),
    "baseours2": ("--baseline's steps/package.py --jobs 2", functools.partial(approach_ours, jobs=2, baseline=True), "raw2"),
    "s3read": ("source read alone: moto S3 GET, 2 streams", approach_s3read, None),
    "relay2": ("S3 → registry relay, SHA-256 on the way, 2 streams", approach_relay, "raw2"),
    "stream2": ("ours --source s3:// (no PVC), --jobs 2", functools.partial(approach_stream, jobs=2), "raw2"),
    "basestream2": ("--baseline's --source s3://, --jobs 2", functools.partial(approach_stream, jobs=2, baseline=True), "raw2"),
    "rerun2": ("stream2 again, the tag in place (timed: the second run)", functools.partial(approach_stream, jobs=2, rerun=True), None),
    "basererun2": (
        "--baseline's stream2 again, the tag in place",
        functools.partial(approach_stream, jobs=2, baseline=True, rerun=True),
        None,
    ),
    "buildah": ("original: buildah bud + push", approach_buildah, "raw1"),
    "olot": ("peer: olot + skopeo", approach_olot, "raw1"),
}


def sha256_floor(files: list[Path]) -> float:
    """CPU seconds per GiB that SHA-256 of the model's bytes costs in one process on this machine: every file
    hashed once from the page cache through a memory map (no read copy: SHA-256 alone)."""
    total, started = 0, time.process_time()
    for path in files:
        h = hashlib.sha256()
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            for pos in range(0, len(mm), 8 * MiB):
                h.update(view[pos : pos + 8 * MiB])
            view.release()
        total += path.stat().st_size
    return (time.process_time() - started) / (total / GiB)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


GOALS = {"ours1": 1.4, "ours2": 1.4, "stream2": 1.6}  # CPU per GiB as a multiple of the SHA-256 floor


def report(results: list[Result], model_bytes: int, size_label: str, floor: float, rounds: int, setup: str) -> str:
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    rate = {k: model_bytes / median([r.seconds for r in v]) / 1e6 for k, v in by.items()}
    gib = model_bytes / GiB
    lines = [
        f"modelcar packaging benchmark: {size_label} model ({model_bytes / 1e6:.0f} MB), local docker-registry, "
        f"{os.cpu_count()} CPUs, {rounds} interleaved rounds; medians, spread = min–max wall time",
        setup,
        "",
        "| approach | median wall s | spread s | runs (s) | MB/s | vs raw, same streams | peak scratch | peak RSS |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for key, runs in by.items():
        title, _, reference = APPROACHES[key]
        walls = [r.seconds for r in runs]
        pct = f"{100 * rate[key] / rate[reference]:.0f} % of {reference}" if reference in rate else "–"
        rss = human(max(r.peak_rss for r in runs)) if any(r.peak_rss for r in runs) else "–"
        lines.append(
            f"| {title} | {median(walls):.1f} | {min(walls):.1f}–{max(walls):.1f} | {', '.join(f'{w:.1f}' for w in walls)} | "
            f"{rate[key]:.0f} | {pct} | {human(max(r.peak_scratch for r in runs))} | {rss} |"
        )
    lines += [
        "",
        "CPU per approach (median user + system CPU seconds of the pushing process — raw: the sending threads, "
        "s3read: the reading threads, relay2: the relaying threads — per GiB of model; the registry's and the S3 server's own CPU "
        "are apart):",
        "",
    ]
    for key, runs in by.items():
        cpu = median([r.cpu_user + r.cpu_sys for r in runs]) / gib
        goal = f" (goal ≤ {GOALS[key]})" if key in GOALS else ""
        source = median([r.source_cpu for r in runs]) / gib
        lines.append(f"* {key}: cpu: {cpu:.2f} CPU-s/GiB = {cpu / floor:.2f} × sha256 floor ({floor:.2f} CPU-s/GiB in this run){goal}; "
                     f"registry process {median([r.registry_cpu for r in runs]) / gib:.2f} CPU-s/GiB"
                     + (f", S3 server {source:.2f} CPU-s/GiB" if source else ""))  # fmt: skip
    lines.append("")
    for key in ("ours1", "ours2"):
        reference = APPROACHES[key][2]
        if key in rate and reference in rate:
            lines.append(f"{key}: {100 * rate[key] / rate[reference]:.0f} % of {reference} (goal ≥ 90 %)")
    if "stream2" in by and "s3read" in by and "raw2" in by:
        slowest = max(median([r.seconds for r in by["s3read"]]), median([r.seconds for r in by["raw2"]]))
        ratio = median([r.seconds for r in by["stream2"]]) / slowest
        lines.append(f"stream2: {ratio:.2f} × max(source read alone, raw ingest alone) (goal ≤ 1.15; "
                     "the download-then-package pipeline takes their sum)")  # fmt: skip
    if "stream2" in by and "relay2" in by:
        wall = median([r.seconds for r in by["stream2"]]) / median([r.seconds for r in by["relay2"]])
        cpu = median([r.cpu_user + r.cpu_sys for r in by["stream2"]]) / median([r.cpu_user + r.cpu_sys for r in by["relay2"]])
        lines.append(f"stream2: {wall:.2f} × relay2's wall time, {cpu:.2f} × its CPU (the least a streaming packager does here)")
    for key in ("ours1", "ours2", "stream2", "rerun2"):
        base = f"base{key}"
        if key in by and base in by:
            cpu = median([r.cpu_user + r.cpu_sys for r in by[key]]) / median([r.cpu_user + r.cpu_sys for r in by[base]])
            wall = median([r.seconds for r in by[key]]) / median([r.seconds for r in by[base]])
            lines.append(f"{key}: {cpu:.2f} × {base}'s CPU, {wall:.2f} × its wall time (this tree against --baseline)")
    ours = by.get("ours2") or by.get("ours1")
    if ours:
        peak = max(r.peak_scratch for r in ours)
        lines.append(f"{'PASS' if peak <= SCRATCH_TARGET else 'MISS'}: packager peak scratch {human(peak)} (target ≤ 64 MiB)")
    return "\n".join(lines)


def plot(results: list[Result], size_label: str) -> str:
    """Every run's wall time per approach against its round (the spread the table summarises), as SVG. Approaches
    whose median is over 2.5 x the median of all runs (the original, buildah, at about 7 x) get a panel of their
    own, so the others are read on a scale that fits them rather than squeezed under the slowest."""
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    typical = median([r.seconds for r in results])
    slow = {k for k, v in by.items() if median([r.seconds for r in v]) > 2.5 * typical}
    groups: list[tuple[str, list[dict[str, object]]]] = [("", []), ("slower approaches, on their own scale", [])]
    for k, v in by.items():
        groups[k in slow][1].append({"label": APPROACHES[k][0], "points": [(i + 1, r.seconds) for i, r in enumerate(v)]})
    title = f"modelcar packaging, {size_label} model: wall time of every run"
    if not (slow and len(slow) < len(by)):
        return svgplot.line_chart(groups[0][1] + groups[1][1], title=title, x_label="round", y_label="seconds")
    return svgplot.panel_chart([g for g in groups if g[1]], title=title, x_label="round", y_label="seconds")


def write_report(out: Path, size_label: str, model_bytes: int, floors: list[float], rounds: int, results: list[Result], setup: str) -> Path:
    """Writes bench-package-<size>.md (the table, ending with a link to the plot), .json (every run) and .svg
    (the plot of every run) side by side into `out`; returns the markdown file's path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-package-{size_label.lower()}"  # names built by hand: a size like 1.5GiB has a dot in it
    svg = out / f"{stem}.svg"
    text = report(results, model_bytes, size_label, median(floors), rounds, setup)
    text += f"\n\n![wall time of every run per approach]({svg.name})\n"
    data = {"size": size_label, "model_bytes": model_bytes, "cpus": os.cpu_count(), "sha256_floor_cpu_s_per_gib": floors,
            "rounds": rounds, "results": [asdict(r) for r in results]}  # fmt: skip
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    svg.write_text(plot(results, size_label))
    md = out / f"{stem}.md"
    md.write_text(text)
    return md


def main() -> None:
    """The benchmark's command. Why one function: the rounds, the table and the CPU report are one run's output,
    printed as it goes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2GiB", help="model size, e.g. 2GiB or 8GiB")
    p.add_argument("--files", type=int, default=0, help="weight shards (default: one per started GiB, at least 2)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-out", help="where the report (markdown + JSON) is written")
    p.add_argument("--workdir", type=Path, default=ROOT / ".bench", help="scratch for model, registries and builds (removed after)")
    p.add_argument(
        "--approaches",
        default="raw1,ours1,raw2,ours2,s3read,relay2,stream2,buildah,olot",
        help="comma-separated, from: " + ", ".join(APPROACHES),
    )
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds (each approach runs once per round)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--baseline", metavar="REF", help="git revision whose packager baseours1/2, basestream2 and basererun2 run (A/B in the same rounds)"
    )
    p.add_argument(
        "--pin",
        choices=("auto", "none"),
        default="auto",
        help="auto: the packager (raw sender, source reader), the registry and the S3 server on a third of the CPUs each "
        "(on 2 CPUs: the packager on one, both servers on the other), so no server shares the packager's cores "
        "(sched_setaffinity, like taskset)",
    )
    args = p.parse_args()
    size = parse_size(args.size)
    shards = args.files or max(2, -(-size // GiB))
    names = [n.strip() for n in args.approaches.split(",") if n.strip()]
    unknown = [n for n in names if n not in APPROACHES]
    if unknown or args.repeat < 1:
        raise SystemExit(f"unknown approaches {unknown} (known: {', '.join(APPROACHES)}) or --repeat < 1")
    if "buildah" in names and os.geteuid() != 0:  # vfs storage with chroot isolation needs root
        print("note: not root, so the original approach (buildah) is left out; run as root to include it", flush=True)
        names = [n for n in names if n != "buildah"]
    olot_bin = Path(sys.executable).with_name("olot")
    missing = [tool for tool, needed in (("buildah", "buildah" in names), ("skopeo", True)) if needed and not shutil.which(tool)]
    missing += ["olot (pip: the dev lock has it)"] if "olot" in names and not olot_bin.exists() else []
    if missing or not registry_available():
        tools = ", ".join(missing) or "docker-registry/htpasswd"
        raise SystemExit(f"missing tools: {tools} (apt: docker-registry skopeo buildah apache2-utils)")
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True)
    free = shutil.disk_usage(args.workdir).free
    need = size * (6 if "buildah" in names else 3)
    if free < need:
        raise SystemExit(f"{free / GiB:.1f} GiB free under {args.workdir}; this run needs about {need / GiB:.0f} GiB")
    (args.workdir / "logs").mkdir()
    stack = ExitStack()
    try:
        print(f"generating a {args.size} model ({shards} shards + 4 JSON files) in {args.workdir / 'model'} ...", flush=True)
        env = Env(args.workdir, args.workdir / "model" / "models", [], args.workdir / "logs", {})
        env.cpus, env.server_cpus, env.source_cpus = split_cpus(args.pin)
        if args.baseline:
            env.baseline = baseline_tree(args.baseline, args.workdir / "baseline")
        if env.server_cpus:  # this process (its monitoring threads) and the servers it starts: the servers' CPUs
            os.sched_setaffinity(0, env.server_cpus)
        load = os.getloadavg()
        env.files = make_model(env.model_dir, size, shards)
        env.digests = {path: file_digest(path) for path in env.files}  # the raw reference's, untimed
        model_bytes = sum(f.stat().st_size for f in env.files)
        if any(n in ("s3read", "relay2", "stream2", "basestream2", "rerun2", "basererun2") for n in names):
            print("starting moto S3 and uploading the model to s3://bench/m/ (untimed) ...", flush=True)
            env.s3 = stack.enter_context(run_s3())
            pin(moto_pid(env.s3.endpoint), env.source_cpus)
            client = env.s3.client()
            client.create_bucket(Bucket="bench")
            for path in env.files:
                client.upload_file(str(path), "bench", f"m/{path.name}")
        floors: list[float] = []
        results: list[Result] = []
        for round_no in range(1, args.repeat + 1):
            for name in names:
                print(f"round {round_no}/{args.repeat}: {APPROACHES[name][0]} ...", flush=True)
                slug = f"{name}-{round_no}"  # names the registry, repository and scratch dirs
                result = APPROACHES[name][1](env, slug)
                result.name = name
                print(f"  {result.seconds:.1f}s, {result.rate(model_bytes):.0f} MB/s, CPU {result.cpu_user:.1f}+{result.cpu_sys:.1f}s, "
                      f"registry CPU {result.registry_cpu:.1f}s, S3 CPU {result.source_cpu:.1f}s, "
                      f"peak scratch {human(result.peak_scratch)}", flush=True)  # fmt: skip
                results.append(result)
                shutil.rmtree(args.workdir / slug, ignore_errors=True)
            with ThreadPoolExecutor(max_workers=1, initializer=pinned(env.cpus)) as pool:  # on the packager's CPUs
                floors.append(pool.submit(sha256_floor, env.files).result())
            print(f"  sha256 floor: {floors[-1]:.3f} CPU-s/GiB", flush=True)
        pinning = "no CPU pinning"
        if env.cpus and env.server_cpus and env.source_cpus:
            servers = (f"registry and S3 server on CPUs {sorted(env.server_cpus)}" if env.server_cpus == env.source_cpus else
                       f"registry on CPUs {sorted(env.server_cpus)}, S3 server on CPUs {sorted(env.source_cpus)}")  # fmt: skip
            pinning = f"packager / raw sender / source reader on CPUs {sorted(env.cpus)}, {servers} (sched_setaffinity)"
        setup = (f"load average (1/5/15 min) {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the start, "
                 "{:.1f}/{:.1f}/{:.1f} at the end; ".format(*os.getloadavg()) + pinning)  # fmt: skip
        md = write_report(args.out, args.size, model_bytes, floors, args.repeat, results, setup)
        print("\n" + md.read_text())
        print(f"report written to {md} / .json / .svg (plot of every run)")
    finally:
        stack.close()
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
