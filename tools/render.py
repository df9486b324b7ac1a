"""`make render STACK=<name>`: run the program offline and tell what `pulumi preview` would.

Writes `rendered/<stack>/<kind>-<name>.yaml` and prints a short report: the stack outputs, the policy
check, the object counts per kind, the project's schema check (`tools/schema_check.py`: each object against its
kind's vendored upstream schema in `schemas/`, strictly, and upstream's rules beyond it; the detail, with the config
key that made each refused value, only on failure; the render fails when it fails), the secrets the stack needs (set
or missing, with the command to set each), the cluster prerequisites it assumes and the objects that
need more than namespace-admin rights. Secret values never reach the files: they are redacted before
anything is written.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

if __name__ == "__main__" and not __package__:
    # Run as a file (`python tools/render.py`): re-run as the module of the repository package, which needs
    # no sys.path edits (`python -m tools.render`, what the Makefile runs).
    os.execve(
        sys.executable,
        [sys.executable, "-m", "tools.render", *sys.argv[1:]],
        {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])),
        },
    )

from policy.rules import POLICIES, evaluate, format_report, has_mandatory
from stacks import gpus
from stacks.config import StackConfig
from stacks.loader import SECRET_KEYS, stack_raw
from tools.mock_engine import REDACTED, ROOT, Recorded, RunResult, StackFileError, flatten, run_program, stack_config
from tools.prerequisites import admin_needs, prerequisites, secret_status
from tools.schema_check import Leaf, check_objects, key_hint, leaves


def manifest(resource: Recorded) -> dict[str, Any] | None:
    """The Kubernetes object a recorded resource would apply (None for non-Kubernetes resources)."""
    if not resource.typ.startswith("kubernetes:") or resource.typ.startswith("pulumi:providers"):
        return None
    obj = dict(resource.inputs)
    if "apiVersion" not in obj or "kind" not in obj:
        return None
    if obj["kind"] == "Secret":
        for key in ("data", "stringData"):
            if isinstance(obj.get(key), dict):
                obj[key] = {k: REDACTED for k in obj[key]}
    ordered: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    ordered.update({k: v for k, v in obj.items() if k not in ordered})
    return ordered


def file_name(obj: dict[str, Any], patch: bool) -> str:
    name = obj.get("metadata", {}).get("name", "unnamed")
    slug = re.sub(r"[^a-z0-9.-]+", "-", f"{obj['kind']}-{name}".lower()).strip("-")
    return f"{slug}{'-patch' if patch else ''}.yaml"


def write(result: RunResult, out_dir: Path) -> list[tuple[Recorded, dict[str, Any], Path]]:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    written = []
    for resource in result.resources:
        obj = manifest(resource)
        if obj is None:
            continue
        path = out_dir / file_name(obj, resource.typ.endswith("Patch"))
        if path.exists():
            raise SystemExit(f"error: two objects render to {path.name}")
        path.write_text(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120))
        written.append((resource, obj, path))
    return written


def summary(written: list[tuple[Recorded, dict[str, Any], Path]], result: RunResult) -> str:
    """Object counts per kind, then the Pulumi-only resources (components, providers), on two lines."""
    counts = Counter(obj["kind"] for _, obj, _ in written)
    other = Counter(r.typ.rsplit(":", 1)[-1] for r in result.resources if manifest(r) is None)
    lines = ["  " + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))]
    if other:
        listed = ", ".join(f"{typ} {n}" for typ, n in sorted(other.items()))
        lines.append(f"  (and {sum(other.values())} Pulumi-only resources: {listed})")
    return "\n".join(lines)


def stack_settings(config: dict[str, Any], config_dir: Path = ROOT) -> StackConfig:
    """The validated config of a stack file that already rendered (so it is valid); an environment's merged onto its cluster's."""
    flat, _ = flatten(config)
    raw, _ = stack_raw(flat, config_dir)
    return StackConfig.model_validate(raw)


def needs_report(stack_file: Path, config: dict[str, Any], written: list[tuple[Recorded, dict[str, Any], Path]]) -> str:
    """The secrets, cluster prerequisites and admin rights a stack needs, as printed by `make render`."""
    settings = stack_settings(config, stack_file.parent)
    objects = [obj for resource, obj, _ in written if not resource.typ.endswith("Patch")]
    patches = [obj for resource, obj, _ in written if resource.typ.endswith("Patch")]
    lines = [f'\n== secrets ("set": a `secure:` value in {stack_file.name})']
    statuses = secret_status(settings, config)
    for status in statuses:
        state = ("set" if status.is_set else "missing") if status.needed else "set, not needed by this config"
        lines.append(f"  {status.key}: {state} — {status.purpose}")
        if status.needed and not status.is_set:
            lines.append(f"      {status.command}")
    if not statuses:
        lines.append("  none needed")
    missing = [s.key for s in statuses if s.needed and not s.is_set]
    if missing:
        lines.append(f"  pulumi preview stops until {len(missing)} missing secret(s) are set (rendered here with placeholders)")
    lines.append("\n== cluster prerequisites (this stack assumes them; it does not create them)")
    lines += [
        f"  - {need.what} — {need.why}" + (f"\n      check: {need.check}" if need.check else "")
        for need in prerequisites(settings, objects, patches)
    ]
    admin = admin_needs(objects + patches, settings.cluster.namespace)
    lines.append(f"\n== needs more than namespace admin in {settings.cluster.namespace} ({len(admin)} objects)")
    lines += [f"  - {need.what}: {need.why}" for need in admin] or ["  none: namespace admin is enough"]
    return "\n".join(lines)


def format_outputs(outputs: dict[str, Any], secret: set[str] | frozenset[str] = frozenset()) -> str:
    """The stack outputs as a person reads them: one YAML document, indented under the heading (a mapping or list
    as a nested block, a multi-line string as a literal block), secrets as `[secret]`: never a Python repr.
    `pulumi stack output --json` gives the same values as JSON."""
    shown = {key: "[secret]" if key in secret else value for key, value in sorted(outputs.items())}
    text = yaml.dump(shown, Dumper=_OutputDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)
    return "\n".join(f"  {line}" if line else "" for line in text.rstrip("\n").splitlines())


class _OutputDumper(yaml.SafeDumper):
    """Multi-line strings (ssh_config, the known-hosts lines) as literal blocks: readable, and pasteable as they are."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        # a literal block cannot keep trailing spaces on a line: those (none in our outputs) are dumped quoted
        if not any(line != line.rstrip() for line in data.splitlines()):
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_OutputDumper.add_representer(str, _str)


def config_sources(stack_file: Path, config: dict[str, Any]) -> list[Leaf]:
    """Every scalar of the stack file's config, then of its cluster's stack file (an environment stack's)."""
    found = leaves(stack_file.name, config)
    env = config.get("ml-dev-env:environment")
    cluster = env.get("cluster") if isinstance(env, dict) else None
    cluster_file = stack_file.parent / f"Pulumi.{cluster}.yaml"
    if isinstance(cluster, str) and cluster_file.is_file() and cluster_file != stack_file:
        try:
            found += leaves(cluster_file.name, stack_config(cluster_file))
        except StackFileError:
            pass
    return found


def schema_section(stack: str, stack_file: Path, config: dict[str, Any], written: list[tuple[Recorded, dict[str, Any], Path]]) -> bool:
    """The project's schema check of the written objects (tools/schema_check.py); False when one fails."""
    report = check_objects((obj, resource.typ.endswith("Patch")) for resource, obj, _ in written)
    what = "schemas/ strictly, and upstream's rules beyond them"
    if report.passed:
        print(f"\n== schema check: {report.summary} ({what})")
        return True
    print(f"\n== schema check ({what}): FAILED, {report.summary}")
    sources = config_sources(stack_file, config)
    for label, problems in report.invalid:
        for problem in problems:
            hint = key_hint(problem.value, sources, stack, stack_file.name)
            print(f"  {label}: {problem.text}" + (f" — {hint}" if hint else ""))
    return False


def stacks_in(config_dir: Path) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in config_dir.glob("Pulumi.*.yaml"))


def render(stack: str, out_root: Path, validate: bool = True, config_dir: Path = ROOT) -> int:
    stack_file = config_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        available = stacks_in(config_dir)
        print(f"error: no stack file {stack_file.name}; available stacks: {', '.join(available)}", file=sys.stderr)
        return 2
    try:
        config = stack_config(stack_file)
    except StackFileError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    # Secrets can't be decrypted offline: render with placeholders (redacted from every file).
    placeholders = {k: f"render-placeholder-{k}" for k in SECRET_KEYS if f"ml-dev-env:{k}" not in config}
    result = run_program(stack, config, placeholders)
    for warning in result.warnings:
        print(f"warning: {warning}")
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
        return 2
    out_dir = out_root / stack
    written = write(result, out_dir)
    print(f"\n== outputs ({stack})")
    print(format_outputs(result.outputs, result.secret_outputs))
    violations = evaluate((r.typ, r.inputs, r.options) for r in result.resources)
    print(f"\n== policies ({len(POLICIES)} guard rails, policy/rules/)")
    print(format_report(violations))
    print(f"\n== {len(written)} Kubernetes objects written to {out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir}")
    print(summary(written, result))
    if has_mandatory(violations):
        print(f"error: stack {stack} violates a mandatory policy (see above)", file=sys.stderr)
        return 1
    if validate and not schema_section(stack, stack_file, config, written):
        print(f"error: rendered objects of stack {stack} fail the schema check (the API server would refuse them)", file=sys.stderr)
        return 1
    fit = gpus.tally(config_dir, stack)
    if fit is not None:
        print(f"\n== GPUs (nodes.gpuNodes × nodes.gpusPerNode of the cluster stack; preview also reads the live nodes)\n  {fit.line}")
    print(needs_report(stack_file, config, written))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("stacks", nargs="*", help="stack names (default: every Pulumi.<stack>.yaml)")
    parser.add_argument("--out", default=str(ROOT / "rendered"))
    parser.add_argument("--config-dir", default=str(ROOT), help="where the Pulumi.<stack>.yaml files are")
    parser.add_argument("--no-validate", action="store_true")
    args = parser.parse_args(argv)
    config_dir = Path(args.config_dir)
    stacks = args.stacks or stacks_in(config_dir)
    status = 0
    for stack in stacks:
        print(f"==== stack {stack}")
        status = max(status, render(stack, Path(args.out), validate=not args.no_validate, config_dir=config_dir))
    return status


if __name__ == "__main__":
    sys.exit(main())
