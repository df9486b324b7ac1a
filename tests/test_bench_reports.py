"""`make bench-launch` writes its plot of every run beside its markdown report and raw JSON (issue 20 item 4):
the SVG shows one line per measured case plus the cold run, with the numbers of the JSON (svgplot draws it)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from bench import bench_launch

SVG = "{http://www.w3.org/2000/svg}"


def test_launch_report_writes_the_plot_beside_the_table(tmp_path: Path) -> None:
    runs = {"unchanged": [(0.8, 0), (0.7, 0), (0.9, 0)], "one file changed": [(1.1, 1 << 20), (1.3, 1 << 20), (1.2, 1 << 20)]}
    stem = bench_launch.write_report(tmp_path, 200_000_000, (4.2, 200_000_000), runs)
    assert {p.name for p in tmp_path.iterdir()} == {f"{stem.name}.{ext}" for ext in ("md", "json", "svg")}
    assert json.loads(stem.with_suffix(".json").read_text())["runs"]["unchanged"][0] == [0.8, 0]
    svg = ET.fromstring(stem.with_suffix(".svg").read_text())
    assert svg.tag == f"{SVG}svg"
    labels = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"first run (cold)", "unchanged", "one file changed"} <= labels, labels
    assert len(list(svg.iter(f"{SVG}polyline"))) >= 2, "a line per case with more than one run"
    assert "200 MB tree" in " ".join(t or "" for t in labels)
