#!/usr/bin/env python3
"""Modelcar packaging benchmark: the product packager against the registry's raw ingest rate,
the original approach (buildah bud + push) and the peer approach (olot + skopeo).

One run generates a synthetic model once (incompressible random bytes in safetensors-like shards
plus small JSON files) and pushes it to a local docker-registry with every approach:

  raw      the registry's blob-ingest rate: digests computed beforehand (untimed), then one
           monolithic PUT per file, sent with sendfile(). The physical reference.
  ours     steps/package.py, run as the deployed script text (steps.embed.step_script).
  buildah  `buildah bud` (FROM <base>, COPY models /models; vfs, chroot isolation, --root /
           --runroot / TMPDIR in a scratch dir) + `buildah push`.
  olot     `skopeo copy` of the base into an OCI layout, `olot` (one layer per file), then
           `skopeo copy --preserve-digests oci:… docker://…`.

Each approach gets a fresh registry storage and repository, so no blob is shared. A sampler
polls the disk usage of the approach's scratch locations (TMPDIR, buildah root/runroot, OCI
layout, the digest cache, growth of /var/tmp) every 0.2 s; "peak scratch" is the largest
growth seen, i.e. node-ephemeral space the approach needs besides the model directory.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from steps.embed import step_script
from tests.fixtures.images import push_base
from tests.fixtures.registry import Registry, registry_available, run_registry

ROOT = Path(__file__).resolve().parents[1]

MiB = 1 << 20
GiB = 1 << 30
SCRATCH_TARGET = 64 * MiB
THROUGHPUT_TARGET = 0.70


@dataclass
class Result:
    name: str  # approach key, "#2" when it runs again
    seconds: float
    peak_scratch: int
    peak_rss: int

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
    """Bytes allocated on disk under `path` (files that vanish mid-walk are ignored)."""
    try:
        if not path.is_dir():
            return path.lstat().st_blocks * 512
    except FileNotFoundError:
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
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


class Runner:
    """Runs commands with output in a log file; samples the resident memory of each command's process tree."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.peak_rss = 0

    def __call__(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            while proc.poll() is None:
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


def raw_ingest(registry: Registry, repo: str, files: list[Path]) -> float:
    """Time monolithic PUTs (POST for a session, PUT ?digest= with the body via sendfile)."""
    digests = {p: file_digest(p) for p in files}  # untimed
    auth = "Basic " + base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=600)
    started = time.monotonic()
    for path in files:
        conn.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Authorization": auth, "Content-Length": "0"})
        resp = conn.getresponse()
        resp.read()
        location = resp.getheader("Location", "")
        sep = "&" if "?" in location else "?"
        conn.putrequest("PUT", f"{location}{sep}digest={digests[path]}", skip_accept_encoding=True)
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
    return time.monotonic() - started


@dataclass
class Env:
    work: Path
    model_dir: Path
    files: list[Path]
    logs: Path


@contextmanager
def fresh_registry(env: Env, name: str, with_base: bool) -> Iterator[tuple[Registry, str]]:
    """A registry with empty storage for one approach (removed afterwards) and its base image."""
    with run_registry(env.work / "registries", name) as registry:
        yield registry, push_base(env.work / "registries" / name, registry, "base/shell:1") if with_base else ""
    shutil.rmtree(env.work / "registries" / name, ignore_errors=True)


def approach_raw(env: Env, name: str) -> Result:
    with fresh_registry(env, name, with_base=False) as (registry, _):
        tmp = env.work / name / "tmp"
        tmp.mkdir(parents=True)
        with ScratchSampler([tmp]) as sampler:
            seconds = raw_ingest(registry, f"bench/{name}", env.files)
    return Result(name, seconds, sampler.peak, 0)


def approach_ours(env: Env, name: str, jobs: int = 2) -> Result:
    scratch = env.work / name
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True)
    script = scratch / "package.py"
    script.write_text(step_script("package"))
    cache = env.model_dir.parent / f".{env.model_dir.name}.digests.json"
    cache.unlink(missing_ok=True)  # cold: every layer is hashed while it is uploaded
    run = Runner(env.logs)
    with fresh_registry(env, name, with_base=True) as (registry, base):
        authfile = registry.authfile(scratch / "auth.json")
        cmd = [sys.executable, str(script), "--model-dir", str(env.model_dir), "--image", f"{registry.host}/bench/{name}:v1"]
        cmd += ["--base-image", base, "--authfile", str(authfile), "--plain-http", "--progress-interval", "10", "--jobs", str(jobs)]
        with ScratchSampler([tmp, cache, Path("/var/tmp")]) as sampler:
            started = time.monotonic()
            run(name, cmd, env={**os.environ, "TMPDIR": str(tmp)})
            seconds = time.monotonic() - started
    return Result(name, seconds, sampler.peak, run.peak_rss)


def approach_buildah(env: Env, name: str) -> Result:
    scratch = env.work / name
    dirs = {k: scratch / k for k in ("root", "runroot", "tmp")}
    for d in dirs.values():
        d.mkdir(parents=True)
    run = Runner(env.logs)
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
    return Result(name, seconds, sampler.peak, run.peak_rss)


def approach_olot(env: Env, name: str) -> Result:
    scratch = env.work / name
    layout, tmp = scratch / "layout", scratch / "tmp"
    tmp.mkdir(parents=True)
    run = Runner(env.logs)
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
    return Result(name, seconds, sampler.peak, run.peak_rss)


APPROACHES: dict[str, tuple[str, Callable[[Env, str], Result]]] = {
    "raw": ("raw blob ingest (reference, 1 stream)", approach_raw),
    "ours": ("ours: steps/package.py (default --jobs 2)", approach_ours),
    "ours1": ("ours: steps/package.py --jobs 1", functools.partial(approach_ours, jobs=1)),
    "buildah": ("original: buildah bud + push", approach_buildah),
    "olot": ("peer: olot + skopeo", approach_olot),
}


def report(results: list[Result], model_bytes: int, size_label: str) -> str:
    raws = [r for r in results if r.name.split("#")[0] == "raw"]
    reference = sum(r.rate(model_bytes) for r in raws) / len(raws) if raws else 0.0
    lines = [
        f"modelcar packaging benchmark: {size_label} model ({model_bytes / 1e6:.0f} MB), local docker-registry, {os.cpu_count()} CPUs",
        "",
        "| approach | wall s | MB/s | % of raw ingest | peak scratch | × model | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        title = APPROACHES[r.name.split("#")[0]][0] + (" (repeat)" if "#" in r.name else "")
        pct = f"{100 * r.rate(model_bytes) / reference:.0f} %" if reference else "n/a"
        rss = human(r.peak_rss) if r.peak_rss else "–"
        lines.append(
            f"| {title} | {r.seconds:.1f} | {r.rate(model_bytes):.0f} | {pct} | {human(r.peak_scratch)} | "
            f"{r.peak_scratch / model_bytes:.2f} | {rss} |"
        )
    ours = next((r for r in results if r.name == "ours"), None)
    if ours is not None:
        lines.append("")
        scratch_ok = ours.peak_scratch <= SCRATCH_TARGET
        lines.append(f"{'PASS' if scratch_ok else 'MISS'}: ours peak scratch {human(ours.peak_scratch)} (target ≤ 64 MiB)")
        if reference:
            share = ours.rate(model_bytes) / reference
            lines.append(f"{'PASS' if share >= THROUGHPUT_TARGET else 'MISS'}: ours at {100 * share:.0f} % of raw ingest (target ≥ 70 %)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2GiB", help="model size, e.g. 2GiB or 8GiB")
    p.add_argument("--files", type=int, default=0, help="weight shards (default: one per started GiB, at least 2)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-out", help="where the report (markdown + JSON) is written")
    p.add_argument("--workdir", type=Path, default=ROOT / ".bench", help="scratch for model, registries and builds (removed after)")
    p.add_argument("--approaches", default="raw,ours,ours1,buildah,olot,raw", help="comma-separated; raw twice brackets the others")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    size = parse_size(args.size)
    shards = args.files or max(2, -(-size // GiB))
    names = [n.strip() for n in args.approaches.split(",") if n.strip()]
    missing = [tool for tool, needed in (("buildah", "buildah" in names), ("skopeo", True)) if needed and not shutil.which(tool)]
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
    try:
        print(f"generating a {args.size} model ({shards} shards + 4 JSON files) in {args.workdir / 'model'} ...", flush=True)
        env = Env(args.workdir, args.workdir / "model" / "models", [], args.workdir / "logs")
        env.files = make_model(env.model_dir, size, shards)
        model_bytes = sum(f.stat().st_size for f in env.files)
        results: list[Result] = []
        for name in names:
            label = name if name not in [r.name for r in results] else f"{name}#2"
            print(f"running {APPROACHES[name][0]} ...", flush=True)
            slug = label.replace("#", "-")  # names the registry, repository and scratch dirs
            result = APPROACHES[name][1](env, slug)
            result.name = label
            print(f"  {result.seconds:.1f}s, {result.rate(model_bytes):.0f} MB/s, peak scratch {human(result.peak_scratch)}", flush=True)
            results.append(result)
            shutil.rmtree(args.workdir / slug, ignore_errors=True)
        text = report(results, model_bytes, args.size)
        print("\n" + text)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"bench-package-{args.size.lower()}"
        (args.out / f"{stem}.md").write_text(text + "\n")
        data = {"size": args.size, "model_bytes": model_bytes, "cpus": os.cpu_count(), "results": [asdict(r) for r in results]}
        (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"\nreport written to {args.out / stem}.md / .json")
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
