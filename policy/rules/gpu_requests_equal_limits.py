"""Policy 3: GPU requests == limits."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .query import MANDATORY, PolicySpec, Resource, _m, container_likes, is_extended_resource, is_unknown, quantity

# ---------------------------------------------------------------------- 3. GPU requests == limits


def check_gpu_requests_equal_limits(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    for where, container in container_likes(res):
        for field_name in ("resources", "computeResources"):
            block = container.get(field_name)
            if not isinstance(block, Mapping):
                continue
            requests, limits = _m(block.get("requests")), _m(block.get("limits"))
            for name in sorted(set(requests) | set(limits)):
                if not is_extended_resource(name) or is_unknown(requests.get(name)) or is_unknown(limits.get(name)):
                    continue
                if name not in limits:
                    yield (
                        f"{where}: {name} is requested ({requests[name]}) without a limit. Fix: set "
                        f"{field_name}.limits[{name!r}] equal to the request (device resources are whole devices "
                        "and can't be over-committed; the API server rejects a request without a limit)."
                    )
                elif name in requests and quantity(requests[name]) != quantity(limits[name]):
                    yield (
                        f"{where}: {name} requests {requests[name]} but limits {limits[name]}. Fix: make "
                        f"{field_name}.requests and .limits of {name!r} equal (e.g. both = GPUs per pod); "
                        "the scheduler reserves the request, the device plugin allocates the limit."
                    )


POLICY = PolicySpec(
    "gpu-requests-equal-limits",
    MANDATORY,
    "resource",
    "In every container (pod templates, Tekton steps) device resources - nvidia.com/gpu, openshift.io/* SR-IOV, "
    "rdma/* and any other extended resource - have requests equal to limits.",
    "Set requests and limits of each device resource to the same value.",
    check_gpu_requests_equal_limits,
    order=3,
)
