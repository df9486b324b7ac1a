"""The resume record of a streaming run (`ResumeRecord`): what is done so far, kept in the destination registry
under `<tag>.resume`, where a retry of the Task (a new emptyDir) finds it."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from .images import ImageRef
from .layout import DIGEST_RE, SOURCE_ANNOTATION, build_config, build_manifest
from .registry import OCI_MANIFEST, RegistryClient, TransientError, sha256_digest
from .runtime import StepError, log

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
        if not isinstance(digest, str) or not DIGEST_RE.match(digest):
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
