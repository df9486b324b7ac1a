"""Policy 8: routes redirect to TLS (advisory)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .query import ADVISORY, PolicySpec, Resource, is_unknown

# ------------------------------------------------------------------- 8. routes redirect to TLS (advisory)


def check_route_tls(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes or res.kind != "Route" or res.group != "route.openshift.io":
        return
    tls = res.spec.get("tls")
    if is_unknown(tls):
        return
    if not isinstance(tls, Mapping) or not tls.get("termination"):
        yield "serves plain HTTP (no spec.tls). Fix: set spec.tls {termination: edge, insecureEdgeTerminationPolicy: Redirect}."
    elif tls.get("insecureEdgeTerminationPolicy") == "Allow":
        yield (
            "allows plain HTTP next to HTTPS (insecureEdgeTerminationPolicy: Allow), exposing session cookies. "
            "Fix: set insecureEdgeTerminationPolicy: Redirect."
        )


POLICY = PolicySpec(
    "route-tls-redirect",
    ADVISORY,
    "resource",
    "Routes terminate TLS and redirect plain HTTP (edge + Redirect). Advisory: the authentication policy already "
    "keeps unauthenticated users out; this one keeps session cookies off plain HTTP.",
    "Set spec.tls {termination: edge, insecureEdgeTerminationPolicy: Redirect}.",
    check_route_tls,
    order=8,
)
