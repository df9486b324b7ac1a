"""Package a model directory as a KServe modelcar image and push it straight into a registry.

The image is the base image's layers and config plus one uncompressed GNU-tar layer per model
file under /models. Every layer is streamed from the model file into the registry's blob upload
(OCI distribution API: POST, PATCH, PUT ?digest=) while it is hashed, so nothing is staged on
local disk. Layers are deterministic, so a re-run finds every blob with a HEAD request (digests
come from the digest cache on the workspace, or when streaming from the `<tag>.resume` record in the
registry) and uploads nothing. Blobs above the chunk threshold are sent as several PATCH requests; a
dropped upload is resumed from the registry's reported offset or restarted. The tag is written last,
after every blob is in the registry.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import ssl
import stat
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from .lib.images import ImageRef, registry_credentials
from .lib.layout import LAYER_TYPES, SOURCE_ANNOTATION, build_config, build_manifest, manifest_annotations, previous_layers, resolve_base
from .lib.model import DigestCache, Expected, LayerLayout, check_layer_sizes, check_listed, default_digest_cache, model_files
from .lib.pusher import BlobPusher, Reader, UploadSettings, limit_bytes
from .lib.registry import OCI_MANIFEST, RegistryClient, TransientError, sha256_digest
from .lib.resume import ResumeRecord
from .lib.runtime import EXIT_INTEGRITY, EXIT_NOT_FOUND, EXIT_REMOTE, Progress, StepError, human, log, parse_size, write_result
from .lib.s3 import botocore_client
from .lib.source import ModelSource, SourceSettings, Wanted, open_source, uri_problem


def tls_context(verify: bool, ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, help="directory with the model files")
    p.add_argument("--source", help="instead of --model-dir: s3://bucket[/prefix] or hf://org/name, streamed into the upload")
    p.add_argument("--hf-endpoint", help="Hugging Face endpoint for an hf:// --source (default: HF_ENDPOINT or huggingface.co)")
    p.add_argument("--hf-revision", default="main", help="branch, tag or commit of an hf:// --source (empty: the default branch)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint for --source (default: AWS_ENDPOINT_URL or AWS)")
    p.add_argument("--s3-region", default="us-east-1")
    p.add_argument("--s3-ca-file", help="CA bundle for the S3 endpoint")
    p.add_argument("--include", action="extend", nargs="*", default=[], help="--source: globs to package (default: as download)")
    p.add_argument("--exclude", action="extend", nargs="*", default=[], help="--source: globs to skip")
    p.add_argument("--image", required=True, help="destination, e.g. quay.io/org/model:tag")
    p.add_argument("--base-image", required=True, help="runnable base with a shell, e.g. registry.access.redhat.com/ubi9/ubi-micro:9.5")
    p.add_argument("--platform", default="linux/amd64", help="platform to pick from a multi-arch base")
    p.add_argument("--authfile", help="docker config.json / .dockerconfigjson for the destination (and base)")
    p.add_argument("--base-authfile", help="authfile for the base image registry (default: --authfile)")
    p.add_argument("--plain-http", action="store_true", help="talk plain HTTP to the registries (local test registries)")
    p.add_argument("--tls-verify", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ca-file", help="CA bundle for the registries (e.g. the cluster service CA)")
    p.add_argument("--digest-cache", type=Path, help="digest cache file (default: .<model-dir name>.digests.json next to it)")
    p.add_argument(
        "--chunk-threshold",
        type=parse_size,
        default="2GB",
        help="blobs larger than this are uploaded in chunks (resumable; fits proxies' request-size limits)",
    )
    p.add_argument("--chunk-size", type=parse_size, default="1GiB", help="PATCH size for chunked uploads")
    p.add_argument(
        "--max-layer-size",
        type=lambda v: parse_size(v) if v else 0,
        default=0,
        help="refuse (before any upload) a file whose layer would be larger, e.g. 20GB (Quay's default)",
    )
    p.add_argument("--jobs", type=int, default=2, help="blobs uploaded in parallel")
    p.add_argument("--retries", type=int, default=5, help="retries per blob after a dropped connection or 5xx")
    p.add_argument("--retry-delay", type=float, default=2.0, help="first retry delay in seconds (doubles)")
    p.add_argument("--timeout", type=float, default=600.0, help="socket timeout in seconds")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument(
        "--annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="manifest annotation, e.g. org.opencontainers.image.source=hf://org/name (empty VALUE: left out)",
    )
    p.add_argument("--result-digest", help="file to write the manifest digest to (Tekton result)")
    p.add_argument("--result-image", help="file to write <registry>/<repo>@<digest> to (Tekton result)")
    args = p.parse_args(argv)
    if args.chunk_size <= 0 or args.chunk_size > args.chunk_threshold:
        p.error("--chunk-size must be positive and not larger than --chunk-threshold")
    if args.jobs < 1 or args.retries < 0:
        p.error("--jobs must be >= 1 and --retries >= 0")
    if (args.model_dir is None) == (not args.source):
        p.error("give exactly one of --model-dir or --source")
    if args.source and (problem := uri_problem(args.source)):
        p.error(f"--source {problem}")
    if any("=" not in a or not a.partition("=")[0] for a in args.annotation):
        p.error("--annotation needs KEY=VALUE")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    dest, base = ImageRef.parse(args.image), ImageRef.parse(args.base_image)
    if dest.digest or not dest.tag:
        raise StepError(f"--image needs a tag (and no digest): {args.image}")
    s3: ModelSource | None = None
    if args.source:
        # importing botocore and building its S3 client make ~60,000 long-lived objects; the cyclic GC would walk them again and again
        # while they are made (~0.06 CPU-s a run). Collect nothing meanwhile, then freeze them out of later collections.
        gc.disable()
        try:
            settings = SourceSettings(
                s3_client=lambda: botocore_client(args.s3_endpoint_url, args.s3_region, args.s3_ca_file),
                s3_ca_file=args.s3_ca_file, hf_endpoint=args.hf_endpoint, hf_revision=args.hf_revision,
            )  # fmt: skip
            s3 = open_source(args.source, Wanted(args.include, args.exclude, "package"), settings)
        finally:
            gc.freeze()
            gc.enable()
        given = {a.partition("=")[0] for a in args.annotation if a.partition("=")[2]}  # what the download step would report
        args.annotation += [f"{k}={v}" for k, v in s3.annotations().items() if k not in given]
    if s3 is not None:
        files: list[tuple[str, Path | None]] = [(rel, None) for rel in sorted(s3.files)]
        check_layer_sizes({rel: obj.expected.size for rel, obj in s3.files.items()}, args.max_layer_size)
        cache = DigestCache(args.digest_cache)  # no local files: in memory unless a file is given
    else:
        local = model_files(args.model_dir)
        if not local:
            raise StepError(f"no model files in {args.model_dir}", EXIT_NOT_FOUND)
        check_layer_sizes({rel: path.stat().st_size for rel, path in local if not path.is_symlink()}, args.max_layer_size)
        files = list(local)
        cache = DigestCache(args.digest_cache or default_digest_cache(args.model_dir))
    ctx = tls_context(args.tls_verify, args.ca_file)
    same_registry = base.registry == dest.registry
    scopes = [f"repository:{dest.repository}:pull,push"]
    if same_registry and base.repository != dest.repository:
        scopes.append(f"repository:{base.repository}:pull")
    client = RegistryClient(
        dest.registry,
        registry_credentials(args.authfile, dest.registry, dest.repository),
        scopes,
        plain_http=args.plain_http,
        tls_context=ctx,
        timeout=args.timeout,
        retries=args.retries,
        retry_delay=args.retry_delay,
    )
    source = client
    if not same_registry:
        source = RegistryClient(
            base.registry,
            registry_credentials(args.base_authfile or args.authfile, base.registry, base.repository),
            [f"repository:{base.repository}:pull"],
            plain_http=args.plain_http,
            tls_context=ctx,
            timeout=args.timeout,
            retries=args.retries,
            retry_delay=args.retry_delay,
        )
    started = time.monotonic()
    try:
        digest = package(args, dest, base, files, cache, client, source, s3)
    except TransientError as exc:
        raise StepError(str(exc), EXIT_REMOTE) from exc
    log(f"pushed {dest} as {digest} in {time.monotonic() - started:.1f}s")
    write_result(args.result_digest, digest)
    write_result(args.result_image, f"{dest.registry}/{dest.repository}@{digest}")


def package(
    args: argparse.Namespace,
    dest: ImageRef,
    base: ImageRef,
    files: list[tuple[str, Path | None]],
    cache: DigestCache,
    client: RegistryClient,
    source: RegistryClient,
    s3: ModelSource | None = None,
) -> str:
    """Why one function: its helpers (`push_one`, `push_streamed`, `verify_source`) are closures over one run's
    state (client, pusher, cache, record, listing); the order of the run (base layers, model layers, config,
    manifest, record) reads top to bottom."""
    listed = {rel: os.lstat(path) for rel, path in files if path is not None}  # what the reads must find again
    base_manifest, base_digest = resolve_base(source, base, args.platform)
    for layer in base_manifest["layers"]:
        if layer["mediaType"] not in LAYER_TYPES:
            raise StepError(f"base image {base}: unsupported layer type {layer['mediaType']}")
    base_config = json.loads(source.get_blob(base.repository, base_manifest["config"]["digest"]))
    record: ResumeRecord | None = None
    if s3 is not None:
        layouts = {rel: LayerLayout.for_file(rel, s3.files[rel].expected.size) for rel, _ in files}
        previous = previous_layers(client, dest)
        record = ResumeRecord(client, dest, base_manifest, base_config, base_digest, str(base))
        record.load()
    else:
        layouts = {rel: LayerLayout.for_path(rel, path) for rel, path in files if path is not None}
    log_source = args.source or args.model_dir
    total = sum(d["size"] for d in base_manifest["layers"]) + sum(lay.size for lay in layouts.values())
    log(f"packaging {len(files)} files ({human(total)} with base layers) from {log_source} into {dest}")
    progress = Progress("upload", total, args.progress_interval)
    settings = UploadSettings(args.chunk_threshold, args.chunk_size, args.retries, args.retry_delay)
    pusher = BlobPusher(client, dest.repository, settings, progress)
    pusher.cut_short = s3 is not None

    def base_layer_reader(url: str) -> Reader:
        return lambda off, _end: source.open_stream(url, off)

    for layer in base_manifest["layers"]:
        digest, size = layer["digest"], layer["size"]
        if client.blob_exists(dest.repository, digest):
            progress.advance(size)
        elif source is client and client.mount_blob(dest.repository, digest, base.repository):
            progress.advance(size)
            log(f"base layer {digest[:19]}: mounted from {base.repository}")
        else:
            got = pusher.push(f"base layer {digest[:19]}", size, base_layer_reader(f"/v2/{base.repository}/blobs/{digest}"))
            if got != digest:
                raise StepError(f"base layer {digest} arrived as {got}", EXIT_INTEGRITY)

    abort = threading.Event()  # set by the first failure: queued files are not started

    def push_file(item: tuple[str, Path | None]) -> tuple[str, str, int]:
        if abort.is_set():
            raise StepError("aborted after an earlier failure")
        try:
            return push_one(*item)
        except BaseException:
            abort.set()
            raise

    def push_one(rel: str, path: Path | None) -> tuple[str, str, int]:
        layout = layouts[rel]
        if s3 is not None:
            return push_streamed(rel, layout)
        assert path is not None
        was = listed[rel]
        check_listed(path, was)  # swapped or gone since the listing: one line, at once, before any byte
        recheck = lambda _state: check_listed(path, was)  # noqa: E731  (again before the blob is committed)
        if stat.S_ISLNK(was.st_mode):  # a symlink entry: a few KiB of headers, hashed here, no cache
            link = sha256_digest(layout.head + layout.tail)
            if not client.blob_exists(dest.repository, link):
                pusher.push(rel, layout.size, lambda off, _end: iter([memoryview(layout.head + layout.tail)[off:]]), check=recheck)
            else:
                progress.advance(layout.size)
            log(f"{rel}: symbolic link to {os.readlink(path)} as {link[:19]}")
            return rel, link, layout.size
        entry = cache.get(rel, path)
        known = entry.get("layer_digest") if entry and entry.get("layer_size") == layout.size else None
        if known and client.blob_exists(dest.repository, known):
            progress.advance(layout.size)
            log(f"{rel}: {known[:19]} already in {dest.registry}, skipped")
            return rel, known, layout.size
        begun = time.monotonic()
        # A chunked upload an earlier run left unfinished (same file, same destination) continues.
        target = f"{dest.registry}/{dest.repository}"
        earlier = entry.get("upload") if entry else None
        resume = earlier if isinstance(earlier, dict) and earlier.get("target") == target else None

        def remember(state: dict[str, Any] | None) -> bool:
            cache.put(rel, path, upload={**state, "target": target} if state else None)
            return cache.path is not None  # on the workspace claim: a retry of the Task finds it

        reader = lambda off, _end: layout.read(path, off, listed=listed[rel])  # noqa: E731
        digest = pusher.push(rel, layout.size, reader, digest=known, resume=resume, on_state=remember, check=recheck)
        if known and known != digest:
            log(f"WARNING: {rel}: cached digest {known[:19]} was stale")
        cache.put(rel, path, layer_digest=digest, layer_size=layout.size)
        secs = time.monotonic() - begun
        log(f"{rel}: uploaded {human(layout.size)} as {digest[:19]} in {secs:.1f}s ({layout.size / max(secs, 1e-6) / 1e6:.0f} MB/s)")
        return rel, digest, layout.size

    def verify_source(rel: str, layout: LayerLayout, expected: Expected) -> str:
        """The layer digest the source's bytes make, read once and checked against the source's checksum
        (exit 3 on a mismatch); nothing is sent. Counted apart (`verified`)."""
        assert s3 is not None
        reader, state = s3.reader(rel, layout), s3.hasher(rel, layout)
        try:
            for piece in limit_bytes(reader(0, layout.size), layout.size):
                state.update(piece)
        finally:
            reader.close()
        state.verify(rel)
        with pusher._count_lock:
            pusher.verified += layout.size
        return "sha256:" + state.hexdigest()

    def push_streamed(rel: str, layout: LayerLayout) -> tuple[str, str, int]:
        """Source → registry with no local copy: the layer digest and the source checksum are computed
        on the way; a mismatch cancels the upload before its final PUT (no manifest is written)."""
        assert s3 is not None and record is not None
        tag = s3.tag(rel)
        earlier = record.uploads.get(rel)
        resume = earlier if earlier and earlier.get("source") == tag else None
        expected = s3.files[rel].expected
        done = record.layers.get(rel)
        # The tag and the record are written by whoever may push: a layer they name is a hint, reused only once
        # the source's bytes, read and checked here, make that very digest (and the registry holds it).
        hints = {
            d: where
            for (d, src), where in (
                (previous.get(rel, ("", "")), "the tag"),
                ((done[0], done[2]) if done else ("", ""), "the resume record"),
            )
            if d and src == tag
        }
        if hints and resume is None and any(client.blob_exists(dest.repository, d) for d in hints):
            digest = verify_source(rel, layout, expected)
            for d, where in hints.items():
                if d != digest:
                    log(f"WARNING: {rel}: {where} names {d[:19]} for this source object; the source's bytes make {digest[:19]}")
            if client.blob_exists(dest.repository, digest):
                progress.advance(layout.size)
                record.layer_done(rel, digest, layout.size, tag)
                via = hints.get(digest, "its digest")
                log(f"{rel}: {digest[:19]} already in {dest.registry}, verified to be the source's bytes: nothing sent (found via {via})")
                return rel, digest, layout.size
        begun = time.monotonic()
        reader = s3.reader(rel, layout)
        try:
            digest = pusher.push(
                rel, layout.size, reader, resume=resume,
                on_state=lambda state: record.upload_state(rel, tag, state),
                new_hasher=lambda: s3.hasher(rel, layout), check=lambda state: state.verify(rel),
            )  # fmt: skip
        finally:
            reader.close()
        record.layer_done(rel, digest, layout.size, tag)
        secs = time.monotonic() - begun
        gets = f", {reader.body.requests} GETs" if reader.body.requests > 1 else ""
        log(f"{rel}: streamed {human(layout.size)} as {digest[:19]} in {secs:.1f}s, source {expected.describe()} verified{gets}")
        return rel, digest, layout.size

    # Largest files first keeps the parallel uploads busy until the end.
    order = sorted(files, key=lambda item: -layouts[item[0]].size)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(push_file, item) for item in order]
        try:
            pushed = {result[0]: result for result in (f.result() for f in as_completed(futures))}
        except BaseException:
            abort.set()  # queued uploads stop; a re-run skips finished blobs via the digest cache
            for future in futures:
                future.cancel()
            raise
    layers = [pushed[rel] for rel, _ in files]
    progress.finish()
    log(f"{pusher.uploaded} blobs uploaded, {len(files) + len(base_manifest['layers']) - pusher.uploaded} already present")

    config = build_config(base_config, [(rel, digest) for rel, digest, _ in layers])
    config_digest = sha256_digest(config)
    if not client.blob_exists(dest.repository, config_digest):
        pusher.push("config", len(config), lambda off, _end: iter([memoryview(config)[off:]]))
    notes = {rel: {SOURCE_ANNOTATION: s3.tag(rel)} for rel, _, _ in layers} if s3 is not None else {}
    manifest = build_manifest(config, base_manifest["layers"], layers, str(base), base_digest, manifest_annotations(args.annotation), notes)
    # Every blob is in the registry now; only this last request makes the tag point at the image.
    digest = client.put_manifest(dest.repository, dest.tag or "", manifest, OCI_MANIFEST)
    if record is not None:
        record.delete()
    if pusher.reread:
        log(f"source bytes re-read to rebuild hash states after resumes: {pusher.reread} ({human(pusher.reread)})")
    if pusher.verified:
        log(f"source bytes read to check the layers a record or the tag named: {pusher.verified} ({human(pusher.verified)})")
    return digest
