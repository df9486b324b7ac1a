"""Pure helpers: quantities, names, NCCL environment (no Pulumi)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core import naming, nccl
from core.quantity import QuantityError, format_gib, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("128Gi", 128 * 2**30),
        ("500m", Decimal("0.5")),
        ("32", 32),
        ("1.5Ti", Decimal("1.5") * 2**40),
        ("2k", 2000),
        ("1e3", 1000),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["128GB", "-5Gi", "Gi", "", "1.2.3"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_format_gib_rounds_up() -> None:
    assert format_gib(2**30 + 1) == "2Gi"
    assert format_gib(10) == "1Gi"


def test_hostfile_and_dns() -> None:
    assert naming.pod_dns("app", "ns", 1) == "app-1.app-headless.ns.svc.cluster.local"
    assert naming.hostfile("app", "ns", 2, 8) == (
        "app-0.app-headless.ns.svc.cluster.local slots=8\napp-1.app-headless.ns.svc.cluster.local slots=8\n"
    )
    assert naming.route_host("ml", "vscode", "ns", "apps.example.com") == "ml-vscode-ns.apps.example.com"


def test_rdma_env_layers_defaults_typed_values_and_overrides() -> None:
    env = nccl.rdma_env(
        hcas=["mlx5_6"], socket_interfaces=["net1"], gid_index=3, gdr_level=5, cross_nic=0, overrides={"NCCL_DEBUG": "WARN"}
    )
    assert env["NCCL_IB_HCA"] == "mlx5_6" and env["NCCL_SOCKET_IFNAME"] == "net1"
    assert env["NCCL_DEBUG"] == "WARN"
    expected = {k: v for k, v in nccl.GOLD_STANDARD.items() if k != "NCCL_DEBUG"}
    assert {k: env[k] for k in expected} == expected
    assert "NCCL_IB_HCA" not in nccl.rdma_env(
        hcas=None, socket_interfaces=["net1"], gid_index=3, gdr_level="PHB", cross_nic=1, overrides={}
    )


def test_tcp_env_always_disables_ib() -> None:
    env = nccl.tcp_env(interface_exclude="^lo", p2p_level="NVL", overrides={"NCCL_IB_DISABLE": "0"})
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "^lo"
