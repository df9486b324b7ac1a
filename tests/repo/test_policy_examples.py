"""Every (Multi)NetworkPolicy example of the docs selects the stack's pods, by the labels the render gives them.

An example users copy with `<app>` filled in must select the pods of *that* stack: the pods carry
`app.kubernetes.io/name: ml-dev-env` and `app.kubernetes.io/instance: <app>` (core/naming.py), so an example keyed on
`app.kubernetes.io/name: <app>` selects nothing for an environment stack (`ml-dev-env-alice`). Checked against the
rendered StatefulSet of every committed stack; the example's spec is a NetworkPolicy spec
(k8snetworkplumbingwg/multi-networkpolicy: the same schema plus the `k8s.v1.cni.cncf.io/policy-for` annotation),
so it also passes the strict schema check as one.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import STACKS, run_objects, stack_objects
from tests.fixtures import schema_check

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("NetworkPolicy", "MultiNetworkPolicy")


def examples() -> list[tuple[str, str]]:
    """(docs file, YAML text) of every fenced YAML block holding a (Multi)NetworkPolicy."""
    found = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S):
            text = textwrap.dedent(block)
            if re.search(rf"^kind: ({'|'.join(KINDS)})$", text, re.M):
                found.append((path.relative_to(ROOT).as_posix(), text))
    return found


def selectors(node: Any) -> list[dict[str, str]]:
    """Every podSelector's matchLabels in a policy (the target and each peer)."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "podSelector" and isinstance(value, dict) and value.get("matchLabels"):
                out.append(value["matchLabels"])
            else:
                out += selectors(value)
    elif isinstance(node, list):
        for item in node:
            out += selectors(item)
    return out


def test_the_docs_have_a_multinetworkpolicy_example() -> None:
    assert any("kind: MultiNetworkPolicy" in text for _, text in examples())


@pytest.mark.parametrize("stack", STACKS)
def test_every_policy_example_selects_the_stacks_pods(stack: str, tmp_path: Path) -> None:
    result = run_objects(stack, stack_objects(stack), {"vscodePassword": "x", "jupyterToken": "y"})
    assert result.error is None, result.error
    sts = next(r.inputs for r in result.resources if r.kind == "StatefulSet")
    app, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    for where, text in examples():
        filled = text.replace("<app>", app).replace("<namespace>", namespace).replace("<network-attachment-definition>", "rdma")
        policy = yaml.safe_load(filled)
        found = selectors(policy["spec"])
        assert found, f"{where}: the example selects no pods by label"
        for match in found:
            assert match.items() <= labels.items(), f"{where}: {match} does not select {stack}'s pods ({labels})"
        # the spec is a NetworkPolicy spec: strict schema check as one
        as_np = {**policy, "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"}
        target = tmp_path / f"{len(list(tmp_path.iterdir()))}.yaml"
        target.write_text(yaml.safe_dump(as_np))
        proc = schema_check.check(str(target))
        assert proc.returncode == 0, f"{where}: {proc.stdout}{proc.stderr}"
