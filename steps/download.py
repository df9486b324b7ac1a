"""Download model weights from S3 or Hugging Face into a directory and verify every file.

S3 (`--source s3://bucket/prefix`): every object under the prefix, via boto3 (custom endpoint,
path-style addressing for MinIO). Each file is checked against its size and checksum: the
object's full-object ChecksumSHA256 when it has one, otherwise its ETag (the MD5 of a
single-part upload, or the MD5 of part MD5s of a multipart upload).
Hugging Face (`--source hf://org/name`): snapshot_download of the selected files at the
resolved commit; LFS files are checked against their sha256, small files against their git
blob id. `consolidated*.safetensors` / `consolidated*.pth` are skipped when sharded weights exist.

A file that fails verification is deleted and the step exits non-zero. Verified files are
recorded in the digest cache together with the digest of their modelcar layer (computed in the
same read), so a re-run skips them and the package step can HEAD-check without reading them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .lib.checksum import SourceHasher
from .lib.model import DigestCache, Expected, LayerLayout, check_layer_sizes, default_digest_cache
from .lib.runtime import (
    EXIT_FAILED,
    EXIT_INTEGRITY,
    READ_SIZE,
    Progress,
    StepError,
    human,
    log,
    parse_size,
    write_result,
)
from .lib.s3 import add_s3_args, s3_client
from .lib.source import ModelSource, SourceSettings, Wanted, open_source, uri_problem


def check_remote_code(dest: Path, chosen: Sequence[str]) -> None:
    """A model with `auto_map` in config.json (trust_remote_code) needs its Python modules in the image."""
    config = dest / "config.json"
    if not config.is_file():
        return
    try:
        auto_map = json.loads(config.read_text(encoding="utf-8")).get("auto_map") or {}
    except (ValueError, OSError, AttributeError):
        return
    refs = [v for value in auto_map.values() for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    needed = {ref.split(".")[0] + ".py" for ref in refs if "--" not in ref}  # "other/repo--module.Class" lives elsewhere
    missing = sorted(n for n in needed if n not in chosen)
    if missing:
        raise StepError(
            f"config.json's auto_map needs {', '.join(missing)}, which the include patterns leave out; add '*.py' to include "
            "(the model would not load)"
        )


def verify(path: Path, rel: str, expected: Expected) -> dict[str, Any]:
    """Check size and checksum of `path`; return the digest-cache values (layer digest computed in the same read)."""
    size = path.stat().st_size
    if size != expected.size:
        path.unlink()
        raise StepError(f"{rel}: size {size} != expected {expected.size} (partial download); file removed", EXIT_INTEGRITY)
    layout = LayerLayout.for_file(rel, size)
    state = SourceHasher(len(layout.head), expected)  # the layer's sha256 and the source's checksum, one read
    state.update(layout.head)
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(READ_SIZE)
        view = memoryview(buf)
        while got := fh.readinto(buf):
            state.update(view[:got])
    state.update(layout.tail)
    actual = state.actual()
    if actual is not None and actual != expected.value:
        path.unlink()
        raise StepError(
            f"{rel}: checksum mismatch, expected {expected.describe()}, got {actual} (corrupt download); file removed", EXIT_INTEGRITY
        )
    return {"layer_digest": "sha256:" + state.hexdigest(), "layer_size": layout.size}


class Verifier:
    """Verifies finished files in the background while the next one downloads."""

    def __init__(self, cache: DigestCache, workers: int) -> None:
        self.cache = cache
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.pending: list[Future[None]] = []

    def submit(self, partial: Path, final: Path, rel: str, expected: Expected, source: str) -> None:
        def work() -> None:
            values = verify(partial, rel, expected)
            os.replace(partial, final)
            self.cache.put(rel, final, source=source, **values)
            log(f"{rel}: verified ({expected.describe()})")

        self.raise_failures()
        self.pending.append(self.pool.submit(work))

    def raise_failures(self) -> None:
        for fut in self.pending:
            if fut.done() and fut.exception() is not None:
                self.pool.shutdown(cancel_futures=True)
                fut.result()

    def wait(self) -> None:
        for fut in self.pending:
            fut.result()
        self.pool.shutdown()


def fetch(source: ModelSource, args: argparse.Namespace, cache: DigestCache) -> int:
    """Every listed file not yet downloaded and verified against the same source version, fetched by the source and
    verified here (the next file downloads meanwhile); returns the bytes of all listed files."""
    expected = {rel: f.expected for rel, f in source.files.items()}
    check_layer_sizes({rel: e.size for rel, e in expected.items()}, args.max_layer_size)
    todo = []
    for rel in sorted(expected):
        if (args.dest / rel).exists() and (cache.get(rel, args.dest / rel) or {}).get("source") == source.tag(rel):
            log(f"{rel}: already downloaded and verified, skipped")
        else:
            todo.append(rel)
    total = sum(e.size for e in expected.values())
    at = f"{source.where}@{source.revision}" if source.revision else source.where
    log(f"downloading {len(todo)} of {len(expected)} files ({human(total)}) from {at} to {args.dest}")
    progress = Progress("download", sum(expected[r].size for r in todo), args.progress_interval)
    verifier = Verifier(cache, workers=2)
    for rel, written in source.fetch(todo, args.dest, args.max_workers, progress):
        verifier.submit(written, args.dest / rel, rel, expected[rel], source.tag(rel))
    verifier.wait()
    progress.finish()
    check_remote_code(args.dest, list(expected))
    return total


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, help="s3://bucket/prefix or hf://org/name")
    p.add_argument("--dest", required=True, type=Path, help="directory to download into (on the workspace PVC)")
    # nargs="*": a Tekton array param expands to several values after one flag (none when empty)
    p.add_argument("--include", action="extend", nargs="*", default=[], help="globs on the relative path or file name")
    p.add_argument("--exclude", action="extend", nargs="*", default=[], help="globs to skip")
    p.add_argument("--revision", default="main", help="Hugging Face branch, tag or commit (empty: the default branch)")
    p.add_argument("--hf-endpoint", help="Hugging Face endpoint (default: HF_ENDPOINT or huggingface.co)")
    add_s3_args(p)
    p.add_argument("--max-workers", type=int, default=8, help="parallel connections")
    p.add_argument("--digest-cache", type=Path, help="digest cache file (default: .<dest name>.digests.json next to --dest)")
    p.add_argument("--progress-interval", type=float, default=5.0)
    p.add_argument(
        "--max-layer-size",
        type=lambda v: parse_size(v) if v else 0,
        default=0,
        help="refuse (before downloading) a file whose modelcar layer would be larger, e.g. 20GB (Quay's default)",
    )
    p.add_argument("--result-size", help="file to write the total size in bytes to (Tekton result)")
    p.add_argument("--result-revision", help="file to write the resolved Hugging Face commit to (empty for S3)")
    p.add_argument("--result-license", help="file to write the model card's license to (empty when unknown)")
    args = p.parse_args(argv)
    if problem := uri_problem(args.source):
        p.error(f"--source {problem}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        args.dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StepError(f"cannot create {args.dest}: {exc}", EXIT_FAILED) from exc
    cache = DigestCache(args.digest_cache or default_digest_cache(args.dest))
    started = time.monotonic()
    settings = SourceSettings(
        s3_client=lambda: (s3_client(args), None), s3_ca_file=args.ca_file, hf_endpoint=args.hf_endpoint, hf_revision=args.revision
    )
    source = open_source(args.source, Wanted(args.include, args.exclude, "download"), settings)
    total = fetch(source, args, cache)
    log(f"{human(total)} in {args.dest}, verified, in {time.monotonic() - started:.1f}s")
    write_result(args.result_size, str(total))
    # Always written (empty when unknown): a result another task references must exist.
    write_result(args.result_revision, source.revision)
    write_result(args.result_license, source.license)
