"""The modelcar image's layout: the base image's manifest, the config and manifest built from it and the model
layers, the annotations a layer and the image carry, and what the destination tag holds now."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .images import ImageRef
from .model import LAYER_MEDIA_TYPE, MODEL_ROOT
from .registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, RegistryClient, sha256_digest
from .runtime import EXIT_NOT_FOUND, StepError

# Base-image layers keep their bytes (and digests); Docker media types get their OCI names.
LAYER_TYPES = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar": LAYER_MEDIA_TYPE,
    "application/vnd.oci.image.layer.v1.tar+gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    LAYER_MEDIA_TYPE: LAYER_MEDIA_TYPE,
}
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


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
        if isinstance(notes, dict) and "org.opencontainers.image.title" in notes and isinstance(digest, str) and DIGEST_RE.match(digest):
            found[str(notes["org.opencontainers.image.title"])] = (digest, str(notes.get(SOURCE_ANNOTATION, "")))
    return found


def manifest_annotations(pairs: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` flags as manifest annotations; an empty VALUE (an unknown Tekton result) is left out."""
    found = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if value:
            found[key] = value
    return found
