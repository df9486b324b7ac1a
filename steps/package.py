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
import base64
import gc
import hashlib
import http.client
import itertools
import json
import os
import re
import ssl
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lib.images import ImageRef, registry_credentials
from .lib.model import (
    DEFAULT_INCLUDE,
    LAYER_MEDIA_TYPE,
    MODEL_ROOT,
    DigestCache,
    Expected,
    LayerLayout,
    check_layer_sizes,
    check_listed,
    default_digest_cache,
    model_files,
    path_rule,
    s3_expected,
    select,
)
from .lib.registry import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    STREAM_READ,
    AuthExpired,
    ChunkRefused,
    RegistryClient,
    TransientError,
    sha256_digest,
)
from .lib.runtime import (
    EXIT_AUTH,
    EXIT_INTEGRITY,
    EXIT_NOT_FOUND,
    EXIT_REMOTE,
    Progress,
    StepError,
    backoff,
    human,
    log,
    parse_size,
    write_result,
)
from .lib.s3 import s3_error, s3_exceptions

# Base-image layers keep their bytes (and digests); Docker media types get their OCI names.
LAYER_TYPES = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar": LAYER_MEDIA_TYPE,
    "application/vnd.oci.image.layer.v1.tar+gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    LAYER_MEDIA_TYPE: LAYER_MEDIA_TYPE,
}
_RANGE_RE = re.compile(r"^(?:bytes=)?(\d+)-(\d+)$")
Reader = Callable[[int, int], Iterator[memoryview]]
"""`reader(offset, end)`: a blob's bytes from `offset`; a ranged source reads only up to `end` (the chunk's)."""
# Slowest rate (bytes/s) at which we expect a registry to commit a blob on the final PUT: a 40 GB
# blob gets 2000 s before the socket times out (the answer to a 0-byte request, not a stall).
COMMIT_RATE = 20e6


@dataclass
class UploadSettings:
    chunk_threshold: int
    chunk_size: int
    retries: int
    retry_delay: float


def parse_range(value: str) -> tuple[int, int] | None:
    """Candidate byte counts for an upload-status `Range: 0-<n>`: (n + 1, n).

    distribution (and the OCI spec) send the last byte's index, `0-<count - 1>`; Quay's upload
    status answers `0-<count>` (quay/quay endpoints/v2/blob.py: `fetch_existing_upload` renders
    `byte_count + 1` through `_render_range`, which subtracts one; its 416 answer,
    `_abort_range_not_satisfiable`, sends `0-<byte_count>` as well). A fresh session may say `0-0`.
    """
    match = _RANGE_RE.match(value.strip())
    if not match or match.group(1) != "0":
        return None
    last = int(match.group(2))
    return last + 1, last


class DigestRefused(TransientError):
    """The registry computed another digest for the session's bytes than the one hashed here."""


class _Upload:
    """State of one blob upload session: URL, acknowledged offset, hash states at known offsets."""

    def __init__(
        self,
        location: str,
        min_chunk: int,
        new_hasher: Callable[[], Any] = hashlib.sha256,
        check: Callable[[Any], None] | None = None,
    ) -> None:
        self.location, self.min_chunk, self.new_hasher, self.check = location, min_chunk, new_hasher, check
        self.acked = 0
        self.marks: dict[int, Any] = {0: new_hasher()}  # offset -> hash state of the bytes before it
        self.sent: tuple[int, Any] | None = None  # (end, hash) of a chunk sent whole but not acknowledged
        self.overlap_refused = False  # set by the first ambiguous resume; a second one takes distribution's reading


class BlobPusher:
    """Uploads blobs into one repository, hashing in the same pass and resuming dropped uploads.

    After any failure the registry is asked what it holds (GET on the upload URL) and the upload
    continues from there; a blob whose final request was lost is found by HEAD. A new session is
    opened only when the registry has dropped the old one, and sessions given up are cancelled
    (DELETE). The failure budget (`retries`) counts failures without progress in between.
    """

    def __init__(self, client: RegistryClient, repo: str, settings: UploadSettings, progress: Progress) -> None:
        self.client, self.repo, self.settings, self.progress = client, repo, settings, progress
        self.uploaded = 0
        self.cut_short = False  # streamed sources: PATCH bodies chunked, so a failing source ends a body cleanly
        self.reread = 0  # bytes read again from the source to rebuild hash states (resumes)
        self.verified = 0  # bytes of layers named by a record or the tag, read from the source to check them
        self._count_lock = threading.Lock()

    def push(
        self,
        name: str,
        size: int,
        reader: Reader,
        digest: str | None = None,
        resume: dict[str, Any] | None = None,
        on_state: Callable[[dict[str, Any] | None], object] | None = None,
        new_hasher: Callable[[], Any] = hashlib.sha256,
        check: Callable[[Any], None] | None = None,
    ) -> str:
        """Upload `size` bytes from `reader(offset, end)`; return the digest the registry accepted.

        `digest`, when known beforehand, lets a recovery find the finished blob by HEAD even
        before every byte has been hashed in this run. `resume` is the state an earlier run left
        (`{"location", "acked"}`); `on_state` is told the state after every acknowledged chunk of
        a chunked upload (and None when the blob is complete), so a later run can continue it.
        `new_hasher` makes the hash state (default sha256; `SourceHasher` also checks the source's own
        checksum) and `check(state)` runs on the complete state before the final PUT: an exception
        there cancels the session, so a blob whose source bytes fail verification is never committed.
        """
        blob = (new_hasher, check)  # per push: the pusher is shared by the upload threads
        chunk = size if size <= self.settings.chunk_threshold else self.settings.chunk_size
        up: _Upload | None = None
        failures, auth_failures, progress_mark, refused = 0, 0, -1, 0
        recover, kept = False, False  # kept: the session's state is durably recorded (a later run resumes it)
        resume_at = 0  # an earlier run's acknowledged offset, until the hash up to it is rebuilt
        if resume:
            up, continued = self._resumable(name, size, resume, blob)
            if up is not None and not continued:  # a session opened here instead
                chunk = max(chunk, up.min_chunk)
            if continued:
                kept = recover = True
                resume_at = int(resume["acked"])
                log(f"{name}: continuing the upload an earlier run left at byte {resume_at}")
        while True:
            try:
                if resume_at and up is not None:
                    # Re-read the acknowledged prefix (a hash state cannot be saved) only for a session that is
                    # still there; an unreachable status keeps the offset for the next attempt.
                    reply = self.client.request("GET", up.location)
                    if reply.status >= 500:
                        raise TransientError(f"upload status: HTTP {reply.status} (session kept)")
                    if reply.status == 204:
                        self._hash_at(up, resume_at, reader)
                        up.acked = resume_at
                        self.progress.advance(up.acked)
                    resume_at = 0
                if recover and up is not None:
                    recover, earlier = False, up
                    up = self._recover(name, up, reader, size, digest)
                    kept = kept and up is earlier  # a new session is recorded once its first chunk is acknowledged
                    if up.location == "":
                        return self._finished(up, on_state)
                    chunk = max(chunk, up.min_chunk)
                if up is None:
                    up = self._start(*blob)
                    chunk = max(chunk, up.min_chunk)
                while up.acked < size:
                    end = min(up.acked + chunk, size)
                    up.location, cut = self._patch(up, end, reader)
                    if on_state is not None and size > chunk:
                        kept = bool(on_state({"location": up.location, "acked": up.acked}))
                    if cut is not None:  # the source failed part-way; the registry keeps what it got
                        log(f"{name}: the source failed at byte {up.acked} of the blob; the registry holds every byte before it")
                        raise cut
                self._verify(up, size)
                self._finish(up, "sha256:" + up.marks[size].hexdigest(), size)
                return self._finished(up, on_state)
            except StepError as exc:
                # A session no later run will resume is cancelled; one whose state is recorded is kept
                # unless its bytes failed verification (then nothing of it may be committed).
                if up is not None and up.location and (not kept or exc.code == EXIT_INTEGRITY):
                    self._cancel(up.location, name)
                    if kept and on_state is not None:
                        on_state(None)
                raise
            except ChunkRefused as exc:
                if up is None:
                    raise StepError(f"upload of {name}: {exc}", EXIT_REMOTE) from exc
                smaller = max(chunk // 2, up.min_chunk, 1)
                if smaller >= chunk or chunk <= 1 << 20:
                    self._give_up(up, name, kept)
                    raise StepError(
                        f"upload of {name}: the registry refuses requests of {human(chunk)} (HTTP 413) and the chunk cannot "
                        f"shrink further (minimum {human(max(up.min_chunk, 1 << 20))}); lower --chunk-size "
                        "(modelPipeline.chunkSize) if a proxy limits request bodies",
                        EXIT_REMOTE,
                    ) from exc
                log(f"{name}: registry refused a {human(chunk)} request (HTTP 413); continuing in chunks of {human(smaller)}")
                chunk, recover = smaller, True
            except TransientError as exc:
                if up is not None and up.acked > progress_mark:
                    # progress since the last failure: a fresh budget, and renewals that worked are no failures
                    failures, auth_failures, progress_mark = 0, 0, up.acked
                failures += 1
                auth_failures = auth_failures + 1 if isinstance(exc, AuthExpired) else 0
                refused = refused + 1 if " 416" in str(exc) else 0
                if auth_failures > 2:
                    self._give_up(up, name, kept)
                    raise StepError(f"upload of {name}: credentials refused again after renewal ({exc})", EXIT_AUTH) from exc
                if failures > self.settings.retries:
                    self._give_up(up, name, kept)
                    hint = ""
                    if refused > 1:
                        hint = (
                            f"; the registry (or a proxy in front of it) keeps refusing {human(chunk)} requests with HTTP 416: "
                            "lower --chunk-size (modelPipeline.chunkSize)"
                        )
                    raise StepError(f"upload of {name} failed after {self.settings.retries} retries: {exc}{hint}", EXIT_REMOTE) from exc
                delay = 0.0 if isinstance(exc, AuthExpired) and auth_failures == 1 else backoff(failures, self.settings.retry_delay)
                log(f"{name}: {exc}; retry {failures}/{self.settings.retries} in {delay:.1f}s")
                time.sleep(delay)
                if isinstance(exc, DigestRefused) and up is not None:
                    # The session holds other bytes than the ones hashed here (a session someone else wrote into,
                    # named by a forged record): it can never commit this blob. Drop it and start again.
                    self._cancel(up.location, name)
                    if kept and on_state is not None:
                        on_state(None)
                    self.progress.advance(-up.acked)
                    up, kept = None, False
                recover = up is not None

    def _resumable(self, name: str, size: int, resume: dict[str, Any], blob: tuple[Any, Any]) -> tuple[_Upload | None, bool]:
        """The recorded session to continue, or None. A record is data anyone with push rights can write: its
        offset must lie in the blob, and its URL must be an upload session of this repository on the registry or
        on an upload host the registry names in this run (a POST here asks; that fresh session is returned, with
        False, when the recorded host is not one of them). Nothing is ever sent to another host."""
        acked = resume.get("acked")
        if not isinstance(acked, int) or isinstance(acked, bool) or not 0 <= acked <= size:
            log(f"WARNING: {name}: the resume record's offset {acked!r} is not in the blob (0 to {size} bytes); starting a new upload")
            return None, False
        location = str(resume.get("location") or "")
        url = self.client.session_url(location, self.repo)
        if url is None and location:
            fresh = self._start(*blob)  # the registry's answer names the upload hosts of this run
            url = self.client.session_url(location, self.repo)
            if url is None:
                host = urllib.parse.urlsplit(self.client.absolute(location)).netloc
                log(
                    f"WARNING: {name}: the resume record names an upload session on {host}, not an upload session of "
                    f"{self.repo} on {self.client.registry} or a host it named; nothing is sent there, starting a new upload"
                )
                return fresh, False
            self._cancel(fresh.location, name)
        return (_Upload(url, 0, *blob), True) if url else (None, False)

    def _give_up(self, up: _Upload | None, name: str, kept: bool) -> None:
        """The step fails on this blob: a recorded session stays for the next run, any other is cancelled."""
        if up is None or not up.location:
            return
        if kept:
            log(f"{name}: upload session kept at byte {up.acked}; a re-run continues it")
        else:
            self._cancel(up.location, name)

    def _verify(self, up: _Upload, size: int) -> None:
        if up.check is None:
            return
        up.check(up.marks[size])  # raises StepError (exit 3): push cancels the session, nothing is committed

    def _finished(self, up: _Upload, on_state: Callable[[dict[str, Any] | None], object] | None) -> str:
        if on_state is not None:
            on_state(None)
        with self._count_lock:
            self.uploaded += 1
        return "sha256:" + up.marks[max(up.marks)].hexdigest()

    def _start(self, new_hasher: Callable[[], Any] = hashlib.sha256, check: Callable[[Any], None] | None = None) -> _Upload:
        reply = self.client.request("POST", f"/v2/{self.repo}/blobs/uploads/", body=b"")
        self.client.check(reply, f"start upload to {self.client.registry}/{self.repo}", (202,))
        min_chunk = reply.header("OCI-Chunk-Min-Length")
        return _Upload(self.client.upload_location(reply, "", trust=True), int(min_chunk) if min_chunk.isdigit() else 0, new_hasher, check)

    def _patch(self, up: _Upload, end: int, reader: Reader) -> tuple[str, Exception | None]:
        """Send [acked, end); return the session's next URL, and the source's error when a streamed body (chunked, see
        `cut_short`) ended early: the registry then holds what was sent and the session goes on from there."""
        start, sent = up.acked, 0
        hasher = up.marks[start].copy()

        def count(chunk: memoryview) -> None:
            nonlocal sent
            hasher.update(chunk)
            sent += len(chunk)
            self.progress.advance(len(chunk))

        headers = {"Content-Type": "application/octet-stream", "Content-Range": f"{start}-{end - 1}"}
        up.sent = None
        try:
            body = _limit(reader(start, end), end - start)
            # The first piece before the request: readers open their source before their first piece, so a
            # source that fails (a 404, a swapped file) fails before a half-sent PATCH leaves the registry a
            # partly written chunk (distribution cannot then resume nor cancel the session: its `_state` is stale).
            first = next(body, None)
            chunks = body if first is None else itertools.chain([first], body)
            reply = self.client.stream("PATCH", up.location, headers, end - start, chunks, count, chunked=self.cut_short)
        except (TransientError, ChunkRefused):
            self.progress.advance(-sent)
            if sent == end - start:
                up.sent = (end, hasher)  # all of it went out: the registry may hold it (lost answer)
            raise
        if reply.status == 416:
            self.progress.advance(-sent)
            raise TransientError(f"PATCH {start}-{end - 1}: HTTP 416 (registry holds {reply.header('Range') or 'another range'})")
        if reply.status == 404:  # distribution's BLOB_UPLOAD_INVALID/UNKNOWN: the session is gone (a restart with a new secret)
            self.progress.advance(-sent)
            raise TransientError(f"PATCH {start}-{end - 1}: HTTP 404 {reply.error_text()} (the registry no longer accepts the session)")
        if reply.cut is not None:
            held = parse_range(reply.header("Range")) if reply.status == 202 else None
            if sent == 0 or held is None or start + sent not in held:
                self.progress.advance(-sent)
                raise reply.cut  # what the registry holds is unclear: the recovery asks it
            end = start + sent
        else:
            self.client.check(reply, f"PATCH blob upload ({start}-{end - 1})", (202,))
        up.acked = end
        up.marks[end] = hasher
        return self.client.upload_location(reply, up.location), reply.cut  # a PATCH answer names no new host

    def _finish(self, up: _Upload, digest: str, size: int) -> None:
        sep = "&" if "?" in up.location else "?"
        # The registry answers the final PUT after it has committed the blob: distribution may re-read it
        # to verify the digest, Quay assembles chunks in its storage. Allow that time for large blobs.
        wait = max(self.client.timeout, size / COMMIT_RATE)
        reply = self.client.request("PUT", f"{up.location}{sep}digest={digest}", {"Content-Length": "0"}, timeout=wait)
        if reply.status == 404 and self.client.blob_exists(self.repo, digest):
            log(f"{digest[:19]}: the final request had completed (its answer was lost)")
            return
        if reply.status == 404:  # the session is gone (a registry restart with a new secret): the recovery starts again
            raise TransientError(f"complete upload {digest}: HTTP 404 {reply.error_text()} (the registry no longer accepts the session)")
        if reply.status == 400 and "DIGEST_INVALID" in reply.error_text():
            raise DigestRefused(f"registry computed a different digest than {digest} (data changed in transit?)")
        self.client.check(reply, f"complete upload {digest}", (201, 204))

    def _cancel(self, location: str, name: str) -> None:
        """DELETE an upload session nobody will resume; best effort (RegistryClient.cancel_upload)."""
        self.client.cancel_upload(location, name)

    def _hash_at(self, up: _Upload, offset: int, reader: Reader) -> None:
        """Make sure the hash state at `offset` is known: continue from the nearest known one by
        reading the blob's bytes again (from the file, or the source it is streamed from)."""
        if offset in up.marks:
            return
        base = max(m for m in up.marks if m <= offset)
        hasher = up.marks[base].copy()
        with self._count_lock:
            self.reread += offset - base
        for piece in _limit(reader(base, offset), offset - base) if offset > base else ():
            hasher.update(piece)
        up.marks[offset] = hasher

    def _recover(self, name: str, up: _Upload, reader: Reader, size: int, digest: str | None) -> _Upload:
        """Ask the registry what it holds and continue from there.

        Returns the session to continue (its `acked` set to the registry's offset), a session with
        location "" when the blob turned out to be complete (found by HEAD), or a fresh session
        when the registry dropped the old one.
        """
        sent = up.sent
        if sent is not None and sent[0] == size:
            up.marks[size] = sent[1]
        full = digest or ("sha256:" + up.marks[size].hexdigest() if size in up.marks else None)
        if full and self.client.blob_exists(self.repo, full):
            log(f"{name}: the registry already holds {full[:19]} (the answer to the last request was lost)")
            if size not in up.marks:
                self._hash_at(up, size, reader)
            self._verify(up, size)
            self._cancel(up.location, name)
            up.location = ""
            return up
        # Where does the upload stand? A status request that fails (unreachable, 5xx after the client's own
        # retries) says nothing about the session: keep it and its hash marks, and let the blob's budget retry.
        # Quay keys a session by its UUID alone (endpoints/v2/blob.py: fetch_existing_upload answers the stored
        # byte count, cancel_upload deletes it), so there a lost answer costs at most the chunk in flight.
        reply = self.client.request("GET", up.location)
        if reply.status >= 500:
            raise TransientError(f"upload status: HTTP {reply.status} (session kept)")
        candidates = parse_range(reply.header("Range")) if reply.status == 204 else None
        if candidates is None:
            # The registry no longer accepts the session. distribution answers 404 BLOB_UPLOAD_INVALID when
            # the stored size differs from the offset signed into `_state` (a lost PATCH answer, a partly
            # received chunk) and cancels it itself (registry/handlers/blobupload.go, ResumeBlobUpload); a
            # status request cannot carry another offset (the state is HMAC-signed). DELETE it anyway so
            # nothing stays behind on a registry that kept it, then start again.
            lost = up.acked
            self._cancel(up.location, name)
            self.progress.advance(-up.acked)
            fresh = self._start(up.new_hasher, up.check)
            log(f"{name}: upload session lost at byte {lost} (HTTP {reply.status}); new session from byte 0")
            return fresh
        up.location = self.client.upload_location(reply, up.location)  # a GET answer names no new host
        if sent is not None:
            up.marks.setdefault(sent[0], sent[1])
        known = [c for c in candidates if c in up.marks]
        if known:
            offset = known[0]
        else:
            # Ambiguous (a partly stored request): resume from the last offset known to be
            # acknowledged and send the rest again; Quay skips bytes it already holds
            # (data/registry_model/blobuploader.py: BlobUploadManager.upload_chunk). A registry that
            # refuses the overlap answers 416, and the next recovery takes distribution's reading.
            offset = max(m for m in up.marks if m <= min(candidates))
            if up.overlap_refused:
                offset = min(candidates[0], size)
                self._hash_at(up, offset, reader)
            up.overlap_refused = True
        self.progress.advance(offset - up.acked)
        if offset != up.acked:
            log(f"{name}: registry holds {offset} bytes (acknowledged: {up.acked})")
        up.acked = offset
        log(f"{name}: resuming at byte {offset}")
        return up


def _limit(chunks: Iterator[memoryview], length: int) -> Iterator[memoryview]:
    """Yield exactly `length` bytes from `chunks`, then close the underlying reader."""
    try:
        for chunk in chunks:
            if len(chunk) >= length:
                yield chunk[:length]
                return
            yield chunk
            length -= len(chunk)
        raise TransientError("blob source ended early")
    finally:
        getattr(chunks, "close", lambda: None)()


try:  # ISA-L: 14 x zlib's rate here (0.018 against 0.25 CPU-s/GiB)
    from isal.isal_zlib import crc32

    _ISAL = True
except ImportError:
    from zlib import crc32

    _ISAL = False
_crc_lock = threading.Lock()
_crc_pool: ThreadPoolExecutor | None = None


def _crc32(data: memoryview | bytes, value: int) -> int:
    """CRC32 of `data`, with ISA-L in a thread of its own. ISA-L's AVX-512 CRC (isa-l
    crc/crc32_gzip_refl_by16_10.asm, in isal's isal_zlib) works in zmm registers and returns without
    VZEROUPPER (objdump: `.cleanup: not eax; ret`); in a thread whose upper vector state is dirty the
    SSE-encoded SHA-NI code OpenSSL runs for SHA-256 then costs a third more (measured on this project's
    EPYC: 0.60 -> 0.80 CPU-s/GiB, for the rest of that thread's life). Register state is per thread, so the
    upload threads that hash never run it; the hand-off costs ~20 us per call (a few per 8 MiB piece)."""
    global _crc_pool
    if not _ISAL:
        return crc32(data, value)
    with _crc_lock:
        _crc_pool = _crc_pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="crc32")
    return _crc_pool.submit(crc32, data, value).result()


class _Crc32:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def update(self, data: memoryview | bytes) -> None:
        self.value = _crc32(data, self.value)

    def copy(self) -> _Crc32:
        return _Crc32(self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


_CHECKS: dict[str | None, Callable[[], Any]] = {
    "md5": lambda: hashlib.md5(usedforsecurity=False),
    "sha256": hashlib.sha256,
    "crc32": _Crc32,
}


class SourceHasher:
    """SHA-256 of a layer's bytes plus the source's own checksum of the file in it (per part if multipart);
    `copy` keeps both states, so upload resumes keep working."""

    def __init__(self, head_len: int, expected: Expected) -> None:
        self.layer, self.pos, self.head_len, self.expected = hashlib.sha256(), 0, head_len, expected
        kind = str(expected.kind).split("-")[0]
        self.new = _CHECKS.get(kind)
        if kind == "git":  # a small Hugging Face file: its git blob id
            self.new = lambda: hashlib.sha1(f"blob {expected.size}\0".encode(), usedforsecurity=False)
        self.check: Any = self.new() if self.new else None
        self.parts: list[bytes] = []
        self.in_part = 0

    def update(self, data: memoryview | bytes) -> None:
        self.layer.update(data)
        start, self.pos = self.pos, self.pos + len(data)
        lo, hi = max(start, self.head_len), min(self.pos, self.head_len + self.expected.size)
        if self.check is None or lo >= hi:
            return
        piece = memoryview(data)[lo - start : hi - start]
        if not self.expected.part_size:
            self.check.update(piece)
            return
        while len(piece):  # split at part boundaries
            take = min(len(piece), self.expected.part_size - self.in_part)
            self.check.update(piece[:take])
            self.in_part += take
            piece = piece[take:]
            if self.in_part == self.expected.part_size:
                self.parts.append(self.check.digest())
                self.check, self.in_part = self.new(), 0  # type: ignore[misc]

    def copy(self) -> SourceHasher:
        new = SourceHasher.__new__(SourceHasher)
        new.__dict__.update(self.__dict__)
        new.layer, new.parts = self.layer.copy(), list(self.parts)
        new.check = self.check.copy() if self.check is not None else None
        return new

    def hexdigest(self) -> str:
        return self.layer.hexdigest()

    def verify(self, rel: str) -> None:
        """Raise (exit 3) unless the file bytes match the source's checksum."""
        kind = self.expected.kind
        if kind is None:
            return
        check = self.check
        if self.expected.part_size:  # the checksum of the part checksums, then -<parts>
            parts = self.parts + ([check.digest()] if self.in_part or not self.parts else [])
            check = self.new()  # type: ignore[misc]
            check.update(b"".join(parts))
        hexed = kind in ("md5", "md5-multipart", "sha256", "git-sha1")
        actual = check.hexdigest() if hexed else base64.b64encode(check.digest()).decode()
        if self.expected.part_size:
            actual += f"-{len(parts)}"
        if actual != self.expected.value:
            raise StepError(
                f"{rel}: source checksum mismatch, expected {self.expected.describe()}, got {actual}; blob not committed",
                EXIT_INTEGRITY,
            )


class Continued:
    """Ranged reads of one source object served by one open GET, from the first read's offset to the object's end,
    for as long as each read starts where the last one stopped: the chunks of one upload cost one request, not one
    per chunk (no first-byte wait between chunks; moto, which reads the whole object for every ranged GET
    (moto/s3/responses.py `_handle_range_header` slices `key.value`), reads it once). A read that starts elsewhere (a
    resume) opens a new GET from there. A GET that breaks (or ends early) after giving bytes is replaced by one from
    the byte it stopped at, inside the same read: the registry's request in flight never sees it, so a source hiccup
    costs no re-sent chunk (on distribution, a half-sent chunk costs the whole session). The bytes are the same
    object's (If-Match: the listed ETag). `close()` ends the open GET."""

    def __init__(self, open_from: Callable[[int], Iterator[memoryview]], size: int, what: str) -> None:
        self.open_from, self.size, self.what = open_from, size, what
        self.pieces: Iterator[memoryview] | None = None
        self.pos = 0  # the offset the open GET's next byte has
        self.rest: memoryview | None = None  # bytes of the last piece beyond the last read (valid until the next piece)
        self.requests = 0

    def __call__(self, start: int, stop: int) -> Iterator[memoryview]:
        fresh = -1  # the offset of a GET opened by this read that has not yet given a byte
        if self.pieces is None or self.pos != start:
            self._open(start)
            fresh = start
        try:
            while self.pos < stop:
                piece = self.rest
                self.rest = None
                if piece is None:
                    try:
                        piece = next(self.pieces, None)  # type: ignore[arg-type]
                        if piece is None:
                            raise TransientError(f"the source ended at byte {self.pos}, before byte {stop}")
                    except TransientError as exc:
                        if fresh == self.pos:  # a GET opened here broke before its first byte: the upload's retries decide
                            raise TransientError(f"{self.what}: {exc}") from exc
                        log(f"{self.what}: the source's GET broke at byte {self.pos} ({exc}); reading on with a new GET from there")
                        self._open(self.pos)
                        fresh = self.pos
                        continue
                take = min(len(piece), stop - self.pos)
                if take < len(piece):
                    self.rest = piece[take:]
                self.pos += take
                yield piece[:take]
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):  # a consumer that stops early leaves the GET where it is
                self.close()
            raise
        finally:
            if self.pos >= self.size:  # the object's last byte is read: its GET is done
                self.close()

    def _open(self, start: int) -> None:
        self.close()
        self.pieces, self.pos, self.rest = self.open_from(start), start, None
        self.requests += 1

    def close(self) -> None:
        pieces, self.pieces, self.rest = self.pieces, None, None
        if pieces is not None:
            getattr(pieces, "close", lambda: None)()


class FramedReader:
    """The layer's bytes [offset, end) of a streamed file: tar header, the file bytes the chunk needs from the source
    (`Continued`: one GET goes on from chunk to chunk), padding. `close()` ends the source's open GET."""

    def __init__(self, layout: LayerLayout, body: Continued) -> None:
        self.layout, self.body = layout, body

    def __call__(self, offset: int, end: int) -> Iterator[memoryview]:
        layout = self.layout
        head_len, size = len(layout.head), layout.file_size
        start, stop = max(offset - head_len, 0), min(max(end - head_len, 0), size)
        # The source answers before the first piece is yielded: a 404 or refusal fails before a PATCH is sent
        # (a half-sent chunk leaves distribution a session it can neither resume nor cancel).
        pieces = self.body(start, stop) if start < stop else None
        first = next(pieces, None) if pieces is not None else None
        if offset < head_len:
            yield memoryview(layout.head)[offset:]
            offset = head_len
        if pieces is not None:
            if first is not None:
                yield first
            yield from pieces
            offset = head_len + size
        yield memoryview(layout.tail)[offset - head_len - size :]

    def close(self) -> None:
        self.body.close()


@dataclass
class S3Object:
    key: str
    expected: Expected
    etag: str


class S3Source:
    """Model files read straight from S3 (no local copy): listing, expected checksums, ranged reads."""

    def __init__(self, args: argparse.Namespace) -> None:
        # boto3's own layer (its resource model, s3transfer) is not needed for a list, heads and signed GETs: a
        # botocore session gives the same credential chain, endpoint and signer for ~0.1 CPU-s less per run.
        import botocore.session
        from botocore.config import Config

        self.bucket, _, prefix = args.source[len("s3://") :].partition("/")
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"})
        self.session = botocore.session.get_session()
        self.client = self.session.create_client(
            "s3", endpoint_url=args.s3_endpoint_url or None, region_name=args.s3_region or None,
            verify=args.s3_ca_file or True, config=config,
        )  # fmt: skip
        self.ca_file = args.s3_ca_file or None
        self._tls: ssl.SSLContext | None = None  # built for the first https GET (it costs a CA bundle load)
        where = f"s3://{self.bucket}/{self.prefix}"
        try:
            keys = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.prefix) :]
                    if rel and not rel.endswith("/") and path_rule(rel) != "hidden":
                        keys[rel] = obj["Key"]
            chosen = select(list(keys), args.include or list(DEFAULT_INCLUDE), args.exclude)
            self.objects: dict[str, S3Object] = {}
            for rel in chosen:
                head = self.client.head_object(Bucket=self.bucket, Key=keys[rel], ChecksumMode="ENABLED")
                expected = s3_expected(self.client, self.bucket, keys[rel], head, crc=True)
                self.objects[rel] = S3Object(keys[rel], expected, str(head.get("ETag", "")).strip('"'))
        except s3_exceptions() as exc:
            raise s3_error(exc, f"reading {where}") from exc
        if not self.objects:
            raise StepError(f"no objects to package under {where}", EXIT_NOT_FOUND)

    def reader(self, rel: str, layout: LayerLayout) -> FramedReader:
        """Signed (botocore/auth.py S3SigV4Auth.add_auth) ranged GETs into one buffer; If-Match the listed ETag."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        obj, where = self.objects[rel], f"GET s3://{self.bucket}/{self.objects[rel].key}"

        def body(start: int) -> Iterator[memoryview]:
            headers = {"Range": f"bytes={start}-{obj.expected.size - 1}", "If-Match": f'"{obj.etag}"'}
            req = AWSRequest("GET", f"{self.client.meta.endpoint_url}/{self.bucket}/{urllib.parse.quote(obj.key)}", headers)
            S3SigV4Auth(self.session.get_credentials().get_frozen_credentials(), "s3", self.client.meta.region_name).add_auth(req)
            url = urllib.parse.urlsplit(req.url)
            conn = http.client.HTTPConnection(url.netloc, timeout=60)
            if url.scheme == "https":
                self._tls = self._tls or ssl.create_default_context(cafile=self.ca_file)
                conn = http.client.HTTPSConnection(url.netloc, timeout=60, context=self._tls)
            try:
                conn.request("GET", url.path, headers=dict(req.headers.items()))
                resp = conn.getresponse()
                if resp.status != 206:
                    detail = " ".join(resp.read(300).decode("utf-8", "replace").split())  # one line
                    text = f"{where}: HTTP {resp.status} " + ("(no longer exists)" if resp.status == 404 else detail)
                    code = {403: EXIT_AUTH, 404: EXIT_NOT_FOUND, 412: EXIT_INTEGRITY}.get(resp.status)
                    raise StepError(text, code) if code else TransientError(text)
                buf = memoryview(bytearray(8 * STREAM_READ))
                while got := resp.readinto(buf):
                    yield buf[:got]
            except (OSError, http.client.HTTPException) as exc:
                raise TransientError(f"{where}: {type(exc).__name__}: {exc}") from exc
            finally:
                conn.close()

        return FramedReader(layout, Continued(body, obj.expected.size, rel))

    def tag(self, rel: str) -> str:
        """What identifies the source bytes of `rel` (recorded as a layer annotation, compared on re-runs)."""
        obj = self.objects[rel]
        return f"s3:{obj.etag}:{obj.expected.size}"


class HfSource:
    """Model files read straight from the Hugging Face Hub at a resolved commit (no local copy).

    Ranged GETs of `<endpoint>/<repo>/resolve/<commit>/<file>` with `HF_TOKEN` through huggingface_hub's
    httpx client, which drops the Authorization header when the Hub redirects to its CDN. LFS files are
    checked against their sha256, small files against their git blob id.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
        from huggingface_hub.hf_api import RepoFile

        self.repo_id = args.source[len("hf://") :].strip("/")
        self.token = os.environ.get("HF_TOKEN", "").strip() or None
        self.endpoint = (args.hf_endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        api = HfApi(endpoint=self.endpoint, token=self.token)
        try:
            info = api.repo_info(self.repo_id, revision=args.hf_revision or None)
            self.commit = str(info.sha)
            tree = {f.path: f for f in api.list_repo_tree(self.repo_id, revision=self.commit, recursive=True) if isinstance(f, RepoFile)}
        except (GatedRepoError, RepositoryNotFoundError) as exc:
            hint = "HF_TOKEN is set" if self.token else "HF_TOKEN is not set"
            raise StepError(f"hf://{self.repo_id}: repository not found or not accessible ({hint})", EXIT_AUTH) from exc
        except RevisionNotFoundError as exc:
            raise StepError(f"hf://{self.repo_id}: revision {args.hf_revision!r} not found", EXIT_NOT_FOUND) from exc
        except Exception as exc:  # network failures surface as HTTP-library types
            raise StepError(f"hf://{self.repo_id}: {type(exc).__name__}: {exc}", EXIT_REMOTE) from exc
        card = getattr(info, "card_data", None) or {}
        self.license = str((card.get("license") if hasattr(card, "get") else None) or "")
        chosen = select([p for p in tree if path_rule(p) != "hidden"], args.include or list(DEFAULT_INCLUDE), args.exclude)
        if not chosen:
            raise StepError(f"hf://{self.repo_id}@{self.commit}: no files match the include patterns", EXIT_NOT_FOUND)
        self.objects: dict[str, S3Object] = {}
        for rel in chosen:
            entry = tree[rel]
            lfs = entry.lfs
            expected = Expected(entry.size, "sha256", lfs.sha256) if lfs else Expected(entry.size, "git-sha1", entry.blob_id)
            self.objects[rel] = S3Object(rel, expected, expected.value)

    def reader(self, rel: str, layout: LayerLayout) -> FramedReader:
        from huggingface_hub.utils import get_session

        url = f"{self.endpoint}/{self.repo_id}/resolve/{self.commit}/{urllib.parse.quote(rel)}"

        size = self.objects[rel].expected.size

        def body(start: int) -> Iterator[memoryview]:
            headers = {"Range": f"bytes={start}-{size - 1}", "Accept-Encoding": "identity"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            try:
                # huggingface_hub's httpx client drops Authorization on a redirect to another origin (the CDN):
                # encode/httpx httpx/_client.py, BaseClient._redirect_headers
                with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as resp:
                    if resp.status_code in (401, 403):
                        raise StepError(f"hf://{self.repo_id}/{rel}: HTTP {resp.status_code} (HF_TOKEN)", EXIT_AUTH)
                    if resp.status_code == 404:  # gone since the listing: retrying cannot help
                        raise StepError(f"hf://{self.repo_id}/{rel}: no longer exists at {self.commit} (HTTP 404)", EXIT_NOT_FOUND)
                    if resp.status_code != 206:
                        raise TransientError(f"GET {rel} from {self.endpoint}: HTTP {resp.status_code}")
                    for piece in resp.iter_bytes(8 * STREAM_READ):
                        yield memoryview(piece)
            except (StepError, TransientError):
                raise
            except Exception as exc:  # httpx's transport errors (not pinned here: huggingface_hub's dependency)
                raise TransientError(f"reading hf://{self.repo_id}/{rel}: {type(exc).__name__}: {exc}") from exc

        return FramedReader(layout, Continued(body, size, rel))

    def tag(self, rel: str) -> str:
        return f"hf:{self.commit}:{self.objects[rel].expected.value}"


# --- image assembly ----------------------------------------------------------------------------


def resolve_base(client: RegistryClient, ref: ImageRef, platform: str) -> tuple[dict[str, Any], str]:
    """Return the base image's (single-platform) manifest and its digest."""
    body, media_type = client.get_manifest(ref.repository, ref.reference)
    if media_type in (OCI_INDEX, DOCKER_LIST):
        os_name, _, arch = platform.partition("/")
        arch, _, variant = arch.partition("/")
        for entry in json.loads(body).get("manifests", []):
            plat = entry.get("platform", {})
            if (plat.get("os"), plat.get("architecture")) == (os_name, arch) and variant in ("", plat.get("variant")):
                body, media_type = client.get_manifest(ref.repository, entry["digest"])
                break
        else:
            raise StepError(f"base image {ref} has no {platform} manifest", EXIT_NOT_FOUND)
    if media_type not in (OCI_MANIFEST, DOCKER_MANIFEST):
        raise StepError(f"base image {ref}: unsupported manifest type {media_type}")
    return json.loads(body), sha256_digest(body)


def build_config(base_config: dict[str, Any], layers: list[tuple[str, str]]) -> bytes:
    """The base config plus one diff_id and history entry per model layer `(relpath, digest)`."""
    config = json.loads(json.dumps(base_config))
    rootfs = config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
    rootfs["diff_ids"] = list(rootfs.get("diff_ids", [])) + [digest for _, digest in layers]
    if "history" in config:
        config["history"] = list(config["history"]) + [
            {"created": "1970-01-01T00:00:00Z", "created_by": f"modelcar: /{MODEL_ROOT}/{rel}"} for rel, _ in layers
        ]
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def build_manifest(
    config: bytes,
    base_layers: list[dict[str, Any]],
    layers: list[tuple[str, str, int]],
    base: str,
    base_digest: str,
    annotations: dict[str, str] | None = None,
    layer_notes: dict[str, dict[str, str]] | None = None,
) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPES[d["mediaType"]], "digest": d["digest"], "size": d["size"]} for d in base_layers]
        + [
            {
                "mediaType": LAYER_MEDIA_TYPE,
                "digest": digest,
                "size": size,
                "annotations": {"org.opencontainers.image.title": rel, **(layer_notes or {}).get(rel, {})},
            }
            for rel, digest, size in layers
        ],
        "annotations": {
            **(annotations or {}),
            "org.opencontainers.image.base.name": base,
            "org.opencontainers.image.base.digest": base_digest,
        },
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


SOURCE_ANNOTATION = "io.ml-dev-env.source"  # per layer, --source mode: the source object it came from


def previous_layers(client: RegistryClient, dest: ImageRef) -> dict[str, tuple[str, str]]:
    """title → (digest, source annotation) of the image the destination tag names now, if any: a
    re-run streaming from the same source objects skips their blobs without reading them again."""
    try:
        body, media_type = client.get_manifest(dest.repository, dest.tag or "")
        layers = json.loads(body).get("layers") if media_type == OCI_MANIFEST else []
    except (StepError, ValueError, AttributeError):
        return {}
    found = {}
    for layer in layers if isinstance(layers, list) else []:
        notes = (layer.get("annotations") if isinstance(layer, dict) else None) or {}
        digest = layer.get("digest") if isinstance(layer, dict) else None
        if isinstance(notes, dict) and "org.opencontainers.image.title" in notes and isinstance(digest, str) and _DIGEST_RE.match(digest):
            found[str(notes["org.opencontainers.image.title"])] = (digest, str(notes.get(SOURCE_ANNOTATION, "")))
    return found


RECORD_ANNOTATION = "io.ml-dev-env.resume-record"  # the tag a resume record belongs to
UPLOADS_ANNOTATION = "io.ml-dev-env.uploads"  # JSON: relpath -> {location, acked, source} of unfinished uploads
RECORD_EXPIRY = "14d"  # Quay drops a record tag left behind after this (config label quay.expires-after)


def record_tag(tag: str) -> str:
    """The tag holding the resume record of `tag` (OCI tags: at most 128 characters)."""
    name = f"{tag}.resume"
    return name if len(name) <= 128 else f"{tag[:100]}-{hashlib.sha256(tag.encode()).hexdigest()[:12]}.resume"


class ResumeRecord:
    """What a streaming run has done so far, kept where a retry finds it: in the destination registry.

    The stream Task has no claim (its workspace is an emptyDir, new per Tekton retry), so the record is
    a small image manifest under the tag `<tag>.resume`: the base layers plus every model layer completed
    so far, each annotated with the source object it came from (`io.ml-dev-env.source`, so the entry is
    (path, source size + checksum/ETag) -> layer digest), and the upload sessions in flight with their
    acknowledged offsets. It is rewritten when a blob completes and when a chunk is acknowledged; a retry
    HEAD-checks the recorded digests and sends nothing for them, and continues the recorded sessions. The
    record also keeps the completed blobs from garbage collection. After the image's tag is written the
    record is deleted (by digest); where deleting is refused, Quay expires it (config label
    `quay.expires-after`).
    """

    def __init__(
        self,
        client: RegistryClient,
        dest: ImageRef,
        base_manifest: dict[str, Any],
        base_config: dict[str, Any],
        base_digest: str,
        base: str,
    ) -> None:
        self.client, self.dest, self.tag = client, dest, record_tag(dest.tag or "")
        self.base_manifest, self.base_config, self.base_digest, self.base = base_manifest, base_config, base_digest, base
        self.layers: dict[str, tuple[str, int, str]] = {}  # relpath -> (digest, size, source)
        self.uploads: dict[str, dict[str, Any]] = {}
        self.digest = ""  # of the record manifest the registry holds
        self.usable = True
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read the record. It is data anyone with push rights can write: what it says is only ever a hint
        (package checks every recorded layer against the source, see `push_streamed`), and a record it cannot
        read is ignored with one WARNING line (and rewritten by this run)."""
        try:
            body, media_type = self.client.get_manifest(self.dest.repository, self.tag)
        except (StepError, ValueError):
            return  # none (404), or not readable: start without one
        try:
            manifest = json.loads(body)
            notes = manifest.get("annotations") if isinstance(manifest, dict) else None
        except ValueError:
            notes = None
        if media_type != OCI_MANIFEST or not isinstance(notes, dict) or notes.get(RECORD_ANNOTATION) != self.dest.tag:
            self.usable = False  # a tag of that name that is not our record: never overwrite it
            log(f"WARNING: {self.dest.repository}:{self.tag} exists and is not a resume record; this run keeps none")
            return
        self.digest = sha256_digest(body)
        try:
            layers, uploads = _record_entries(manifest, notes)
        except ValueError as exc:
            log(f"WARNING: resume record {self.tag} ignored: {exc}; this run starts without it")
            return
        self.layers, self.uploads = layers, uploads
        log(f"resume record {self.tag}: {len(self.layers)} finished layers, {len(self.uploads)} unfinished uploads")

    def layer_done(self, rel: str, digest: str, size: int, source: str) -> None:
        with self._lock:
            self.layers[rel] = (digest, size, source)
            self.uploads.pop(rel, None)
            self._write()

    def upload_state(self, rel: str, source: str, state: dict[str, Any] | None) -> bool:
        """Record (or, with None, drop) the upload session of `rel`; True when the registry holds it."""
        with self._lock:
            if state is None:  # the blob is complete (layer_done writes) or its session was cancelled
                self.uploads.pop(rel, None)
                return False
            else:
                self.uploads[rel] = {"location": state["location"], "acked": state["acked"], "source": source}
            return self._write()

    def _write(self) -> bool:
        if not self.usable:
            return False
        done = sorted(self.layers.items())
        config = json.loads(build_config(self.base_config, [(rel, d) for rel, (d, _, _) in done]))
        inner = config.get("config") if isinstance(config.get("config"), dict) else {}
        config["config"] = {**inner, "Labels": {**(inner.get("Labels") or {}), "quay.expires-after": RECORD_EXPIRY}}
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        notes = {RECORD_ANNOTATION: self.dest.tag or "", UPLOADS_ANNOTATION: json.dumps(self.uploads, sort_keys=True)}
        manifest = build_manifest(
            config_bytes,
            self.base_manifest["layers"],
            [(rel, d, size) for rel, (d, size, _) in done],
            self.base,
            self.base_digest,
            notes,
            {rel: {SOURCE_ANNOTATION: source} for rel, (_, _, source) in done},
        )
        try:
            self.client.put_blob(self.dest.repository, config_bytes)
            self.digest = self.client.put_manifest(self.dest.repository, self.tag, manifest, OCI_MANIFEST)
            return True
        except (StepError, TransientError) as exc:
            log(f"WARNING: resume record {self.tag} not written ({exc}); a retry of this run re-sends what it cannot find")
            return False

    def delete(self) -> None:
        """Drop the record once the image is tagged (its blobs are referenced by the image now)."""
        if not self.digest:
            return
        try:
            status = self.client.delete_manifest(self.dest.repository, self.digest)
        except (StepError, TransientError) as exc:
            status, detail = 0, str(exc)
        else:
            detail = f"HTTP {status}"
        if status not in (200, 202, 204, 404):
            log(
                f"WARNING: could not delete the resume record {self.dest.repository}:{self.tag} ({detail}); "
                f"it names a partial image: delete the tag (Quay expires it after {RECORD_EXPIRY})"
            )


_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _record_entries(manifest: dict[str, Any], notes: dict[str, Any]) -> tuple[dict[str, tuple[str, int, str]], dict[str, dict[str, Any]]]:
    """The finished layers and unfinished uploads a record names; ValueError (naming the first problem) for one
    that is not well formed: a digest that is not sha256, a size or offset that is not a non-negative integer,
    a field missing, uploads that are not a JSON object."""

    def count(value: Any, what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{what} is {value!r}, not a non-negative integer")
        return value

    layers: dict[str, tuple[str, int, str]] = {}
    listed = manifest.get("layers")
    if not isinstance(listed, list):
        raise ValueError("it has no list of layers")
    for layer in listed:
        ann = (layer.get("annotations") if isinstance(layer, dict) else None) or {}
        title = ann.get("org.opencontainers.image.title") if isinstance(ann, dict) else None
        if title is None:
            continue
        digest = layer.get("digest")
        if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
            raise ValueError(f"layer {title!r} has digest {digest!r}")
        layers[str(title)] = (digest, count(layer.get("size"), f"the size of layer {title!r}"), str(ann.get(SOURCE_ANNOTATION, "")))
    try:
        raw = json.loads(notes.get(UPLOADS_ANNOTATION, "{}"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"its uploads are not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ValueError("its uploads are not a JSON object")
    uploads: dict[str, dict[str, Any]] = {}
    for rel, entry in raw.items():
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry.get(k) for k in ("location", "source")):
            raise ValueError(f"the upload of {rel!r} lacks a location or source")
        uploads[str(rel)] = {**entry, "acked": count(entry.get("acked"), f"the offset of the upload of {rel!r}")}
    return layers, uploads


def manifest_annotations(pairs: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` flags as manifest annotations; an empty VALUE (an unknown Tekton result) is left out."""
    found = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if value:
            found[key] = value
    return found


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
    if args.source and (not args.source.startswith(("s3://", "hf://")) or len(args.source) <= len("s3://")):
        p.error("--source must be s3://bucket[/prefix] or hf://org/name")
    if any("=" not in a or not a.partition("=")[0] for a in args.annotation):
        p.error("--annotation needs KEY=VALUE")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    dest, base = ImageRef.parse(args.image), ImageRef.parse(args.base_image)
    if dest.digest or not dest.tag:
        raise StepError(f"--image needs a tag (and no digest): {args.image}")
    s3: S3Source | HfSource | None = None
    if args.source:
        # importing botocore and building its S3 client make ~60,000 long-lived objects; the cyclic GC would walk them again and again
        # while they are made (~0.06 CPU-s a run). Collect nothing meanwhile, then freeze them out of later collections.
        gc.disable()
        try:
            s3 = S3Source(args) if args.source.startswith("s3://") else HfSource(args)
        finally:
            gc.freeze()
            gc.enable()
        if isinstance(s3, HfSource):  # what the download step would have reported as results
            given = {a.partition("=")[0] for a in args.annotation if a.partition("=")[2]}
            args.annotation += [
                f"{k}={v}"
                for k, v in (("org.opencontainers.image.revision", s3.commit), ("org.opencontainers.image.licenses", s3.license))
                if k not in given
            ]
    if s3 is not None:
        files: list[tuple[str, Path | None]] = [(rel, None) for rel in sorted(s3.objects)]
        check_layer_sizes({rel: obj.expected.size for rel, obj in s3.objects.items()}, args.max_layer_size)
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
    s3: S3Source | HfSource | None = None,
) -> str:
    listed = {rel: os.lstat(path) for rel, path in files if path is not None}  # what the reads must find again
    base_manifest, base_digest = resolve_base(source, base, args.platform)
    for layer in base_manifest["layers"]:
        if layer["mediaType"] not in LAYER_TYPES:
            raise StepError(f"base image {base}: unsupported layer type {layer['mediaType']}")
    base_config = json.loads(source.get_blob(base.repository, base_manifest["config"]["digest"]))
    record: ResumeRecord | None = None
    if s3 is not None:
        layouts = {rel: LayerLayout.for_file(rel, s3.objects[rel].expected.size) for rel, _ in files}
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
        reader, state = s3.reader(rel, layout), SourceHasher(len(layout.head), expected)
        try:
            for piece in _limit(reader(0, layout.size), layout.size):
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
        expected = s3.objects[rel].expected
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
                new_hasher=lambda: SourceHasher(len(layout.head), expected), check=lambda state: state.verify(rel),
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
