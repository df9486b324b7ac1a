"""ml-dev-env: load the stack config, create the Kubernetes provider and the components, export outputs."""

import pulumi
import pulumi_kubernetes as k8s

from components.gpu_cluster import GpuCluster, GpuClusterArgs
from components.image_build import ImageBuild, ImageBuildArgs, image_trigger_annotation
from components.model_pipeline import ModelPipeline, ModelPipelineArgs
from stacks import loader

stack = loader.load(f"Pulumi.{pulumi.get_stack()}.yaml")
for warning in stack.warnings:
    pulumi.log.warn(warning)
cfg = stack.config

provider = k8s.Provider(
    "k8s",
    context=cfg.cluster.kube_context,
    namespace=cfg.cluster.namespace,
    render_yaml_to_directory=cfg.cluster.render_yaml_to_directory,
)
opts = pulumi.ResourceOptions(providers=[provider])

if cfg.cluster.create_namespace:
    namespace = k8s.core.v1.Namespace(
        "namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=cfg.cluster.namespace, labels={"app.kubernetes.io/part-of": "ml-dev-env"}),
        # Deleting the namespace would delete every PVC in it: keep it on destroy.
        opts=pulumi.ResourceOptions(provider=provider, retain_on_delete=True),
    )
    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[namespace]))

labels = {"app.kubernetes.io/part-of": "ml-dev-env", "app.kubernetes.io/managed-by": "pulumi", "ml-dev-env/cluster": cfg.cluster.name}
sts_annotations: dict[str, str] = {}
if cfg.image.build is not None:
    images = ImageBuild(
        "image",
        ImageBuildArgs(namespace=cfg.cluster.namespace, labels=labels, build=cfg.image.build, build_nodes=cfg.build_nodes),
        opts=opts,
    )
    image = images.runtime_image
    if cfg.image.build.rollout_on_new_image:
        sts_annotations = image_trigger_annotation(images.image_stream_tag, "ml-dev")
    pulumi.export("base_image", images.base_image)
    pulumi.export("runtime_image", images.runtime_image)
    pulumi.export("build_command", images.start_build_command)
    pulumi.export("build_logs_command", images.logs_command)
else:
    image = cfg.image.reference
cluster = GpuCluster(
    "gpu", GpuClusterArgs(config=cfg, image=image, secrets=stack.secrets, statefulset_annotations=sts_annotations), opts=opts
)

if cfg.models:
    models = ModelPipeline(
        "models",
        ModelPipelineArgs(
            namespace=cfg.cluster.namespace, labels=labels, pipeline=cfg.model_pipeline, models=cfg.models,
            build_nodes=cfg.build_nodes, secrets=stack.secrets,
        ),
        opts=opts,
    )
    pulumi.export("model_pipeline_runs", models.run_names)
    pulumi.export("model_runs", models.runs)  # per model: run name and commands to follow / retry it (make runs)
    pulumi.export("model_images", models.internal_images)

app, ns = cfg.cluster.app_name, cfg.cluster.namespace
pulumi.export("vscode_url", cluster.urls.get("vscode", ""))
pulumi.export("jupyter_url", cluster.urls.get("jupyter", ""))
pulumi.export("tensorboard_url", cluster.urls.get("tensorboard", ""))
pulumi.export("master_addr", cluster.master_addr)
pulumi.export("pod_names", cluster.pod_names)
pulumi.export("world_size", cluster.world_size)
pulumi.export("network_mode", cluster.network_mode)
pulumi.export("image", image)
pulumi.export("shell_command", f"oc rsh -n {ns} -c ml-dev {app}-0")
pulumi.export("port_forward_command", f"oc port-forward -n {ns} pod/{app}-0 5678:5678")
