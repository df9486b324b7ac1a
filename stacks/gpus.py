"""Do the GPUs the stacks of a cluster ask for fit its GPU nodes? One line with the numbers (render and preview).

The cluster's capacity is its GPU nodes (`nodes.gpuNodes` of the cluster stack: the nodes its stacks may schedule on)
× `nodes.gpusPerNode`; what is asked is `nodes.count` × `nodes.gpusPerPod` of the cluster stack and of every
environment stack of the checkout on that cluster (`Pulumi.*.yaml` beside it whose `environment.cluster` names it),
suspended ones (`lifecycle.suspended`, 0 replicas) asking nothing. Beyond the sum, the pods must also be placed:
one pod per node within a stack (required anti-affinity), on its own `gpuNodes` (an environment's are a subset of
the cluster's) or any of the cluster's, each pod on a node with `gpusPerPod` GPUs left (the scheduler's
NodeResourcesFit, kubernetes pkg/scheduler/framework/plugins/noderesources/fit.go `fitsRequest`). The live half
(allocatable and what running pods hold) is components/preflight.py `gpu_fit_line`. The same stacks are the ones whose
usage recorders the cluster stack lets read the nodes (`Tally.node_readers`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from core import naming
from stacks.config import StackConfig

PREFIX = "ml-dev-env:"


@dataclass(frozen=True)
class Ask:
    """The GPUs one stack asks for: `pods` pods of `per_pod` GPUs, each on its own node among `nodes`."""

    stack: str
    pods: int
    per_pod: int
    nodes: tuple[str, ...]
    suspended: bool = False
    namespace: str = ""
    app: str = ""
    reads_nodes: bool = False
    """Its usage recorder reads the nodes (its `lifecycle.usageReadsNodes`)."""

    @property
    def gpus(self) -> int:
        return 0 if self.suspended else self.pods * self.per_pod

    @property
    def shown(self) -> str:
        return f"{self.stack} {self.pods}×{self.per_pod}" + (" (suspended: 0)" if self.suspended else "")


@dataclass(frozen=True)
class Tally:
    """The cluster's GPU nodes and every stack's ask on them."""

    cluster: str
    nodes: tuple[str, ...]
    per_node: int | None
    asks: tuple[Ask, ...]

    @property
    def capacity(self) -> int | None:
        return len(self.nodes) * self.per_node if self.nodes and self.per_node else None

    @property
    def asked(self) -> int:
        return sum(a.gpus for a in self.asks)

    def placement(self) -> bool:
        """Whether every pod gets a node of its stack's list with GPUs left, one pod per node within a stack."""
        if self.capacity is None or self.per_node is None:
            return True
        free = dict.fromkeys(self.nodes, self.per_node)
        pods = sorted(
            ((a.stack, a.per_pod, a.nodes or self.nodes) for a in self.asks if not a.suspended for _ in range(a.pods)),
            key=lambda p: (len(p[2]), -p[1]),
        )
        used: set[tuple[str, str]] = set()

        def place(i: int) -> bool:
            if i == len(pods):
                return True
            stack, need, allowed = pods[i]
            for node in allowed:
                if free.get(node, 0) >= need and (stack, node) not in used:
                    free[node] -= need
                    used.add((stack, node))
                    if place(i + 1):
                        return True
                    free[node] += need
                    used.discard((stack, node))
            return False

        return place(0) if len(pods) <= 64 else self.asked <= self.capacity

    def node_readers(self) -> tuple[str, ...]:
        """`<namespace>/<ServiceAccount>` of the usage recorder of every stack here that reads the nodes: the cluster
        stack binds its node reader to each (components/gpu_cluster.py _usage_node_reader); none when the cluster
        stack's own `lifecycle.usageReadsNodes` is false (no cluster-scoped objects at all)."""
        if not any(a.stack == self.cluster and a.reads_nodes for a in self.asks):
            return ()
        return tuple(dict.fromkeys(f"{a.namespace}/{naming.usage_recorder(a.app)}" for a in self.asks if a.reads_nodes))

    @property
    def line(self) -> str:
        asks = ", ".join(a.shown for a in self.asks)
        head = f"GPUs on cluster {self.cluster}: {self.asked} asked ({asks})"
        if self.capacity is None:
            return (
                f"{head}; the capacity is unknown: declare nodes.gpuNodes and nodes.gpusPerNode in Pulumi.{self.cluster}.yaml "
                "(list them: oc get nodes -l nvidia.com/gpu.present=true -o custom-columns=NODE:.metadata.name,"
                "GPUS:.status.allocatable.nvidia\\.com/gpu)"
            )
        have = f"of {self.capacity} ({len(self.nodes)} gpuNodes × {self.per_node} gpusPerNode)"
        if self.asked > self.capacity:
            return (
                f"{head} {have}: never fits, {self.asked - self.capacity} more than the nodes have: lower nodes.count or "
                "nodes.gpusPerPod, or suspend a stack (lifecycle.suspended: true)"
            )
        if not self.placement():
            return (
                f"{head} {have}: never fits as pinned: no placement gives every pod a node of its nodes.gpuNodes with "
                "nodes.gpusPerPod GPUs left (one pod per node within a stack): widen a stack's nodes.gpuNodes"
            )
        return f"{head} {have}: fits"

    @property
    def fits(self) -> bool:
        return self.line.endswith(": fits")


_loaded: dict[tuple[str, tuple[tuple[str, str], ...]], StackConfig | None] = {}
"""`_settings` by the file and the texts of every stack file beside it (an environment reads its cluster's)."""


def _settings(path: Path) -> StackConfig | None:
    """A stack file's validated config (an environment's merged onto its cluster's), or None if it does not load."""
    try:
        texts = tuple(sorted((p.name, p.read_text()) for p in path.parent.glob("Pulumi.*.yaml")))
    except OSError:
        return None
    key = (path.name, texts)
    if key not in _loaded:
        _loaded[key] = _read_settings(path)
    return _loaded[key]


def _read_settings(path: Path) -> StackConfig | None:
    from stacks.loader import stack_raw, validate_all  # the loader reads this module: imported when used

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return None
    flat = {
        k: (json.dumps(v) if isinstance(v, dict | list) else ("true" if v is True else "false" if v is False else str(v)))
        for k, v in config.items()
        if not (isinstance(v, dict) and set(v) == {"secure"})
    }
    raw, _ = stack_raw(flat, path.parent)
    return validate_all(raw)[0]


def _environment_cluster(path: Path) -> str | None:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    env = ((data.get("config") or {}) if isinstance(data, dict) else {}).get(f"{PREFIX}environment")
    cluster = env.get("cluster") if isinstance(env, dict) else None
    return cluster if isinstance(cluster, str) else None


def tally(config_dir: Path, stack: str, own: StackConfig | None = None) -> Tally | None:
    """The GPU tally of the cluster `stack` runs on (a cluster stack's own, or its environment's cluster's); `own`: the
    stack's config as the program loaded it (else read from its file)."""
    if own is not None:
        cluster = own.environment.cluster if own.environment is not None else stack
    else:
        cluster = _environment_cluster(config_dir / f"Pulumi.{stack}.yaml") or stack
    cluster_settings = own if own is not None and cluster == stack else _settings(config_dir / f"Pulumi.{cluster}.yaml")
    if cluster_settings is None:
        return None
    environments = {p.name[len("Pulumi.") : -len(".yaml")] for p in config_dir.glob("Pulumi.*.yaml") if _environment_cluster(p) == cluster}
    stacks = [cluster, *sorted(environments | ({stack} if stack != cluster else set()))]
    asks = []
    for name in stacks:
        if name == cluster:
            settings: StackConfig | None = cluster_settings
        else:
            settings = own if own is not None and name == stack else _settings(config_dir / f"Pulumi.{name}.yaml")
        if settings is None:
            continue  # a stack that does not load says so itself
        nodes = settings.nodes
        asks.append(
            Ask(
                name,
                nodes.count,
                nodes.gpus_per_pod,
                tuple(nodes.gpu_nodes),
                settings.lifecycle.suspended,
                settings.cluster.namespace,
                settings.cluster.app_name,
                settings.lifecycle.usage_reads_nodes,
            )
        )
    own_nodes = cluster_settings.nodes
    return Tally(cluster, tuple(own_nodes.gpu_nodes), own_nodes.gpus_per_node, tuple(asks))


def gpu_line(config_dir: Path, stack: str) -> str | None:
    """`tally(...).line`, or None when the cluster stack does not load."""
    found = tally(config_dir, stack)
    return found.line if found is not None else None
