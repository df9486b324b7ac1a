"""Blob uploads into one repository (OCI distribution: POST, PATCH, PUT ?digest=), hashed in the same pass, chunked
above a threshold and resumed at the registry's offset after a failure (`BlobPusher`).

Why it is one module of 400 lines, `push` alone over 80: the upload loop is one state machine (session, offset,
hash states, failure budget) whose branches each answer one registry reply; cut apart, each piece would need the
whole state handed to it. Its helpers (`_patch`, `_recover`, `_finish`) are methods of the class for the same reason.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .registry import AuthExpired, ChunkRefused, RegistryClient, TransientError
from .runtime import EXIT_AUTH, EXIT_INTEGRITY, EXIT_REMOTE, Progress, StepError, backoff, human, log

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

        Why one function: the upload loop is one state machine (session, offset, hash states, failure
        budget) whose branches each answer one registry reply.
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
            body = limit_bytes(reader(start, end), end - start)
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
        for piece in limit_bytes(reader(base, offset), offset - base) if offset > base else ():
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


def limit_bytes(chunks: Iterator[memoryview], length: int) -> Iterator[memoryview]:
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
