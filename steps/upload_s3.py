"""Upload the model files of a directory to S3: multipart, streamed from disk, with progress.

Parts carry SHA-256 checksums that S3 verifies on receipt. Objects that already exist with the
same size and the same modelcar layer digest (recorded as object metadata from the digest cache)
are skipped, so a re-run uploads only what changed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .lib.model import DigestCache, default_digest_cache, matches, model_files
from .lib.runtime import EXIT_NOT_FOUND, MiB, Progress, StepError, human, log, parse_size, write_result
from .lib.s3 import add_s3_args, bucket_and_prefix, s3_client, s3_error, s3_exceptions
from .lib.source import split_uri

DIGEST_META = "modelcar-layer-digest"


def already_there(client: Any, bucket: str, key: str, size: int, digest: str | None) -> bool:
    from botocore.exceptions import ClientError

    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return bool(digest) and head["ContentLength"] == size and head.get("Metadata", {}).get(DIGEST_META) == digest


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, type=Path, help="model directory")
    p.add_argument("--dest", required=True, help="s3://bucket/prefix/")
    # nargs="*": a Tekton array param expands to several values after one flag (none when empty)
    p.add_argument("--include", action="extend", nargs="*", default=[], help="globs to upload (default: all)")
    p.add_argument("--exclude", action="extend", nargs="*", default=[], help="globs to skip")
    add_s3_args(p)
    p.add_argument("--max-workers", type=int, default=8, help="parallel part uploads")
    p.add_argument("--part-size", type=parse_size, default="64MiB", help="multipart part size (5MiB..5GiB)")
    p.add_argument("--digest-cache", type=Path, help="digest cache written by download/package (default: next to --src)")
    p.add_argument("--progress-interval", type=float, default=5.0)
    p.add_argument("--result-uri", help="file to write s3://bucket/prefix/ to (Tekton result)")
    args = p.parse_args(argv)
    try:
        scheme, args.location = split_uri(args.dest)
    except ValueError:
        scheme = ""
    if scheme != "s3":
        p.error("--dest must be s3://bucket[/prefix]")
    if not 5 * MiB <= args.part_size <= 5 * 1024 * MiB:
        p.error("--part-size must be between 5MiB and 5GiB (S3 limits)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from boto3.s3.transfer import TransferConfig

    args = parse_args(argv)
    bucket, prefix = bucket_and_prefix(args.location)
    files = [(rel, path) for rel, path in model_files(args.src) if matches(rel, args.include or ["*"]) and not matches(rel, args.exclude)]
    if not files:
        raise StepError(f"no files to upload in {args.src}", EXIT_NOT_FOUND)
    cache = DigestCache(args.digest_cache or default_digest_cache(args.src))
    client = s3_client(args)
    total = sum(path.stat().st_size for _, path in files)
    uri = f"s3://{bucket}/{prefix}"
    log(f"uploading {len(files)} files ({human(total)}) from {args.src} to {uri}")
    progress = Progress("upload", total, args.progress_interval)
    transfer = TransferConfig(multipart_threshold=args.part_size, multipart_chunksize=args.part_size, max_concurrency=args.max_workers)
    started = time.monotonic()
    for rel, path in files:
        key, size = prefix + rel, path.stat().st_size
        digest = (cache.get(rel, path) or {}).get("layer_digest")
        try:
            if already_there(client, bucket, key, size, digest):
                log(f"{rel}: already in {uri} (same size and digest), skipped")
                progress.advance(size)
                continue
            extra = {"ChecksumAlgorithm": "SHA256", "Metadata": {DIGEST_META: digest} if digest else {}}
            client.upload_file(str(path), bucket, key, ExtraArgs=extra, Callback=progress.advance, Config=transfer)
        except s3_exceptions() as exc:
            raise s3_error(exc, f"uploading {rel} to s3://{bucket}/{key}") from exc
        log(f"{rel}: uploaded {human(size)}")
    progress.finish()
    log(f"{human(total)} in {uri} after {time.monotonic() - started:.1f}s")
    write_result(args.result_uri, uri)
