"""ml-dev-env: load the stack config, create the Kubernetes provider and the components, export outputs."""

import pulumi
import pulumi_kubernetes as k8s

from components.gpu_cluster import GpuCluster, GpuClusterArgs
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

image = cfg.image.reference
cluster = GpuCluster("gpu", GpuClusterArgs(config=cfg, image=image, secrets=stack.secrets), opts=opts)

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
