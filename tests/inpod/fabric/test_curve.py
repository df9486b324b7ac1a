"""The fabric gate draws its curve: an SVG next to every JSON result it writes (svgplot.gate_curve)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import inpod
from tests.inpod.fabric.conftest import Fabric

SVG = "{http://www.w3.org/2000/svg}"


def test_gate_writes_its_curve_next_to_its_json(fabric) -> None:
    f: Fabric = fabric(2)
    for i in range(2):
        f.state(i)["busbw"] = 60.0
    f.apply()
    res = f.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    for d in (f.sim.records(0, "fabric"), f.sim.pods[0].path("/tmp/ml-dev-env/fabric")):
        result = json.loads((d / "latest.json").read_text())
        stamp = result["time"].replace(":", "").replace("-", "")
        assert (d / f"gate-{stamp}.svg").read_text() == (d / "latest.svg").read_text()
        svg = ET.fromstring((d / "latest.svg").read_text())
        texts = [t.text or "" for t in svg.iter(f"{SVG}text")]
        assert "pass at 175.1 GB/s" in texts and "expected 194.6 GB/s" in texts
        assert any(t.startswith("fabric gate FAIL") for t in texts)
        lines = list(svg.iter(f"{SVG}polyline"))
        assert len(lines) == 2 and len(lines[0].get("points", "").split()) == len(result["sizes"])
        # the curve sits below the pass line: every point's y (SVG grows downwards) is below the dashed line's
        pass_y = float(next(x for x in svg.iter(f"{SVG}line") if x.get("stroke") == "#ff7f0e").get("y1", "0"))
        assert all(float(p.split(",")[1]) > pass_y for p in lines[0].get("points", "").split())


def test_gate_without_svgplot_still_writes_its_json(fabric) -> None:
    """A startup ConfigMap whose svgplot cannot be imported: the gate works, only the curve is missing. (The volume
    lists every key in `items`, so the key stays; a listed key missing from the ConfigMap fails the kubelet's
    payload, pkg/volume/configmap/configmap.go MakePayload.)"""
    f: Fabric = fabric(2)
    key = next(name for name, data in f.sim.configmaps.items() if "fabric_check.py" in data)
    original = dict(f.sim.configmaps[key])
    older = {**original, "inpod.lib.svgplot.py": "raise ImportError('no svgplot in this ConfigMap')\n"}
    assert set(inpod.group("fabric")) <= set(older), "the fabric check's files, with an svgplot that does not import"
    f.sim.swap_configmap(key, older)  # the kubelet swaps ..data on every pod
    try:
        res = f.run("gate")
        assert res.returncode == 0, res.stdout + res.stderr
        d = f.sim.pods[0].path("/tmp/ml-dev-env/fabric")
        assert (d / "latest.json").exists() and not (d / "latest.svg").exists()
    finally:
        f.sim.swap_configmap(key, original)
