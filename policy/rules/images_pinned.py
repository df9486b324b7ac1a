"""Policy 6: images pinned."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _get, _m, _seq, _str, container_likes, is_unknown, walk

# -------------------------------------------------------------------------------- 6. images pinned

_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
IMAGE_FIX = "Fix: pin a version tag (e.g. quay.io/org/image:1.2.3) or a digest (image@sha256:<64 hex>)."


def image_problem(ref: str) -> str | None:
    """None if `ref` is pinned by a non-`latest` tag or a digest; else what is wrong with it."""
    ref = ref.strip()
    if "$(" in ref or "${" in ref:
        return None  # substituted at run time (Tekton params, shell): checked where the value is set
    if not ref:
        return "is empty"
    if "@" in ref:
        return None if _DIGEST.match(ref.split("@", 1)[1]) else "has a malformed digest"
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (it means :latest, which moves)"
    if last.split(":", 1)[1] in ("", "latest"):
        return "uses the floating :latest tag"
    return None


def _image_stream_tag_problem(name: str) -> str | None:
    if "@" in name:
        return None
    if ":" not in name:
        return "names no tag (ImageStreamTag names are <stream>:<tag>)"
    return "uses the floating :latest tag" if name.split(":", 1)[1] == "latest" else None


def _object_ref_problem(ref: Mapping[str, Any]) -> tuple[str, str | None] | None:
    kind, name = _str(ref.get("kind")), _str(ref.get("name"))
    if name is None:
        return None
    if kind == "DockerImage":
        return name, image_problem(name)
    if kind == "ImageStreamTag":
        return name, _image_stream_tag_problem(name)
    return None


def check_images_pinned(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    triggered = "image.openshift.io/triggers" in _m(res.metadata.get("annotations"))
    for where, container in container_likes(res):
        image = container.get("image")
        if "image" not in container or is_unknown(image) or not isinstance(image, str):
            continue
        if not image.strip() and triggered:
            continue  # set by the OpenShift image trigger
        problem = image_problem(image)
        if problem:
            yield f"{where}: image {image!r} {problem}. {IMAGE_FIX}"
    if res.kind == "BuildConfig":
        strategy = _m(res.spec.get("strategy"))
        refs = [(f"spec.strategy.{k}.from", _m(_get(strategy, k, "from"))) for k in ("dockerStrategy", "sourceStrategy", "customStrategy")]
        refs.append(("spec.output.to", _m(_get(res.spec, "output", "to"))))
        for i, trigger in enumerate(map(_m, _seq(res.spec.get("triggers")))):
            refs.append((f"spec.triggers[{i}].imageChange.from", _m(_get(trigger, "imageChange", "from"))))
        for where, ref in refs:
            found = _object_ref_problem(ref)
            if found and found[1]:
                yield f"{where}: {ref.get('kind')} {found[0]!r} {found[1]}. {IMAGE_FIX}"
    if res.kind == "ImageStream":
        for i, tag in enumerate(map(_m, _seq(res.spec.get("tags")))):
            found = _object_ref_problem(_m(tag.get("from")))
            if found and found[1] and _m(tag.get("from")).get("kind") == "DockerImage":
                yield f"spec.tags[{tag.get('name') or i}].from: {found[0]!r} {found[1]}. {IMAGE_FIX}"
    for path, key, value in walk(res.spec, "spec"):
        if key == "storageUri" and isinstance(value, str) and value.startswith("oci://"):
            problem = image_problem(value[len("oci://") :])
            if problem:
                yield f"{path}.storageUri {value!r} {problem}. Fix: register the modelcar by digest (oci://...@sha256:<digest>)."


POLICY = PolicySpec(
    "images-pinned",
    MANDATORY,
    "resource",
    "Every image - containers, init containers, Tekton steps/sidecars/stepTemplate, BuildConfig from/output/"
    "ImageChange triggers, ImageStream DockerImage imports, KServe oci:// storageUri - is pinned by a tag other "
    "than latest or by a digest.",
    "Pin a version tag or a digest.",
    check_images_pinned,
    order=6,
)
