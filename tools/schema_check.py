"""The project's strict check of Kubernetes manifests: `python -m tools.schema_check [-q] [--no-strict] PATH...`.

What the API server would refuse, found offline with nothing beside the clone: each object against its kind's
vendored upstream schema (`schemas/`, strict: an unknown field is an error) and upstream's rules beyond the schema
(`policy/rules/kube_api.py`, which cites them). `make render` runs it on every rendered object (in-process,
`check_objects`); the policy pack runs the same checks at `pulumi preview` (rule `api-server-accepts`).

PATH is a YAML/JSON file (multi-document YAML and `kind: List` work) or a folder (searched recursively; files named
`*-patch.yaml` are patches: required fields may be missing). Prints the problems of each invalid object (and, without
-q, one OK line per valid one) and a summary line; exit status 1 when an object is invalid, has no schema or a file
cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policy.rules import kube_api


@dataclass
class Report:
    """The outcome over many objects: (label, problems) of the invalid ones, and how many were fine."""

    ok: int = 0
    invalid: list[tuple[str, list[kube_api.Problem]]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.invalid and not self.unreadable

    @property
    def summary(self) -> str:
        tail = f", {len(self.unreadable)} unreadable" if self.unreadable else ""
        return f"{self.ok} ok, {len(self.invalid)} invalid{tail}"


def label(obj: Mapping[str, Any]) -> str:
    name = obj.get("metadata", {}).get("name", "unnamed") if isinstance(obj.get("metadata"), Mapping) else "unnamed"
    return f"{obj.get('kind', '?')}/{name}"


def check_objects(objects: Iterable[tuple[Mapping[str, Any], bool]], strict: bool = True) -> Report:
    """(object, is_patch) pairs -> a Report."""
    report = Report()
    for obj, patch in objects:
        found = kube_api.problems(obj, patch=patch, strict=strict)
        if found:
            report.invalid.append((label(obj), found))
        else:
            report.ok += 1
    return report


def _files(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
        else:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems and the summary")
    parser.add_argument("--no-strict", action="store_true", help="allow unknown fields")
    parser.add_argument("--list-kinds", action="store_true", help="list the apiVersion/kind of every vendored schema")
    args = parser.parse_args(argv)
    if args.list_kinds:
        for api_version, kind in kube_api.kinds():
            print(f"{api_version} {kind}")
        return 0
    if not args.paths:
        parser.error("give a file or folder to check")
    report = Report()
    for path in _files(args.paths):
        try:
            text = path.read_text()
            docs = [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            report.unreadable.append(str(path))
            print(f"UNREADABLE {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        patch = path.stem.endswith("-patch")
        for doc in docs:
            for obj in kube_api.iter_objects(doc):
                one = check_objects([(obj, patch)], strict=not args.no_strict)
                report.ok += one.ok
                report.invalid += [(f"{path}: {what}", found) for what, found in one.invalid]
                if one.invalid:
                    for what, found in one.invalid:
                        print(f"INVALID {path}: {what}")
                        print("\n".join(f"  {p.text}" for p in found))
                elif not args.quiet:
                    print(f"OK {path}: {obj.get('apiVersion')} {label(obj)}")
    print(f"summary: {report.summary}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------- which config key made it


@dataclass(frozen=True)
class Leaf:
    """One scalar of a stack file's config: its file, its key (`ml-dev-env:cluster.appName`, `…models[0].name`)."""

    file: str
    key: str
    value: str


def leaves(file: str, config: Mapping[str, Any]) -> list[Leaf]:
    out: list[Leaf] = []

    def walk(key: str, value: Any) -> None:
        if isinstance(value, Mapping):
            if set(value) == {"secure"}:
                return
            for k, v in value.items():
                walk(f"{key}.{k}" if ":" in key else f"{key}{k}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{key}[{i}]", v)
        elif value is not None and not isinstance(value, bool):
            out.append(Leaf(file, key, str(value)))

    for key, value in config.items():
        walk(str(key), value)
    return out


def key_hint(value: Any, sources: list[Leaf], stack: str = "", stack_file: str = "") -> str:
    """Where a refused value came from: the config key whose value it is (or contains), else the stack name."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return ""
    text = str(value)
    exact = [leaf for leaf in sources if leaf.value == text]
    inside = sorted((leaf for leaf in sources if len(leaf.value) >= 2 and leaf.value in text), key=lambda leaf: -len(leaf.value))
    found = exact or inside
    if found and (not stack or len(found[0].value) >= len(stack) or stack not in text):
        leaf = found[0]
        return f"from {leaf.key}: {leaf.value!r} in {leaf.file}"
    if stack and stack in text:
        return f"from the stack name {stack!r} ({stack_file})"
    return ""
