"""Environment stacks: one person's environment on a cluster stack's cluster (docs: Use, "Team environments").

An environment stack's file holds only what is personal (`ENVIRONMENT_KEYS`); every other setting comes from
its cluster stack's file in the same project. `environment_config` merges the two into the raw config the
program validates, renamed so that no object of the environment shares a name with the cluster's or another
environment's (every name carries `<cluster appName>-<environment name>`). What the cluster stack *deployed*
(its runtime image, SCC, shared claims) reaches the environment through the cluster's versioned
`environment_facts` output (`ClusterFacts`), read with a Pulumi StackReference in `__main__.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from core import naming
from core.servers import DEV_SERVERS, longest_routed_name
from stacks.base import Model
from stacks.config import MEMLOCK_CAPABILITIES, SSHD_CAPABILITIES

ENVIRONMENT_KEYS = ("environment", "nodes", "access", "ssh", "lifecycle", "env")
"""The only `ml-dev-env:` keys an environment stack sets (at most 15 lines of config)."""
MERGED_KEYS = ("nodes", "access", "lifecycle")
"""Personal keys merged onto the cluster's (a key the environment leaves out keeps the cluster's value)."""
FACTS_VERSION = 1
FACTS_OUTPUT = "environment_facts"


class ClusterFacts(Model):
    """What every environment needs from its deployed cluster stack: the `environment_facts` output (versioned).

    Read leniently (facts evolve): a field this program does not know is ignored, so a cluster deployed by a newer
    program of the same version still serves older checkouts.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True)

    version: int = Field(description="FACTS_VERSION of the program that deployed the cluster stack.")
    cluster: str
    namespace: str
    app_name: str
    runtime_image: str = Field(description="The image the cluster's pods run (its built runtime tag, or the configured reference).")
    # None is absent once read back: the SDK drops a field that deserializes to None (pulumi/pulumi
    # sdk/python/lib/pulumi/runtime/rpc.py deserialize_properties), so a cluster without an SCC exports neither key.
    scc: str | None = Field(None, description="The SCC the RDMA pods use (None: no memlock SCC).")
    scc_role: str | None = Field(None, description="The Role in the cluster namespace granting `use` of a created SCC.")
    shared_claims: dict[str, str] = Field(description="Shared volume name → claim in the cluster namespace.")
    usage_node_readers: tuple[str, ...] = Field(
        (),
        description="`<namespace>/<ServiceAccount>` of every usage recorder the cluster stack's last `up` let read the "
        "nodes and their Leases (itself and its environment stacks then in the checkout; none with usageReadsNodes false). "
        "Absent (a cluster deployed by an older program): none.",
    )


ENVIRONMENT_KEY = "ml-dev-env:environment.cluster"


def _version(value: Any) -> int | None:
    """The facts version as an integer; None when it is none. Outputs read through a StackReference carry numbers as
    floats (pulumi/pulumi sdk/python/lib/pulumi/runtime/rpc.py: numbers travel as protobuf `number_value`, a double;
    `StackReference.outputs` is `dict[str, Any]`, so nothing casts them back), so 1.0 is version 1."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def read_facts(deployed: Any, cluster: str, stack_ref: str) -> tuple[ClusterFacts | None, str | None]:
    """The deployed `environment_facts` of `cluster` (read from `stack_ref`), or one line saying why they cannot serve.

    Never a traceback: an older or missing version asks the cluster owner to redeploy; a newer one asks this checkout
    to update (it cannot know what the newer facts mean); a missing or mistyped field is named.
    """
    where = f"{ENVIRONMENT_KEY}: the cluster stack {stack_ref}"
    if not deployed:
        return None, (
            f"{where} has no {FACTS_OUTPUT} output: {cluster} was never deployed, or by a program older than environment "
            "stacks; ask the cluster owner to deploy it"
        )
    if not isinstance(deployed, dict):
        return None, f"{where} exports {FACTS_OUTPUT} {deployed!r}, not an object; ask the cluster owner to redeploy {cluster}"
    raw = deployed.get("version")
    version = _version(raw)
    if version is None:
        got = "without a version" if raw is None else f"with version {raw!r} (not an integer)"
        return None, (
            f"{where} exports {FACTS_OUTPUT} {got}; this checkout reads version {FACTS_VERSION}: "
            f"the cluster owner redeploys {cluster} with a current checkout"
        )
    if version > FACTS_VERSION:
        return None, (
            f"{where} was deployed by a newer program ({FACTS_OUTPUT} version {version}, this checkout reads "
            f"{FACTS_VERSION}): update your checkout (git pull)"
        )
    if version < FACTS_VERSION:
        return None, (
            f"{where} was deployed by an older program ({FACTS_OUTPUT} version {version}, this checkout reads "
            f"{FACTS_VERSION}): the cluster owner redeploys {cluster} with a current checkout"
        )
    try:
        facts = ClusterFacts.model_validate({**deployed, "version": version})
    except ValidationError as exc:
        fields = []
        for error in exc.errors(include_url=False):
            key = ".".join(str(p) for p in error.get("loc", ()))
            fields.append(f"{key} missing" if error.get("type") == "missing" else f"{key} {error.get('input')!r} ({error.get('msg')})")
        return None, (
            f"{where} exports {FACTS_OUTPUT} version {version} without what this checkout needs ({'; '.join(fields)}); "
            f"the cluster owner redeploys {cluster} with a current checkout"
        )
    return facts, None


def is_environment(raw: Mapping[str, Any]) -> bool:
    return isinstance(raw.get("environment"), dict)


def app_name(cluster_app: str, environment: str) -> str:
    return f"{cluster_app}-{environment}"


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base.get(key), value)
        return out
    return copy.deepcopy(over)


PREFIX = "ml-dev-env:"
STAND_IN = "environment"
"""The name the merged config carries while `environment.name` is refused (its one line says why; no derived key repeats it)."""


def reserved_words(cluster_raw: Mapping[str, Any]) -> set[str]:
    """Words an environment name may not contain on this cluster: what follows `<appName>-` in the cluster's names."""
    volumes = ((cluster_raw.get("storage") or {}).get("volumes")) or []
    return (
        set(naming.APP_SUFFIX_WORDS)
        | {s.name for s in DEV_SERVERS}
        | {str(v.get("name")).split("-")[0] for v in volumes if isinstance(v, dict) and v.get("name")}
    )


def max_name_length(cluster_app: str, namespace: str) -> int:
    """The longest environment name whose `<cluster appName>-<name>` passes cluster.appName's limits (stacks/config.py
    ClusterConfig: at most 40 characters; `<appName>-<longest server>-<namespace>` a 63-character DNS label)."""
    return min(40, 63 - len(longest_routed_name()) - 1 - len(namespace) - 1) - len(cluster_app) - 1


def name_problems(env: Mapping[str, Any], cluster_app: str, cluster_ns: str, reserved: set[str]) -> dict[str, str]:
    """One line per refused `environment.name`/`environment.namespace`, keyed by the key (the loader stands in valid
    values for them, so keys the user never wrote, such as cluster.appName, report nothing)."""
    out: dict[str, str] = {}
    name, namespace = env.get("name"), env.get("namespace")
    ns_ok = namespace is None or (isinstance(namespace, str) and bool(naming.DNS_LABEL.match(namespace)))
    if namespace is not None and not ns_ok:
        out["namespace"] = ""  # not a DNS label: the field's own check names it
    own_ns = namespace if isinstance(namespace, str) and ns_ok else cluster_ns
    if not isinstance(name, str) or not naming.DNS_LABEL.match(name):
        out["name"] = ""  # the field's own check names it
        return out
    limit = max_name_length(cluster_app, own_ns)
    words = [w for w in name.split("-") if w in reserved or w.isdigit()]
    if len(name) > limit and own_ns != cluster_ns and len(name) <= max_name_length(cluster_app, cluster_ns):
        longest = len(own_ns) - (len(name) - limit)
        out["namespace"] = (
            f"{PREFIX}environment.namespace: got {own_ns!r}; at most {longest} characters with environment.name {name!r} "
            f"on this cluster (route hosts '{cluster_app}-{name}-<server>-<namespace>' must fit a 63-character DNS label)"
        )
    elif len(name) > limit:
        out["name"] = (
            f"{PREFIX}environment.name: got {name!r}; at most {limit} characters on this cluster (appName "
            f"'{cluster_app}-<name>' at most 40, route hosts '<appName>-<server>-{own_ns}' a 63-character DNS label)"
        )
    elif words:
        out["name"] = (
            f"{PREFIX}environment.name: got {name!r}; {words[0]!r} is {'a number' if words[0].isdigit() else 'a word'} the "
            f"cluster's own names use after "
            f"'{cluster_app}-' (its objects would collide): choose a name without the words "
            f"{', '.join(sorted(reserved))} or a number"
        )
    return out


def environment_config(cluster_raw: Mapping[str, Any], env_raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The raw config of an environment stack (cluster file + personal keys, renamed), and its problems.

    Problems name the environment stack's key: one line each (keys it may not set, nodes outside the cluster's).
    """
    problems: list[str] = []
    for key in env_raw:
        if key not in ENVIRONMENT_KEYS:
            problems.append(
                f"ml-dev-env:{key}: an environment stack (it sets ml-dev-env:environment) takes only "
                f"{', '.join(ENVIRONMENT_KEYS)}; {key} comes from its cluster stack"
            )
    env = dict(env_raw["environment"])
    raw: dict[str, Any] = copy.deepcopy({k: v for k, v in cluster_raw.items() if k != "models"})
    for key in MERGED_KEYS:
        if key in env_raw:
            raw[key] = _merge(raw.get(key) or {}, env_raw[key])
    # SSH keys are personal: the cluster owner's authorized keys never reach another person's pods.
    raw["ssh"] = copy.deepcopy(env_raw.get("ssh") or {})
    # So are Secrets (env.secrets): the cluster owner's WANDB_API_KEY never reaches another person's ranks.
    raw["env"] = copy.deepcopy(env_raw.get("env") or {})
    raw["environment"] = env
    cluster = dict(raw.get("cluster") or {})
    cluster_app = str(cluster.get("appName") or "ml-dev-env")
    cluster_ns = cluster.get("namespace")
    refused = name_problems(env, cluster_app, str(cluster_ns or ""), reserved_words(cluster_raw))
    problems += [line for line in refused.values() if line]
    name = STAND_IN if "name" in refused else str(env.get("name", ""))
    cluster["appName"] = app_name(cluster_app, name)
    cluster["namespace"] = (None if "namespace" in refused else env.get("namespace")) or cluster_ns
    cluster["createNamespace"] = False
    raw["cluster"] = cluster
    # Its own ServiceAccount (its OAuth redirects name only its own Routes).
    security = dict(raw.get("security") or {})
    security["serviceAccount"] = cluster["appName"]
    security["createServiceAccount"] = True
    memlock = dict(security.get("memlock") or {})
    if memlock.get("mode") == "scc" and memlock.get("createScc") and memlock.get("sccName") and cluster_ns:
        # The cluster stack owns the SCC (cluster-scoped, named per stack); the environment only uses it.
        memlock["sccName"] = naming.stack_scc_name(str(memlock["sccName"]), str(cluster_ns), cluster_app)
        memlock["createScc"] = False
        # That SCC allows what the cluster's own pods add (MemlockConfig.pod_capabilities): root's sshd's SYS_CHROOT.
        caps = memlock.get("capabilities", list(MEMLOCK_CAPABILITIES))
        if isinstance(caps, list):
            memlock["capabilities"] = list(dict.fromkeys([*caps, *SSHD_CAPABILITIES]))
    security["memlock"] = memlock
    raw["security"] = security
    network = copy.deepcopy(raw.get("network") or {})
    if isinstance(network.get("rdma"), dict):
        network["rdma"]["createAttachments"] = False  # the cluster stack owns the NetworkAttachmentDefinitions
    raw["network"] = network
    gpu_nodes = ((cluster_raw.get("nodes") or {}).get("gpuNodes")) or []
    wanted = ((env_raw.get("nodes") or {}).get("gpuNodes")) or []
    outside = [n for n in wanted if gpu_nodes and n not in gpu_nodes]
    if outside:
        problems.append(
            f"ml-dev-env:nodes.gpuNodes: got {outside!r}; an environment uses a subset of its cluster's nodes: {', '.join(gpu_nodes)}"
        )
    return raw, problems
