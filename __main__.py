"""ml-dev-env: load the stack config, create the Kubernetes provider and the components, export outputs."""

from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components import devloop, live_checks
from components import environment as layers
from components.gpu_cluster import GpuCluster, GpuClusterArgs
from components.image_build import ImageBuild, ImageBuildArgs
from components.model_pipeline import ModelPipeline, ModelPipelineArgs
from core import naming
from core.servers import routed_servers
from stacks import loader
from stacks.environment import FACTS_OUTPUT

# Two kinds of stack, one program (docs: Use, "Team environments"): a cluster stack (`Pulumi.<cluster>.yaml`) builds the
# cluster layer (image builds, model pipeline, SCC, shared claims) and hosts its own environment; an environment stack
# (`Pulumi.<cluster>-<env>.yaml`, it sets `environment`) builds one person's environment on the cluster's image.
stack = loader.load(f"Pulumi.{pulumi.get_stack()}.yaml", Path(__file__).resolve().parent)
for warning in stack.warnings:
    pulumi.log.warn(warning)
cfg = stack.config
environment = cfg.environment

# Adoption: objects that already exist (the original tool's, or claims/PipelineRuns retained by a `destroy`)
# are taken over instead of failing with "already exists". With upsertExistingObjects a create is a
# server-side apply PATCH (pulumi/pulumi-kubernetes provider/pkg/await/await.go, `Creation`). That apply
# forces field conflicts only in preview (await.go `patchForce`: forced when there is no live state in a
# preview, never on a real create unless enablePatchForce or the pulumi.com/patchForce annotation), so a
# preview would pass and the `up` fail on fields another manager (kubectl, oc) set: enablePatchForce takes the
# fields this program declares; fields it does not declare stay with their managers.
# enableConfigMapMutable: without it a change of a ConfigMap's `data` forces a replacement
# (pulumi/pulumi-kubernetes provider/pkg/provider/diff.go, `forceNewProperties`: `.data`/`.binaryData` of a
# ConfigMap are replace-triggering unless `enableConfigMapMutable` is set, provider.go `Configure`), and a
# fixed name makes that a delete-before-replace: a `nodes.count` change would delete `<app>-cluster` under the
# running pods. With it, both ConfigMaps are updated in place (adding the flag is an update of the provider,
# not a replacement: provider.go `DiffConfig` replaces only on cluster/context/kubeconfig/render-dir changes).
provider = k8s.Provider(
    "k8s",
    context=cfg.cluster.kube_context,
    namespace=cfg.cluster.namespace,
    render_yaml_to_directory=cfg.cluster.render_yaml_to_directory,
    enable_server_side_apply=True,
    upsert_existing_objects=True,
    enable_patch_force=True,
    enable_config_map_mutable=True,
)
opts = pulumi.ResourceOptions(providers=[provider])

# Every object this stack creates carries `ml-dev-env/stack: <stack>` in its own metadata (pod templates unchanged);
# at preview and up, one that exists with another stack's label stops the run (components/environment.py).
pulumi.runtime.register_stack_transformation(layers.stack_label_transformation(pulumi.get_stack(), live_checks.live_reader(cfg)))

if cfg.cluster.create_namespace:
    namespace = k8s.core.v1.Namespace(
        "namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=cfg.cluster.namespace, labels=dict(naming.PART_OF)),
        # Deleting the namespace would delete every PVC in it: keep it on destroy.
        opts=pulumi.ResourceOptions(provider=provider, retain_on_delete=True),
    )
    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[namespace]))

app, ns = cfg.cluster.app_name, cfg.cluster.namespace
# what the cluster holds that the apply could not adopt or the pods need (components/live_checks.py)
live_checks.check_all(cfg, stack.gpus)
live_checks.check_image_volumes(cfg, stack.cluster or cfg)

labels = naming.stack_labels(cfg.cluster.name)
image: pulumi.Input[str] | None
cluster_facts = None
deployed_facts = None
if environment is not None:
    # The environment layer only: the pods run the image the cluster stack deployed, read from its versioned
    # `environment_facts` output through a StackReference (pulumi/pulumi sdk/python/lib/pulumi/stack_reference.py,
    # StackReference.get_output: the referenced stack's outputs, read when the program runs in preview and up).
    # The cluster's file gives the shape of the environment's objects (namespace, names, SCC or none, shared claims)
    # before any output is known; what is deployed gives what they refer to (runtime image, SCC, Role, claim names).
    # Only a shape difference stops the run, with one line (components/environment.py checked_facts).
    assert stack.cluster is not None  # the loader read the cluster stack file of every environment stack
    cluster_facts = layers.cluster_facts(stack.cluster)
    reference = environment.stack_reference or f"{pulumi.get_organization()}/{pulumi.get_project()}/{environment.cluster}"
    cluster_stack = pulumi.StackReference(f"cluster-{environment.cluster}", stack_name=reference)
    expected, cluster_cfg = cluster_facts, stack.cluster

    def checked(deployed: Any) -> Any:
        facts, problem = layers.checked_facts(deployed, expected, reference)
        if facts is None:
            raise pulumi.RunError(problem or "")
        return facts

    def read_nodes_or_say(facts: Any) -> Any:
        # added after the cluster's last `up`: its recorder reads the pods alone until the cluster's next one
        line = layers.node_reader_line(facts, cfg, cluster_cfg, reference)
        if line:
            pulumi.log.warn(line)
        return facts

    deployed_facts = cluster_stack.get_output(FACTS_OUTPUT).apply(checked).apply(read_nodes_or_say)
    image = deployed_facts.apply(lambda facts: facts.runtime_image)
    layers.image_puller_binding("env", cfg, cluster_facts, labels, opts)
    pulumi.export("environment", {"cluster": environment.cluster, "name": environment.name, "namespace": ns})
elif cfg.image.build is not None:
    images = ImageBuild(
        "image",
        ImageBuildArgs(
            namespace=cfg.cluster.namespace,
            labels=labels,
            build=cfg.image.build,
            build_nodes=cfg.build_nodes,
            wait_image=cfg.model_pipeline.tools_base_image,
            kube_context=cfg.cluster.kube_context,
        ),
        opts=opts,
    )
    # The pods run exactly the runtime tag this program computed; a new tag rolls them in the same `pulumi up`, once
    # the tag exists (no OpenShift image-change trigger annotation: it would hand the image field to another manager).
    image = images.runtime_ready
    pulumi.export("base_image", images.base_image)
    pulumi.export("runtime_image", images.runtime_image)
    pulumi.export("build_command", images.start_build_command)
    pulumi.export("build_logs_command", images.logs_command)
else:
    image = cfg.image.reference
# A cluster stack binds its node reader to its environment stacks' usage recorders too: the stacks of this cluster in the
# checkout, as the GPU tally reads them (stacks/gpus.py tally); its facts say which, so a later environment can tell.
node_readers = stack.gpus.node_readers() if environment is None and stack.gpus is not None else ()
if environment is None:
    pulumi.export(FACTS_OUTPUT, layers.cluster_facts(cfg, node_readers).model_dump(by_alias=True, mode="json"))
cluster = GpuCluster(
    "gpu",
    GpuClusterArgs(
        config=cfg,
        image=image,
        secrets=stack.secrets,
        cluster=cluster_facts,
        deployed=deployed_facts,
        pinned_image_sets_served=live_checks.pinned_image_set_served(cfg),
        # models[].mountInEnv is the cluster stack's: an environment mounts its cluster's models (stack.cluster)
        models=list((stack.cluster or cfg).models),
        node_readers=node_readers,
    ),
    opts=opts,
)

if cfg.models and environment is None:
    models = ModelPipeline(
        "models",
        ModelPipelineArgs(
            namespace=cfg.cluster.namespace,
            labels=labels,
            pipeline=cfg.model_pipeline,
            models=cfg.models,
            build_nodes=cfg.build_nodes,
            secrets=stack.secrets,
            kube_context=cfg.cluster.kube_context,
        ),
        opts=opts,
    )
    pulumi.export("model_pipeline_runs", models.run_names)
    pulumi.export("model_runs", models.runs)  # per model: run name and commands to follow / retry it (make runs)
    pulumi.export("model_images", models.internal_images)

for server in routed_servers():
    pulumi.export(f"{server.name}_url", cluster.urls.get(server.name, ""))
pulumi.export("master_addr", cluster.master_addr)
pulumi.export("pod_names", cluster.pod_names)
pulumi.export("world_size", cluster.world_size)
pulumi.export("network_mode", cluster.network_mode)
pulumi.export("lifecycle", cluster.lifecycle)
pulumi.export("image", image)
oc = naming.oc(cfg.cluster.kube_context)  # every printed `oc` names cluster.kubeContext when it is set
pulumi.export("shell_command", f"{oc} rsh -n {ns} -c {naming.MAIN_CONTAINER} {naming.pod_name(app, 0)}")
pulumi.export("port_forward_command", f"{oc} port-forward -n {ns} pod/{naming.pod_name(app, 0)} {naming.DEBUG_PORT}:{naming.DEBUG_PORT}")

# --- dev loop (components/devloop.py): laptop SSH into every pod through `oc exec`, per-pod shells and debugger ports
count = cfg.nodes.count
laptop = devloop.Laptop(
    cluster=cfg.cluster.name,
    environment=cfg.environment.name if cfg.environment else app,
    short=loader.app_name_unique(Path(__file__).resolve().parent, pulumi.get_stack(), app),
    context=cfg.cluster.kube_context,
)
known_hosts_file = devloop.laptop_known_hosts_file(app, ns, cfg.cluster.name)
pulumi.export("ssh_config", devloop.ssh_config(app, ns, count, devloop.login_user(cfg), known_hosts_file, laptop))
pulumi.export("ssh_known_hosts", cluster.ssh.host_public_key.apply(lambda key: devloop.known_hosts(app, ns, count, key, laptop)))
pulumi.export("shell_commands", devloop.shell_commands(app, ns, count, cfg.cluster.kube_context))
pulumi.export("port_forward_commands", devloop.port_forward_commands(app, ns, count, cfg.cluster.kube_context))
