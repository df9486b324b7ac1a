"""Read `ml-dev-env:*` Pulumi config into a validated `StackConfig`.

Mistakes become one `pulumi.RunError` listing every problem (no traceback). Secrets are read only
through Pulumi secrets and stay `Output` secrets.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pydantic import ValidationError

from core.servers import DEV_SERVERS
from stacks import gpus, stackfile
from stacks.base import ConfigProblems
from stacks.config import PIPELINE_CREDENTIALS, SSHD_CAPABILITIES, ClusterConfig, StackConfig
from stacks.environment import app_name, environment_config, is_environment
from stacks.errors import PREFIX, _clean_loc, _path, format_errors, format_problems, problem_lines
from stacks.gpus import Tally

# Secret config keys (always `pulumi config set --secret ml-dev-env:<key> …`) and what needs them.
SECRET_KEYS: dict[str, str] = {
    **{s.secret_key: s.secret_help for s in DEV_SERVERS if s.routed and s.secret_key},
    **{key: text for cred in PIPELINE_CREDENTIALS.values() for _, key, text in cred.keys},
}


@dataclass(frozen=True)
class LoadedStack:
    config: StackConfig
    secrets: dict[str, pulumi.Output[str]]
    warnings: list[str] = field(default_factory=list)
    cluster: StackConfig | None = None
    """An environment stack: its cluster stack's config (from `Pulumi.<cluster>.yaml`)."""
    gpus: Tally | None = None
    """The GPUs of its cluster against what every stack of the checkout on it asks (stacks/gpus.py)."""


def object_keys() -> list[str]:
    return [f.alias or name for name, f in StackConfig.model_fields.items()]


def _all_config() -> Mapping[str, Any]:
    from pulumi.runtime import config as runtime_config

    return runtime_config.CONFIG.get()


# Config namespaces of other Pulumi packages and of the engine: their keys are never ours.
OTHER_NAMESPACES = frozenset({"pulumi", "kubernetes", "random", "aws", "azure", "azure-native", "gcp", "command", "tls"})


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def misplaced_key(full_key: str, value: Any) -> str | None:
    """A problem line when a key outside `ml-dev-env:` was most likely meant for this program, else None.

    Pulumi hands a program every namespace's config (`kubernetes:context`, `pulumi:…`), so only
    near-misses of our project name (`mldevenv:cluster`, `ml-dev:nodes`) and object values under an
    unknown namespace whose key is one of ours (`myproject:storage: {…}`) are reported.
    """
    namespace, sep, key = full_key.partition(":")
    if not sep or namespace == PREFIX[:-1] or namespace in OTHER_NAMESPACES:
        return None
    ours = PREFIX[:-1]
    near = _squash(namespace) == _squash(ours) or difflib.SequenceMatcher(None, namespace.lower(), ours).ratio() >= 0.7
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        parsed = value
    looks_ours = key in object_keys() and isinstance(parsed, dict)
    if not (near or looks_ours):
        return None
    return (
        f"{full_key}: key under project prefix '{namespace}:', which this program ignores; "
        f"did you mean '{PREFIX}{key}'? (this project is '{ours}', see Pulumi.yaml)"
    )


def _sub_keys() -> dict[str, str]:
    """camelCase key of every field one level down → its full path (`gpusPerPod` → `nodes.gpusPerPod`)."""
    out: dict[str, str] = {}
    for name, f in StackConfig.model_fields.items():
        model = f.annotation
        fields = getattr(model, "model_fields", None)
        if isinstance(fields, dict):
            for sub_name, sub in fields.items():
                out.setdefault(sub.alias or sub_name, f"{f.alias or name}.{sub.alias or sub_name}")
    return out


def unknown_key_line(full_key: str, key: str, text: Any, known: set[str]) -> str:
    """An unknown top-level key, with the fix: the object it belongs in, or the objects it wraps."""
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        value = text
    inner = set(value) & set(object_keys()) if isinstance(value, dict) else set()
    if inner:
        return (
            f"{full_key}: unknown key wrapping {', '.join(sorted(inner))}; each object is a key of its own under `config:`: "
            + ", ".join(f"{PREFIX}{k}" for k in sorted(inner))
        )
    head, dot, rest = key.partition(".")
    if dot and head in known:
        # `ml-dev-env:nodes.count: 2`, as the configuration reference names the key: a path, which a stack file
        # nests (only `pulumi config set --path` reads the dots)
        shown = json.dumps(value) if not isinstance(value, str) else value
        first, _, deeper = rest.partition(".")
        nested = f"{first}: {{{deeper.replace('.', ': {')}: {shown}{'}' * (deeper.count('.') + 1)}" if deeper else f"{first}: {shown}"
        return (
            f"{full_key}: a dotted key is a path, not a key: write `{nested}` under `{PREFIX}{head}:` "
            f"(or run pulumi config set --path '{PREFIX}{key}' {shown})"
        )
    path = _sub_keys().get(key)
    if path:
        return (
            f"{full_key}: unknown key; {key} belongs in {path.split('.')[0]}: did you mean '{PREFIX}{path}'? "
            f"(pulumi config set --path '{PREFIX}{path}' …)"
        )
    hint = difflib.get_close_matches(key, sorted(known), n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    return f"{full_key}: unknown key{suggestion}; allowed keys: {', '.join(sorted(known))}"


def parse_raw(raw_config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split flat Pulumi config (`ml-dev-env:key` → JSON text) into objects; collect key errors."""
    known = set(object_keys()) | set(SECRET_KEYS)
    raw: dict[str, Any] = {}
    problems: list[str] = []
    for full_key, text in raw_config.items():
        if not full_key.startswith(PREFIX):
            misplaced = misplaced_key(full_key, text)
            if misplaced:
                problems.append(misplaced)
            continue
        key = full_key[len(PREFIX) :]
        if key not in known:
            problems.append(unknown_key_line(full_key, key, text, known))
            continue
        if key in SECRET_KEYS:
            continue
        try:
            raw[key] = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            problems.append(f"{full_key}: got {text!r}; must be an object (use `pulumi config set --path`)")
    return raw, problems


def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    """Validate raw objects; raise `pulumi.RunError` with one line per problem."""
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise pulumi.RunError(format_problems(problem_lines(exc, StackConfig), source)) from None


MAX_ROUNDS = 10


def _key_path(line: str) -> str:
    """`ml-dev-env:storage.volumes[1].mountPath: got …` → `storage.volumes[1].mountPath`."""
    return line.removeprefix(PREFIX).split(": ", 1)[0]


def _parts(path: str) -> list[str | int | None]:
    """`storage.volumes[1].mountPath` → ['storage', 'volumes', 1, 'mountPath']; `models[].name` has a None index."""
    return [(int(tok[1:-1]) if tok[1:-1] else None) if tok.startswith("[") else tok for tok in re.findall(r"\[\d*\]|[^.\[\]]+", path)]


def _within(path: str, roots: set[str]) -> bool:
    """`path` is one of `roots` or lies below one (`a.b`, `a.b.c` and `a.b[0]` are within `a.b`)."""
    return any(path == root or path.startswith((f"{root}.", f"{root}[")) for root in roots)


def _drop(raw: dict[str, Any], path: str) -> str | None:
    """Remove the value at `path` from `raw` (so its default applies); a list item or an unspecific `[]`
    path removes the whole list. Returns the key path removed, or None when nothing was there."""
    parts = _parts(path)
    if None in parts:
        parts = parts[: parts.index(None)]
    while parts and isinstance(parts[-1], int):
        parts = parts[:-1]
    node: Any = raw
    for part in parts[:-1]:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return None
        elif not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if not parts or not isinstance(node, dict) or parts[-1] not in node:
        return None
    del node[parts[-1]]
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(parts))


def validate_all(raw: Mapping[str, Any], reported: Iterable[str] = ()) -> tuple[StackConfig | None, list[str]]:
    """Validate; on errors report every mistake of the input, not only the first layer.

    Pydantic runs a model's cross-field rules only once all its fields (and sub-models) validated, so a
    field mistake (`nodes.shmSize: 64`) hides the rules of its model and of every model above it
    (`nodes.count` above the listed nodes, duplicate model names). So: validate, remove each reported
    bad value from the input (its default applies), validate again and keep the problems that are new,
    until a round finds nothing new (at most MAX_ROUNDS). A problem at or below a key already reported
    or removed is not new: it is about a default that stands in for the user's value (a removed
    required key is 'missing', a removed list is empty). `reported` holds top-level keys already
    reported elsewhere (not an object, mistyped prefix).
    """
    current = copy.deepcopy(dict(raw))
    done = set(reported)
    removed: set[str] = set()
    lines: list[str] = []
    for _ in range(MAX_ROUNDS):
        try:
            config = StackConfig.model_validate(current)
        except ValidationError as exc:
            found = _lines(exc, removed)
        else:
            return (config if not lines else None), lines
        new = [line for line in found if not _within(_key_path(line), done) and line not in lines]
        if not new:
            break
        lines += new
        for line in new:
            done.add(_key_path(line))
            dropped = _drop(current, _key_path(line))
            if dropped:
                done.add(dropped)
                removed.add(dropped)
    return None, lines


def _lines(exc: ValidationError, removed: set[str]) -> list[str]:
    """The problem lines of one validation, without those of rules that read a removed key (a rule that
    compared `memlock.mode`'s default with `createScc` says nothing about what the user wrote)."""
    out: list[str] = []
    for error in exc.errors(include_url=False):
        problems = (error.get("ctx") or {}).get("error")
        if isinstance(problems, ConfigProblems) and removed:
            model_path = _path(_clean_loc(tuple(error.get("loc", ()))))
            keep = [
                p
                for p in problems.problems
                if not any(_within(d, {f"{model_path}.{key}" if model_path else key}) for key in p.reads for d in removed)
            ]
            if not keep:
                continue
            error = {**error, "ctx": {**error["ctx"], "error": ConfigProblems(keep)}}
        for line in format_errors(dict(error), StackConfig):
            if line not in out:
                out.append(line)
    return out


_cluster_files: dict[tuple[str, str], tuple[Any, list[str]]] = {}
"""`_read_cluster_file` by its arguments (a pure function of them): every environment render and check reads the
committed cluster file again."""


def _read_cluster_file(text: str, name: str) -> tuple[Any, list[str]]:
    """A cluster stack file's YAML data and its text-level problems (one line each; data None when it is no YAML)."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        return None, [f"{at}: invalid YAML: {getattr(exc, 'problem', None) or 'not YAML'} (the cluster stack of environment.cluster)"]
    return data, stackfile.problems(text, name)


def cluster_stack_raw(config_dir: Path, cluster: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The `ml-dev-env:` objects of the cluster stack file `Pulumi.<cluster>.yaml` (an environment's base), or its problems.

    Every mistake of that file (its text: duplicate keys, malformed `secure:`; its keys; its values) is a line that
    starts with the file's name: the user fixes it there, not in the environment's file.
    """
    path = config_dir / f"Pulumi.{cluster}.yaml"
    where = f"{PREFIX}environment.cluster"
    try:
        text = path.read_text()
    except OSError:  # absent, or no file name at all (a name longer than the file system takes)
        found = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in config_dir.glob("Pulumi.*.yaml"))
        shown = cluster if len(cluster) <= 70 else cluster[:67] + "..."
        return None, [f"{where}: got {shown!r}; no cluster stack file Pulumi.{shown}.yaml in this project (stacks: {', '.join(found)})"]
    key = (text, path.name)
    if key not in _cluster_files:
        _cluster_files[key] = _read_cluster_file(text, path.name)
    data, text_problems = copy.deepcopy(_cluster_files[key])
    if text_problems:
        return None, text_problems
    flat = (data.get("config") if isinstance(data, dict) else None) or {}
    raw, problems = parse_raw({k: v for k, v in flat.items() if not (isinstance(v, dict) and set(v) == {"secure"})})
    if is_environment(raw):
        return None, [f"{where}: got {cluster!r}; {path.name} is an environment stack, not a cluster stack"]
    if not problems:
        problems = validate_all(raw)[1]
    if problems:
        return None, [f"{path.name}: {line}" for line in problems]
    return raw, []


def app_names(config_dir: Path) -> dict[str, str]:
    """The appName of every stack file of the project (`Pulumi.<stack>.yaml`): a cluster stack's `cluster.appName`
    (default `ml-dev-env`), an environment stack's `<its cluster's appName>-<environment.name>`. A file that does not
    read is left out (its own render says why)."""
    default = str(ClusterConfig.model_fields["app_name"].default)
    raw: dict[str, dict[str, Any]] = {}
    for path in sorted(config_dir.glob("Pulumi.*.yaml")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        flat = (data.get("config") if isinstance(data, dict) else None) or {}
        raw[path.name[len("Pulumi.") : -len(".yaml")]] = flat if isinstance(flat, dict) else {}

    def own(flat: dict[str, Any]) -> str:
        cluster = flat.get("ml-dev-env:cluster")
        return str(cluster.get("appName", default)) if isinstance(cluster, dict) else default

    out: dict[str, str] = {}
    for name, flat in raw.items():
        env = flat.get("ml-dev-env:environment")
        if isinstance(env, dict):
            base = raw.get(str(env.get("cluster", "")))
            if base is not None and env.get("name"):
                out[name] = app_name(own(base), str(env["name"]))
        else:
            out[name] = own(flat)
    return out


def app_name_unique(config_dir: Path, stack: str, app: str) -> bool:
    """No other stack file of the project has this appName: its pod names (`<app>-<ordinal>`) may stay laptop SSH
    aliases beside `<cluster>-<environment>-<ordinal>` (components/devloop.py Laptop)."""
    return all(other != app for name, other in app_names(config_dir).items() if name != stack)


def stack_raw(raw_config: Mapping[str, Any], config_dir: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The raw objects of a stack (an environment stack: merged onto its cluster stack's) and the key problems.

    An environment whose cluster file does not load is returned unmerged (no `cluster` key) with that file's lines.
    """
    raw, problems = parse_raw(raw_config)
    if not is_environment(raw):
        return raw, problems
    cluster = str(raw["environment"].get("cluster", ""))
    base, base_problems = cluster_stack_raw(config_dir or Path.cwd(), cluster)
    if base is None:
        return {k: v for k, v in raw.items() if k != "cluster"}, [*problems, *base_problems]
    merged, env_problems = environment_config(base, raw)
    return merged, problems + env_problems


def check(raw_config: Mapping[str, Any], secret_keys: set[str], config_dir: Path | None = None) -> tuple[StackConfig | None, list[str]]:
    """Every problem of flat Pulumi config at once: keys, plain-text secrets, values, missing secrets.

    `secret_keys` are the `ml-dev-env:<key>` secrets that are set (as secrets). Returns the config
    (None when invalid) and one line per mistake; a key already reported (not an object, under a
    mistyped prefix) is not reported again as missing.
    """
    raw, problems = stack_raw(raw_config, config_dir)
    unmerged = is_environment(raw) and "cluster" not in raw  # its cluster file's lines say what is wrong there
    for key in SECRET_KEYS:
        full_key = PREFIX + key
        if raw_config.get(full_key) is not None and key not in secret_keys:
            problems.append(f"{full_key}: is stored in plain text; set it with `pulumi config set --secret {full_key} …`")
    reported = {k.partition(":")[2] for k in raw_config if any(p.startswith(f"{k}: ") for p in problems)}
    if unmerged:
        reported |= set(object_keys()) - set(raw)  # not "missing": they come from the cluster file
    config, value_problems = validate_all(raw, reported)
    if unmerged:  # a key the cluster file would give is not missing from the environment's file
        value_problems = [line for line in value_problems if not line.endswith(": required key is missing")]
    problems += value_problems
    if config is not None:
        problems += [
            f"{PREFIX}{key}: missing; {SECRET_KEYS[key]} — set it with `pulumi config set --secret {PREFIX}{key} …`"
            for key in sorted(required_secrets(config) - secret_keys)
        ]
    return config, problems


def warnings_for(config: StackConfig) -> list[str]:
    out = []
    net = config.network
    if net.mode == "rdma" and not net.rdma.enabled:
        out.append(
            f"network.mode is 'rdma' but network.rdma.enabled is false on cluster '{config.cluster.name}': "
            "deploying with TCP (NCCL_IB_DISABLE=1); the effective mode is in the 'network_mode' output"
        )
    if net.effective_mode == "tcp" and config.security.memlock.mode != "none":
        out.append("security.memlock is ignored in TCP mode: pods get no added capabilities (restricted-v2)")
    if net.effective_mode == "rdma" and config.security.memlock.mode == "none":
        out.append(
            "RDMA without security.memlock: pods keep the default 8 MiB memlock limit and NCCL may fail "
            "with IBV_WC_LOC_PROT_ERR; set memlock.mode 'scc'"
        )
    attachment_ns = net.rdma.attachment_namespace
    if net.effective_mode == "rdma" and attachment_ns and attachment_ns != config.cluster.namespace:
        # OpenShift runs Multus with namespace isolation: a pod may only use attachments of its own
        # namespace or a global one (openshift/cluster-network-operator bindata/network/multus/multus.yaml:
        # "namespaceIsolation": true, "globalNamespaces": "default,openshift-multus,openshift-sriov-network-operator,…").
        out.append(
            f"network.rdma.attachmentNamespace '{attachment_ns}' is not the stack's namespace '{config.cluster.namespace}': "
            "OpenShift's Multus only lets pods use attachments of their own namespace or a global one (default, "
            "openshift-multus, openshift-sriov-network-operator), and attachments there are shared with every other "
            "environment that names them"
            + (" (createAttachments on two stacks would fight over them)" if net.rdma.create_attachments else "")
        )
    memlock = config.security.memlock
    lacking = [c for c in SSHD_CAPABILITIES if c not in memlock.pod_capabilities]
    if net.effective_mode == "rdma" and memlock.mode == "scc" and lacking:
        # Only an SCC the admin owns (createScc false): the stack's own allows SYS_CHROOT and its pods add it.
        scc, cap = memlock.scc_name, lacking[0]
        out.append(
            f"security.memlock.capabilities lacks {cap}: the RDMA pods run as root and root's sshd (SSH between pods) "
            f"needs it, CRI-O does not grant it by default, so there is no SSH between pods; if SCC {scc} allows it "
            f"(`oc get scc {scc} -o jsonpath='{{.allowedCapabilities}}'`) add {cap} to security.memlock.capabilities, else "
            f'its admin runs `oc patch scc {scc} --type=json -p \'[{{"op":"add","path":"/allowedCapabilities/-",'
            f'"value":"{cap}"}}]\'` first (or set security.memlock.createScc true)'
        )
    product = config.nodes.gpu_product
    if product and "-" not in product:
        # NVIDIA/k8s-device-plugin internal/lm/resource.go productLabel: the label is NVML's device name with every
        # space made '-' (e.g. NVIDIA-H100-80GB-HBM3), so a single word is no product a node carries.
        out.append(
            f"nodes.gpuProduct {product!r} does not look like a value of the node label nvidia.com/gpu.product (NVML's "
            "device name, spaces as '-', e.g. NVIDIA-H100-80GB-HBM3): no node may match and the pods stay Pending; "
            "check with `oc get nodes -L nvidia.com/gpu.product`"
        )
    if config.nodes.gpus_per_node is None:
        out.append(
            f"nodes.gpusPerNode is not declared: nodes.gpusPerPod ({config.nodes.gpus_per_pod}) is not checked against the "
            "GPU nodes' capacity (a pod asking for more GPUs than a node has stays Pending); declare it"
        )
    if config.image.build is not None and config.build_nodes.tolerations:
        out.append(
            "buildNodes.tolerations do not apply to BuildConfigs (OpenShift has no per-build tolerations; "
            "an admin sets them in build.config.openshift.io/cluster buildOverrides); nodeSelector does apply"
        )
    return out


def load(source: str, config_dir: Path | None = None) -> LoadedStack:
    """Load the current stack's configuration (inside a Pulumi program); `config_dir` holds the stack files."""
    secrets: dict[str, pulumi.Output[str]] = {}
    cfg = pulumi.Config("ml-dev-env")
    for key in SECRET_KEYS:
        if cfg.get(key) is not None and pulumi.runtime.is_config_secret(PREFIX + key):
            secrets[key] = cfg.require_secret(key)
    config, problems = check(_all_config(), set(secrets), config_dir)
    # what the values cannot show (a key given twice, a malformed `secure:`): the stack file's own text
    problems = stackfile.file_problems(Path(source)) + problems
    if problems or config is None:
        raise pulumi.RunError(format_problems(problems, source))
    cluster = None
    if config.environment is not None:
        base, base_problems = cluster_stack_raw(config_dir or Path.cwd(), config.environment.cluster)
        cluster = validate_all(base)[0] if base is not None else None
        if cluster is None:
            raise pulumi.RunError(format_problems(base_problems or [f"{PREFIX}environment.cluster: its stack file does not load"], source))
    stack_name = Path(source).name.removeprefix("Pulumi.").removesuffix(".yaml")
    fit = gpus.tally(config_dir or Path.cwd(), stack_name, own=config)
    return LoadedStack(config=config, secrets=secrets, warnings=warnings_for(config), cluster=cluster, gpus=fit)


def required_secrets(config: StackConfig) -> set[str]:
    needed: set[str] = set()
    if config.access.auth == "token":
        needed |= {s.secret_key for s in config.access.enabled() if s.secret_key}
    for model in config.models:
        needed |= {key for cred, required in model.credentials().items() if required for _, key, _ in PIPELINE_CREDENTIALS[cred].keys}
    return needed
