"""The fabric programs reach every pod the way startup.sh does: the startup ConfigMap at /opt/ml-dev-env."""

from __future__ import annotations

import json

from components import fabric
from tests.conftest import run_objects, stack_objects

STS = "kubernetes:apps/v1:StatefulSet"


def test_startup_configmap_carries_the_program_and_settings():
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    cm = result.one("kubernetes:core/v1:ConfigMap", "-startup").inputs
    assert cm["data"]["fabric_check.py"] == fabric.PROGRAM.read_text()
    assert cm["data"]["rank_order.sh"] == fabric.RANK_ORDER.read_text()
    settings = json.loads(cm["data"]["fabric.json"])
    assert settings["expectation"]["expected_busbw_gbs"] == 194.6
    spec = result.one(STS).inputs["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "startup")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert volume["configMap"]["defaultMode"] == 0o555, "the program must be executable"
    main = next(c for c in spec["containers"] if c["name"] == "ml-dev")
    mount = next(m for m in main["volumeMounts"] if m["name"] == "startup")
    assert mount["mountPath"] == "/opt/ml-dev-env" and "subPath" not in mount, "a directory mount updates in place"
    node_name = next(e for e in main["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_program_is_executable_python_with_a_shebang():
    text = fabric.PROGRAM.read_text()
    assert text.startswith("#!/usr/bin/env python3\n")
    assert fabric.PROGRAM.stat().st_mode & 0o111


def test_program_parses_as_python_3_8():
    # CUDA devel images bring Ubuntu's python3 (3.10), NGC its own; the program must not need newer syntax
    import ast

    import inpod

    for key, text in inpod.group("fabric").items():
        if key.endswith(".py"):
            ast.parse(text, feature_version=(3, 8))


def test_on_deploy_extends_the_rollout_wait_by_its_timeout():
    objects = stack_objects("barcelona")
    plain = run_objects("barcelona", objects).one(STS).inputs["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]
    objects["fabricCheck"].update(onDeploy=True, onDeployTimeoutSeconds=2400)
    held = run_objects("barcelona", objects).one(STS).inputs["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]
    assert int(held) == int(plain) + 2400
