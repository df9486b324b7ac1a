"""Lifecycle of the environment: suspend / resume, the idle agent's settings and RBAC, Kueue gang admission.

Pure builders used by `GpuCluster` (kept apart so the pod-template code stays readable):

* **Suspend** is `spec.replicas: 0`; nothing else changes, so every claim, Route, Secret, image and
  computed setting stays and a resume brings back the same ordinals on their claims.
* **Pulumi and the idle agent share `spec.replicas`.** The agent scales through the `statefulsets/scale`
  subresource with its own field manager; the next `pulumi up` that touches the StatefulSet re-applies
  `replicas` with server-side apply. Without force that apply is a field-manager conflict, so the
  StatefulSet carries `pulumi.com/patchForce: "true"` (pulumi-kubernetes provider/pkg/await/await.go,
  `patchForce()` returns true for that annotation and `ssaUpdate()` sends it as `Force` in the apply
  PatchOptions). A plain `pulumi preview` after an auto-stop shows no change (the state still says N);
  `pulumi preview --refresh` / `pulumi up --refresh` read the live 0 and bring N back (the provider diffs
  new inputs against the checkpoint's live object: provider/pkg/provider/provider.go `kubeProvider.Diff`,
  `pruneLiveState`).
* **Idle agent** (inpod/idle/, `idle_agent.py` in the pod) runs inside the main container of every pod
  (it needs that container's GPUs, processes and terminals); pod 0 decides for the whole environment.
  Its settings live in the `<app>-lifecycle` ConfigMap, mounted as a directory so that a settings
  change reaches running pods without a restart. Its RBAC is `get`/`update` of `statefulsets/scale`
  for this one StatefulSet, `create` events, and `get`/`update`/`patch` of one ConfigMap that holds the
  stop record — never `patch statefulsets` (that could change the pod template).
* **Checkpoint before every stop**: the main container's preStop hook and PID 1's SIGTERM trap run
  inpod/sh/checkpoint_stop.sh, which gives every rank of a running `ml-dev run` `checkpointSignal` and
  `checkpointGraceSeconds` to save; the pod's terminationGracePeriodSeconds is that grace plus
  STOP_MARGIN_SECONDS for the dev servers to stop (the kubelet counts the preStop hook's time against
  the same period: kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go, killContainer).
* **Kueue**: only the `kueue.x-k8s.io/queue-name` label on the StatefulSet (Kueue's StatefulSet
  integration, kubernetes-sigs/kueue site/content/en/docs/tasks/run/statefulset.md "Queue selection";
  pkg/controller/jobs/statefulset/statefulset_reconciler.go `syncQueueLabel()` copies it onto the pods,
  so the pod template stays untouched).
"""

from __future__ import annotations

import json

import pulumi_kubernetes as k8s

import inpod
from core import naming
from inpod import contract
from stacks.config import StackConfig, duration_seconds

WARNING_SNIPPET = inpod.path("idle-warning.sh")
SETTINGS_MOUNT = contract.SETTINGS_MOUNT
SETTINGS_KEY = contract.SETTINGS_KEY
SETTINGS_VOLUME = "lifecycle"
ACTIVITY_PORT = contract.ACTIVITY_PORT
PATCH_FORCE = "pulumi.com/patchForce"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
STOP_SCRIPT = "checkpoint_stop.sh"
STOP_MARGIN_SECONDS = 15


def termination_grace_seconds(config: StackConfig) -> int:
    """The pod's terminationGracePeriodSeconds: the ranks' checkpoint grace plus the servers' margin."""
    return config.lifecycle.checkpoint_grace_seconds + STOP_MARGIN_SECONDS


def stop_env(config: StackConfig) -> dict[str, str]:
    """What PID 1, the preStop hook and `ml-dev run`/`rank` read about a stop or a stall (the watchdog's time)."""
    return {
        contract.CHECKPOINT_GRACE_ENV: str(config.lifecycle.checkpoint_grace_seconds),
        contract.CHECKPOINT_SIGNAL_ENV: config.lifecycle.checkpoint_signal,
        contract.STALL_SECONDS_ENV: str(config.lifecycle.stall_verdict_seconds),
    }


def pre_stop() -> k8s.core.v1.LifecycleArgs:
    """The main container's preStop hook: checkpoint the running ranks before the kubelet's SIGTERM."""
    return k8s.core.v1.LifecycleArgs(
        pre_stop=k8s.core.v1.LifecycleHandlerArgs(
            exec_=k8s.core.v1.ExecActionArgs(command=["/bin/bash", f"{naming.STARTUP_MOUNT}/{STOP_SCRIPT}"])
        )
    )


def scripts() -> dict[str, str]:
    """Files delivered with the startup script (same ConfigMap, mounted at /opt/ml-dev-env)."""
    return inpod.group("lifecycle")


def replicas(config: StackConfig) -> int:
    return 0 if config.lifecycle.suspended else config.nodes.count


def statefulset_annotations() -> dict[str, str]:
    return {PATCH_FORCE: "true"}


def statefulset_labels(config: StackConfig) -> dict[str, str]:
    queue = config.lifecycle.kueue.queue_name
    return {KUEUE_QUEUE_LABEL: queue} if queue else {}


def agent_settings(config: StackConfig) -> contract.IdleSettings:
    """The JSON the agent reads each interval (`idle.json`, inpod/contract.py IdleSettings): settings (seconds and
    percents) plus the names it acts on."""
    app, idle = config.cluster.app_name, config.lifecycle.idle_stop
    return {
        "enabled": idle.enabled,
        "idleTimeoutSeconds": duration_seconds(idle.idle_timeout),
        "intervalSeconds": duration_seconds(idle.interval),
        "warningLeadSeconds": duration_seconds(idle.warning_lead),
        "gpuUtilThreshold": idle.gpu_util_threshold,
        "gpuMemoryUtilThreshold": idle.gpu_memory_util_threshold,
        "gpuMemoryFloorMiB": idle.gpu_memory_floor_mib,
        "unreachableSeconds": duration_seconds(idle.unreachable_after),
        "statefulset": app,
        "namespace": config.cluster.namespace,
        "recordConfigMap": naming.idle_record_configmap(app),
        "activityPort": ACTIVITY_PORT,
        "servers": list(config.access.servers),
    }


def settings_json(config: StackConfig) -> str:
    return json.dumps(agent_settings(config), indent=2, sort_keys=True) + "\n"


def settings_volume(app: str) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=SETTINGS_VOLUME, config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=naming.lifecycle_configmap(app))
    )


def settings_mount() -> k8s.core.v1.VolumeMountArgs:
    # A directory mount (no subPath): kubelet updates the file in place when the settings change.
    return k8s.core.v1.VolumeMountArgs(name=SETTINGS_VOLUME, mount_path=SETTINGS_MOUNT, read_only=True)


def agent_rules(app: str) -> list[k8s.rbac.v1.PolicyRuleArgs]:
    return [
        k8s.rbac.v1.PolicyRuleArgs(api_groups=["apps"], resources=["statefulsets/scale"], resource_names=[app], verbs=["get", "update"]),
        k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["events"], verbs=["create"]),
        k8s.rbac.v1.PolicyRuleArgs(
            api_groups=[""], resources=["configmaps"], resource_names=[naming.idle_record_configmap(app)], verbs=["get", "update", "patch"]
        ),
    ]


USAGE_LABEL = contract.USAGE_LABEL
USAGE_PERIOD = 600
"""Seconds between two GPU-hours records (the usage Deployment's loop: every 10 minutes)."""


def usage_rules(app: str) -> list[k8s.rbac.v1.PolicyRuleArgs]:
    """The usage recorder (its own ServiceAccount, which no environment pod has): list the pods it counts, write its record."""
    return [
        k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=["list"]),
        k8s.rbac.v1.PolicyRuleArgs(
            api_groups=[""], resources=["configmaps"], resource_names=[naming.usage_configmap(app)], verbs=["get", "patch"]
        ),
    ]


NODE_LEASE_NAMESPACE = "kube-node-lease"
"""Where each kubelet keeps its node's Lease (kubernetes pkg/kubelet/kubelet.go NewMainKubelet: lease.NewController with
v1.NamespaceNodeLease), renewed every 10 s (NodeLeaseDurationSeconds 40 × nodeLeaseRenewIntervalFraction 0.25)."""


def node_reader_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    """The usage recorder's ClusterRole: read the nodes (their Ready condition; inpod/usage.py Nodes)."""
    return [k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=["get", "list"])]


def node_lease_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    """The usage recorder's Role in kube-node-lease: read the nodes' Leases (the kubelet's 10 s heartbeat)."""
    return [k8s.rbac.v1.PolicyRuleArgs(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "list"])]


def usage_reader_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    """`ml-dev status --all` in a pod (the pods' ServiceAccount): list the namespace's environments, records and pods;
    `ml-dev status --start` (the start ledger, inpod/lib/ledger.py): the pods' events and Kueue's Workloads too."""
    return [
        k8s.rbac.v1.PolicyRuleArgs(api_groups=["apps"], resources=["statefulsets"], verbs=["list"]),
        k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["configmaps", "pods", "events"], verbs=["list"]),
        k8s.rbac.v1.PolicyRuleArgs(api_groups=["kueue.x-k8s.io"], resources=["workloads"], verbs=["list"]),
    ]


def usage_selector(app: str) -> dict[str, str]:
    """The usage recorder's pod labels (never selected by the environment's own Services)."""
    return {"app.kubernetes.io/name": "ml-dev-env-usage", "app.kubernetes.io/instance": app}


def usage_volume(app: str) -> k8s.core.v1.VolumeArgs:
    """The recorder's program from the startup ConfigMap: its launcher and the package modules it imports, at their paths
    (items; k8s.io/api core/v1/types.go KeyToPath), so the pod runs the same files as the environment's pods."""
    keys = {**inpod.group("package"), **inpod.group("usage")}
    return k8s.core.v1.VolumeArgs(
        name="program",
        config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
            name=naming.startup_configmap(app),
            default_mode=0o555,
            items=[k8s.core.v1.KeyToPathArgs(key=i["key"], path=i["path"]) for i in inpod.items(keys)],
        ),
    )


def usage_recorder_spec(config: StackConfig) -> k8s.apps.v1.DeploymentSpecArgs:
    """One small pod running inpod/usage.py `loop` (a record every USAGE_PERIOD s) on a stdlib Python image (the pipeline's
    tools base). A Deployment, not a CronJob: no pod start every period, and the strict schemas know it."""
    app, ns = config.cluster.app_name, config.cluster.namespace
    command = ["python3", f"{naming.STARTUP_MOUNT}/usage.py", "loop", "--namespace", ns, "--statefulset", app]
    command += ["--configmap", naming.usage_configmap(app), "--gpus-per-pod", str(config.nodes.gpus_per_pod), "--period", str(USAGE_PERIOD)]
    command += ["--selector", ",".join(f"{k}={v}" for k, v in naming.selector_labels(app).items())]
    return k8s.apps.v1.DeploymentSpecArgs(
        replicas=1,
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=usage_selector(app)),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=usage_selector(app)),
            spec=k8s.core.v1.PodSpecArgs(
                # Its own identity: the pods' ServiceAccount cannot write the record (anyone in a pod could zero it).
                service_account_name=naming.usage_recorder(app),
                termination_grace_period_seconds=5,
                security_context=k8s.core.v1.PodSecurityContextArgs(
                    run_as_non_root=True, seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")
                ),
                containers=[
                    k8s.core.v1.ContainerArgs(
                        name="record",
                        image=config.model_pipeline.tools_base_image,
                        image_pull_policy="IfNotPresent",
                        command=command,
                        resources=k8s.core.v1.ResourceRequirementsArgs(
                            requests={"cpu": "5m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
                        ),
                        security_context=k8s.core.v1.SecurityContextArgs(
                            allow_privilege_escalation=False, capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"])
                        ),
                        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="program", mount_path=naming.STARTUP_MOUNT, read_only=True)],
                    )
                ],
                volumes=[usage_volume(app)],
            ),
        ),
    )


def frees(config: StackConfig) -> dict[str, int]:
    """What a suspended environment gives back to the cluster."""
    nodes = config.nodes
    nics = 0
    if config.network.effective_mode == "rdma":
        nics = nodes.count * len(config.network.rdma.sriov_resources) * config.network.rdma.sriov_resource_count
    return {"pods": nodes.count, "gpus": nodes.count * nodes.gpus_per_pod, "rdmaNics": nics}


def summary(config: StackConfig) -> dict[str, object]:
    """The `lifecycle` stack output."""
    lc = config.lifecycle
    app, ns = config.cluster.app_name, config.cluster.namespace
    out: dict[str, object] = {
        "state": "suspended" if lc.suspended else "running",
        "replicas": replicas(config),
        "idle_stop": lc.idle_stop.enabled,
        "kueue_queue": lc.kueue.queue_name or "",
        "stop_record": f"{naming.oc(config.cluster.kube_context)} get configmap {naming.idle_record_configmap(app)} -n {ns} -o yaml",
    }
    if lc.suspended:
        out["frees"] = frees(config)
        out["resume"] = "pulumi config set --path 'ml-dev-env:lifecycle.suspended' false && pulumi up"
    else:
        out["resume_after_idle_stop"] = "pulumi up --refresh"
    return out
