"""The product's invariants as pure functions over (resource type token, inputs, options) triples.

No pulumi-policy import here: the same rules run offline (`evaluate()` over the mock engine's
recording, called by `make render`) and inside the policy pack (`policy/__main__.py` adapts each rule
to a `ResourceValidationPolicy` or `StackValidationPolicy` for `pulumi preview --policy-pack policy`).

Layout: `query.py` (accessors, walkers, the `PolicySpec` shape), one module per rule with its description
next to its check (`POLICY = PolicySpec(...)`), and `catalogue.py` (discovers them: `POLICIES`, `evaluate`,
`format_report`). Modules inside the package import each other relatively, so the package works both as
`policy.rules` (repository, tests, `make render`) and as `rules` (the pack run from policy/).

Levels (see `POLICIES`): everything the product promises is **mandatory** (an unauthenticated route,
an ungranted privilege, GPU over-commit, data loss on destroy, a Tekton field that v1 silently drops,
a floating image, a credential in plain text). Plain-HTTP exposure of a route that is authenticated
anyway is **advisory** (`route-tls-redirect`).
"""

from __future__ import annotations

from .catalogue import POLICIES, POLICY_NAMES, evaluate, format_report, has_mandatory
from .kube_api import API_SERVER_ACCEPTS
from .query import (
    ADVISORY,
    MANDATORY,
    PACK_NAME,
    REDACTED,
    UNKNOWN_SENTINELS,
    Level,
    PolicySpec,
    Resource,
    ResourceCheck,
    StackCheck,
    Violation,
    is_unknown,
    quantity,
)

__all__ = [
    "ADVISORY",
    "API_SERVER_ACCEPTS",
    "MANDATORY",
    "PACK_NAME",
    "POLICIES",
    "POLICY_NAMES",
    "REDACTED",
    "UNKNOWN_SENTINELS",
    "Level",
    "PolicySpec",
    "Resource",
    "ResourceCheck",
    "StackCheck",
    "Violation",
    "evaluate",
    "format_report",
    "has_mandatory",
    "is_unknown",
    "quantity",
]
