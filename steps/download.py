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
import base64
import glob
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .lib.model import DEFAULT_INCLUDE, DigestCache, Expected, LayerLayout, check_layer_sizes, default_digest_cache, s3_expected, select
from .lib.runtime import (
    DISK_ERRORS,
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_INTEGRITY,
    EXIT_NOT_FOUND,
    EXIT_REMOTE,
    READ_SIZE,
    MiB,
    Progress,
    StepError,
    env_secret,
    human,
    log,
    parse_size,
    write_result,
    writing,
)
from .lib.s3 import add_s3_args, s3_client, s3_error, s3_exceptions

HF_DEFAULT_INCLUDE = DEFAULT_INCLUDE


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
    layer = hashlib.sha256(layout.head)
    check: Any = None
    parts: list[bytes] = []
    if expected.kind == "git-sha1":
        check = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)  # git's object id
    elif expected.kind in ("md5", "md5-multipart"):
        check = hashlib.md5(usedforsecurity=False)  # S3 ETag
    elif expected.kind in ("sha256", "sha256-base64"):
        check = hashlib.sha256()
    in_part = 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(READ_SIZE)
        view = memoryview(buf)
        while got := fh.readinto(buf):
            data = view[:got]
            layer.update(data)
            if expected.kind != "md5-multipart":
                if check is not None:
                    check.update(data)
                continue
            while len(data):  # split the read at part boundaries
                take = min(len(data), expected.part_size - in_part)
                check.update(data[:take])
                in_part += take
                data = data[take:]
                if in_part == expected.part_size:
                    parts.append(check.digest())
                    check, in_part = hashlib.md5(usedforsecurity=False), 0
    layer.update(layout.tail)
    if expected.kind == "md5-multipart":
        if in_part or not parts:
            parts.append(check.digest())
        actual = f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
    elif expected.kind == "sha256-base64":
        actual = base64.b64encode(check.digest()).decode()
    else:
        actual = check.hexdigest() if check is not None else ""
    if expected.kind and actual != expected.value:
        path.unlink()
        raise StepError(
            f"{rel}: checksum mismatch, expected {expected.describe()}, got {actual} (corrupt download); file removed", EXIT_INTEGRITY
        )
    return {"layer_digest": "sha256:" + layer.hexdigest(), "layer_size": layout.size}


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


# --- S3 ----------------------------------------------------------------------------------------


def download_s3(args: argparse.Namespace, cache: DigestCache) -> int:
    from boto3.s3.transfer import TransferConfig

    bucket, _, prefix = args.source[len("s3://") :].partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    client = s3_client(args)
    where = f"s3://{bucket}/{prefix}"
    try:
        keys: dict[str, str] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if rel and not rel.endswith("/"):
                    keys[rel] = obj["Key"]
    except s3_exceptions() as exc:
        raise s3_error(exc, f"listing {where}") from exc
    chosen = select(list(keys), args.include or ["*"], args.exclude)
    if not chosen:
        raise StepError(f"no objects to download under {where} (include={args.include or ['*']})", EXIT_NOT_FOUND)
    try:
        heads = {rel: client.head_object(Bucket=bucket, Key=keys[rel], ChecksumMode="ENABLED") for rel in chosen}
        expected = {rel: s3_expected(client, bucket, keys[rel], heads[rel]) for rel in chosen}
    except s3_exceptions() as exc:
        raise s3_error(exc, f"reading object metadata under {where}") from exc
    check_layer_sizes({rel: e.size for rel, e in expected.items()}, args.max_layer_size)
    total = sum(e.size for e in expected.values())
    log(f"downloading {len(chosen)} files ({human(total)}) from {where} to {args.dest}")
    progress = Progress("download", total, args.progress_interval)
    transfer = TransferConfig(max_concurrency=args.max_workers, multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB)
    verifier = Verifier(cache, workers=2)
    for rel in chosen:
        final = args.dest / rel
        source = f"s3:{heads[rel].get('ETag', '')}:{expected[rel].size}"
        if final.exists() and (cache.get(rel, final) or {}).get("source") == source:
            log(f"{rel}: already downloaded and verified, skipped")
            progress.advance(expected[rel].size)
            continue
        partial = final.with_name(f".{final.name}.partial")
        try:
            with writing(final, "download destination"):
                final.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, keys[rel], str(partial), Callback=progress.advance, Config=transfer)
        except StepError:
            partial.unlink(missing_ok=True)
            raise
        except s3_exceptions() as exc:
            partial.unlink(missing_ok=True)
            raise s3_error(exc, f"downloading s3://{bucket}/{keys[rel]}") from exc
        verifier.submit(partial, final, rel, expected[rel], source)
    verifier.wait()
    progress.finish()
    check_remote_code(args.dest, chosen)
    return total


# --- Hugging Face ------------------------------------------------------------------------------


def _bytes_under(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:  # renamed from .incomplete while we looked
            pass
    return total


def _watch(dest: Path, progress: Progress, stop: threading.Event) -> None:
    """Report download progress from the bytes arriving on disk (huggingface_hub has no byte callback)."""
    start = _bytes_under(dest)
    while not stop.wait(progress.interval):
        progress.advance(min(_bytes_under(dest) - start, progress.total) - progress.done)


def download_hf(args: argparse.Namespace, cache: DigestCache) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    repo_id = args.source[len("hf://") :].strip("/")
    token = env_secret("HF_TOKEN")
    api = HfApi(endpoint=args.hf_endpoint, token=token)
    try:
        info = api.repo_info(repo_id, revision=args.revision or None)
        commit = info.sha
        card = getattr(info, "card_data", None) or getattr(info, "cardData", None) or {}
        license_id = card.get("license") if hasattr(card, "get") else getattr(card, "license", None)
        args.found_revision, args.found_license = commit or "", str(license_id or "")
        tree = {f.path: f for f in api.list_repo_tree(repo_id, revision=commit, recursive=True) if isinstance(f, RepoFile)}
    except (GatedRepoError, RepositoryNotFoundError) as exc:
        hint = "HF_TOKEN is set" if token else "HF_TOKEN is not set"
        raise StepError(f"hf://{repo_id}: repository not found or not accessible ({hint})", EXIT_AUTH) from exc
    except RevisionNotFoundError as exc:
        raise StepError(f"hf://{repo_id}: revision {args.revision!r} not found", EXIT_NOT_FOUND) from exc
    except Exception as exc:  # huggingface_hub raises HTTP-library errors for network failures
        raise StepError(f"hf://{repo_id}: {type(exc).__name__}: {exc}", EXIT_REMOTE) from exc
    chosen = select(list(tree), args.include or HF_DEFAULT_INCLUDE, args.exclude)
    if not chosen:
        raise StepError(f"hf://{repo_id}@{commit}: no files match the include patterns", EXIT_NOT_FOUND)
    expected = {}
    for rel in chosen:
        entry = tree[rel]
        lfs = entry.lfs
        expected[rel] = Expected(entry.size, "sha256", lfs.sha256) if lfs else Expected(entry.size, "git-sha1", entry.blob_id)
    check_layer_sizes({rel: e.size for rel, e in expected.items()}, args.max_layer_size)
    sources = {rel: f"hf:{commit}:{expected[rel].value}" for rel in chosen}
    todo = [r for r in chosen if not ((args.dest / r).exists() and (cache.get(r, args.dest / r) or {}).get("source") == sources[r])]
    total = sum(e.size for e in expected.values())
    log(f"downloading {len(todo)} of {len(chosen)} files ({human(total)}) from hf://{repo_id}@{commit} to {args.dest}")
    if todo:
        progress = Progress("download", sum(expected[r].size for r in todo), args.progress_interval)
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(args.dest, progress, stop), daemon=True)
        watcher.start()
        try:
            snapshot_download(
                repo_id,
                revision=commit,
                local_dir=args.dest,
                allow_patterns=[glob.escape(r) for r in todo],
                token=token,
                max_workers=args.max_workers,
                endpoint=args.hf_endpoint,
            )
        except Exception as exc:  # see above: network and HTTP failures surface as library-specific types
            if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
                raise StepError(f"cannot write download destination {exc.filename or args.dest}: {exc.strerror}") from exc
            raise StepError(f"hf://{repo_id}: download failed: {type(exc).__name__}: {exc}", EXIT_REMOTE) from exc
        finally:
            stop.set()
            watcher.join()
        progress.advance(progress.total - progress.done)
        progress.finish()
    for rel in todo:
        path = args.dest / rel
        if not path.is_file():
            raise StepError(f"{rel}: missing after download", EXIT_INTEGRITY)
        cache.put(rel, path, source=sources[rel], **verify(path, rel, expected[rel]))
        log(f"{rel}: verified ({expected[rel].describe()})")
    check_remote_code(args.dest, chosen)
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
    if not args.source.startswith(("s3://", "hf://")) or len(args.source) <= len("s3://"):
        p.error("--source must be s3://bucket[/prefix] or hf://org/name")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        args.dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StepError(f"cannot create {args.dest}: {exc}", EXIT_FAILED) from exc
    cache = DigestCache(args.digest_cache or default_digest_cache(args.dest))
    started = time.monotonic()
    fetch: Callable[[argparse.Namespace, DigestCache], int] = download_s3 if args.source.startswith("s3://") else download_hf
    args.found_revision = args.found_license = ""
    total = fetch(args, cache)
    log(f"{human(total)} in {args.dest}, verified, in {time.monotonic() - started:.1f}s")
    write_result(args.result_size, str(total))
    # Always written (empty when unknown): a result another task references must exist.
    write_result(args.result_revision, args.found_revision)
    write_result(args.result_license, args.found_license)
