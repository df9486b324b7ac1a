"""Expected bus bandwidth from config, calibrated on barcelona, and the fabricCheck config rules."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from components import fabric
from stacks.config import StackConfig
from stacks.errors import format_validation_error
from tests.conftest import stack_objects


def config(mutate=None) -> StackConfig:
    objects = stack_objects("barcelona")
    if mutate:
        mutate(objects)
    return StackConfig.model_validate(objects)


def error_lines(mutate) -> str:
    with pytest.raises(ValidationError) as exc:
        config(mutate)
    return format_validation_error(exc.value, StackConfig, "Pulumi.barcelona.yaml")


def test_efficiency_constant_reproduces_the_barcelona_measurement():
    # 4 NICs x 400 Gbit/s = 200 GB/s line rate; 194.6 GB/s measured at 8 GB on 5 nodes.
    assert fabric.line_rate_gbs(4, 400) == 200.0
    assert fabric.RDMA_EFFICIENCY == 0.973
    assert fabric.expected_busbw(nics=4, gpus_per_pod=4, link_gbps=400, efficiency=fabric.RDMA_EFFICIENCY) == 194.6


def test_barcelona_stack_expectation():
    exp = fabric.expectation(config())
    assert exp is not None
    assert (exp.nics, exp.link_gbps, exp.efficiency) == (4, 400, 0.973)
    assert exp.expected_busbw_gbs == 194.6
    assert exp.pass_busbw_gbs == round(194.6 * 0.9, 2) == 175.14


@pytest.mark.parametrize(
    ("nics", "gpus", "link", "expected"),
    [
        (4, 4, 400, 194.6),  # calibration point
        (2, 4, 400, 97.3),  # a wrong two-entry HCA list halves it (the ~50 % loss seen on barcelona)
        (4, 1, 400, 48.65),  # one GPU drives one NIC
        (8, 8, 400, 389.2),
        (4, 4, 100, 48.65),  # links capped at 100 Gbit/s by firmware
    ],
)
def test_expected_busbw_scales_with_nics_gpus_and_link(nics, gpus, link, expected):
    assert fabric.expected_busbw(nics=nics, gpus_per_pod=gpus, link_gbps=link, efficiency=fabric.RDMA_EFFICIENCY) == expected


def test_no_link_rate_means_no_expectation():
    cfg = config(lambda o: o.pop("fabricCheck"))
    assert fabric.expectation(cfg) is None
    assert fabric.pod_settings(cfg)["expectation"] is None


def tcp(o):
    o["network"] = {"mode": "tcp"}
    o["security"] = {"serviceAccount": "ml-dev-sa", "memlock": {"mode": "none"}}


def test_tcp_stack_ignores_the_rdma_link_rate():
    cfg = config(tcp)  # barcelona keeps linkGbps 400, which is the RDMA NICs' rate
    assert fabric.expectation(cfg) is None
    assert fabric.pod_settings(cfg)["linkGbps"] is None


def test_tcp_expectation_needs_rate_and_efficiency():
    def rate_only(o):
        tcp(o)
        o["fabricCheck"] = {"tcpLinkGbps": 100}

    assert "ml-dev-env:fabricCheck.tcpEfficiency: got None; required with tcpLinkGbps" in error_lines(rate_only)

    def both(o):
        rate_only(o)
        o["fabricCheck"]["tcpEfficiency"] = 0.8

    exp = fabric.expectation(config(both))
    assert exp is not None and (exp.nics, exp.link_gbps, exp.expected_busbw_gbs) == (1, 100, 10.0)


def test_rdma_fallback_to_tcp_is_not_an_error():
    cfg = config(lambda o: o["network"]["rdma"].update(enabled=False))
    assert cfg.network.effective_mode == "tcp" and fabric.expectation(cfg) is None


def test_node_racks_must_cover_the_listed_nodes():
    def partial(o):
        o["fabricCheck"]["nodeRacks"] = {"moc-r4pcc02u17-nairr": "r2"}

    text = error_lines(partial)
    assert "ml-dev-env:fabricCheck.nodeRacks: got [" in text
    assert "moc-r4pcc02u18-nairr" in text and "every node in nodes.gpuNodes needs a rack" in text


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("thresholdFraction", 1.5, "ml-dev-env:fabricCheck.thresholdFraction"),
        ("linkGbps", 0, "ml-dev-env:fabricCheck.linkGbps"),
        ("onDeployTimeoutSeconds", 5, "ml-dev-env:fabricCheck.onDeployTimeoutSeconds"),
        ("plateauMinBytes", 16 << 30, "ml-dev-env:fabricCheck.plateauMinBytes"),
    ],
)
def test_out_of_range_values_name_the_key(key, value, message):
    def mutate(o):
        o["fabricCheck"][key] = value

    assert message in error_lines(mutate)


def test_pod_settings_are_count_independent_and_carry_the_rdma_facts():
    one = fabric.configmap_files(config(lambda o: o["nodes"].update(count=1)))
    five = fabric.configmap_files(config(lambda o: o["nodes"].update(count=5)))
    assert one == five, "fabric.json must not change with nodes.count (the pod template hash must not either)"
    settings = json.loads(five[fabric.CONFIG_KEY])
    assert settings["hcas"] == ["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    assert settings["interfaces"] == ["net1", "net2", "net3", "net4"]
    assert settings["sriovResources"][0] == "openshift.io/eno5np0rdma"
    assert (settings["gidIndex"], settings["mtu"], settings["gpusPerPod"]) == (3, 9000, 4)
    assert (settings["minBytes"], settings["maxBytes"], settings["plateauMinBytes"]) == (1 << 20, 8 << 30, 4 << 30)
    assert settings["expectation"]["pass_busbw_gbs"] == 175.14
    assert five[fabric.PROGRAM_KEY] == fabric.PROGRAM.read_text()
