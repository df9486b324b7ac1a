"""The fabric gate draws its curve: an SVG next to every JSON result it writes (svgplot.gate_curve)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import inpod
from tests.fabric.conftest import PROGRAM, Sim

SVG = "{http://www.w3.org/2000/svg}"


def test_gate_writes_its_curve_next_to_its_json(sim) -> None:
    s: Sim = sim(2)
    s.cluster.allreduce["busbw"] = 60.0
    res = s.run("gate")
    assert res.returncode == 1, res.stdout + res.stderr
    h = s.cluster.host(0)
    for d in (Path(h["workspace"]) / ".ml-dev-env" / "fabric", Path(h["state"]) / "fabric"):
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


def test_gate_without_svgplot_still_writes_its_json(sim, tmp_path: Path) -> None:
    """An older startup ConfigMap without svgplot.py: the gate works, only the curve is missing."""
    s: Sim = sim(2)
    alone = tmp_path / "alone"
    alone.mkdir()
    for key, text in inpod.group("fabric").items():  # the fabric check's files, without the home group's svgplot.py
        (alone / key).write_text(text)
    program = alone / PROGRAM.name
    env = s.env(0)
    res = subprocess.run([sys.executable, str(program), "gate"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    d = Path(s.cluster.host(0)["state"]) / "fabric"
    assert (d / "latest.json").exists() and not (d / "latest.svg").exists()
