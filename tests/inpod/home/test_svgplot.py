"""svgplot's charts read (issue 36 item 5): no two series share both colour and marker, the legend lies below the
plotting rectangle (never over the data), the y axis ends at most 25 % above the largest value drawn, and values
of very different sizes go to panels of their own. Geometry is read back from the SVG the charts write; the built
site's browser test (tests/repo/test_docs_site.py) measures the shipped plots with real fonts."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from bench import bench_package
from bench.bench_package import Result
from inpod.lib import svgplot

SVG = "{http://www.w3.org/2000/svg}"


def series(n: int, colors: dict[int, str] | None = None) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"label": f"series {i}", "points": [(1, 1 + i), (2, 2 + i), (3, 1.5 + i)]} for i in range(n)]
    for i, color in (colors or {}).items():
        out[i]["color"] = color
    return out


def drawn_styles(root: ET.Element) -> list[tuple[str, str]]:
    return [(g.attrib["data-color"], g.attrib["data-marker"]) for g in root.iter(f"{SVG}g") if g.get("class") == "series"]


def plot_area(root: ET.Element) -> tuple[float, float, float, float]:
    rect = next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "plot-area")
    x, y, w, h = (float(rect.attrib[k]) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def y_grid(root: ET.Element) -> list[float]:
    """The y axis' labels (the texts right-aligned left of the plot), bottom to top."""
    return sorted(float(t.text or "") for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end" and t.get("fill") == "#555")


@pytest.mark.parametrize("n", [1, 9, 10, 11, 25, 40])
def test_no_two_series_share_colour_and_marker(n: int) -> None:
    root = ET.fromstring(svgplot.line_chart(series(n)))
    looks = drawn_styles(root)
    assert len(looks) == n and len(set(looks)) == n, looks
    assert all(m in svgplot.MARKERS for _, m in looks)
    for g in (g for g in root.iter(f"{SVG}g") if g.get("class") == "series"):
        assert [e for e in g if e.get("class") == "marker"], "every series shows its marker"


def test_series_given_the_same_colour_get_different_markers() -> None:
    looks = drawn_styles(ET.fromstring(svgplot.line_chart(series(8, {i: "#000000" for i in range(6)}))))
    assert [c for c, _ in looks[:6]] == ["#000000"] * 6 and len({m for _, m in looks[:6]}) == 6
    assert len(set(looks)) == 8
    with pytest.raises(ValueError, match="more than 6 series drawn in #000000"):
        svgplot.styles(series(7, {i: "#000000" for i in range(7)}))


def test_a_long_series_still_shows_its_marker() -> None:
    long: list[dict[str, object]] = [{"label": "gpu0", "points": [(i, i % 7) for i in range(300)]}]
    root = ET.fromstring(svgplot.line_chart(long))
    markers = [e for e in root.iter() if e.get("class") == "marker"]
    assert 1 <= len(markers) - 1 <= svgplot.MAX_MARKERS, "a dozen on the line, one in the legend"


@pytest.mark.parametrize("n", [1, 3, 9, 20])
def test_legend_lies_below_the_plotting_rectangle_and_inside_the_picture(n: int) -> None:
    labels = series(n)
    labels[0]["label"] = "S3 → registry relay, SHA-256 on the way, 2 streams"
    root = ET.fromstring(svgplot.line_chart(labels, title="t", x_label="round", hlines=[(3, "pass at 3", "#ff7f0e")]))
    _, _, right, bottom = plot_area(root)
    width, height = (float(v) for v in root.attrib["viewBox"].split()[2:])
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    texts = [t for t in legend.iter(f"{SVG}text")]
    assert {t.text for t in texts} == {str(s["label"]) for s in labels} | {"pass at 3"}, "every series and reference line"
    for t in texts:
        top = float(t.attrib["y"]) - svgplot.FONT_SIZE  # a text's box reaches at most one em above its baseline
        assert top > bottom + svgplot.FONT_SIZE, "below the plot and its x tick labels"
        assert float(t.attrib["y"]) + 4 <= height
        assert float(t.attrib["x"]) + svgplot.text_width(t.text or "") <= width
    for line in legend.iter(f"{SVG}line"):
        assert float(line.attrib["y1"]) > bottom and float(line.attrib["x2"]) < right + 12
    # in the plot: only the lines, markers and reference lines, no text
    plot_top = plot_area(root)[1]
    axis = ("#555", "#333")  # tick labels and axis titles
    inside = [t.text for t in root.iter(f"{SVG}text") if t.get("fill") not in axis and bottom > float(t.attrib["y"]) > plot_top + 1]
    assert inside == [], inside


def test_without_a_legend_the_chart_keeps_its_size_and_labels_reference_lines_in_the_plot() -> None:
    root = ET.fromstring(svgplot.line_chart(series(4), width=320, height=110, legend=False, hlines=[(2, "limit", "#000")]))
    assert root.attrib["viewBox"] == "0 0 320 110"
    assert not [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend"]
    assert "limit" in {t.text for t in root.iter(f"{SVG}text")}


@pytest.mark.parametrize("largest", [0.3, 1.0, 2.58, 7.1, 12.4, 19.5, 57.1, 99.0, 101.0, 194.6, 1234.0])
def test_y_axis_ends_at_most_a_quarter_above_the_largest_value(largest: float) -> None:
    top, step = svgplot.y_axis(largest)
    assert largest <= top <= 1.25 * largest + 1e-9, (largest, top)
    assert 4 <= round(top / step) <= 8
    root = ET.fromstring(svgplot.line_chart([{"label": "x", "points": [(0, largest / 3), (1, largest)]}]))
    grid = y_grid(root)
    assert grid[0] == 0 and grid[-1] == pytest.approx(top, rel=0.01)
    assert len(set(grid)) == len(grid), f"every tick reads as its own value: {grid}"


def test_reference_lines_count_as_drawn_values() -> None:
    root = ET.fromstring(svgplot.line_chart([{"label": "busbw", "points": [(1, 10), (2, 60)]}], hlines=[(194.6, "expected", "#2ca02c")]))
    assert y_grid(root)[-1] == 200


def test_panels_put_far_larger_values_on_their_own_scale_with_styles_unique_across_panels() -> None:
    """The packaging benchmark's plot: the original approach (about 7 x the others) gets its own panel."""
    walls = {"raw1": [10.6, 7.3, 7.2], "ours1": [11.2, 8.4, 8.2], "olot": [19.5, 15.1, 15.4], "buildah": [58.2, 56.3, 57.1]}
    results = [Result(name, runs[i], 0, 0) for i in range(3) for name, runs in walls.items()]
    root = ET.fromstring(bench_package.plot(results, "2GiB"))
    panels = [p for p in root if p.tag == f"{SVG}svg"]
    assert len(panels) == 2
    looks = drawn_styles(root)
    assert len(looks) == 4 and len(set(looks)) == 4
    tops = [y_grid(p)[-1] for p in panels]
    assert tops[0] <= 1.25 * 19.5 and 58.2 <= tops[1] <= 1.25 * 58.2, tops
    shown = [{t.text for t in p.iter(f"{SVG}text")} for p in panels]
    assert bench_package.APPROACHES["buildah"][0] in shown[1] and bench_package.APPROACHES["buildah"][0] not in shown[0]
    height = float(root.attrib["viewBox"].split()[3])
    assert sum(float(p.attrib["height"]) for p in panels) + float(panels[0].attrib["y"]) == height
    # similar values stay in one chart
    close = [Result(name, runs[i], 0, 0) for i in range(3) for name, runs in walls.items() if name != "buildah"]
    assert not [p for p in ET.fromstring(bench_package.plot(close, "2GiB")) if p.tag == f"{SVG}svg"]


def test_axis_numbers_are_not_rounded_into_each_other() -> None:
    assert [svgplot.fmt(v) for v in (0, 2.5, 10, 12.5, 0.25, -37.5)] == ["0", "2.5", "10", "12.5", "0.25", "-37.5"]


def test_shipped_plots_follow_the_rules() -> None:
    """The plots the docs show (drawn by svgplot from the runs the benchmarks and the gate recorded)."""
    from tests.conftest import ROOT

    for name in ("bench-package.svg", "bench-launch.svg", "fabric-gate.svg"):
        text = (ROOT / "docs" / "img" / name).read_text()
        root = ET.fromstring(text)
        looks = drawn_styles(root)
        assert looks and len(set(looks)) == len(looks), name
        assert re.search(r'font-size="(\d+)"', text) and int(re.findall(r'font-size="(\d+)"', text)[0]) >= 12, name
        charts = [p for p in root if p.tag == f"{SVG}svg"] or [root]
        for chart in charts:
            _, top, _, bottom = plot_area(chart)
            ys = [float(p.split(",")[1]) for line in chart.iter(f"{SVG}polyline") for p in line.attrib["points"].split()]
            ys += [float(e.attrib["y1"]) for e in chart if e.tag == f"{SVG}line" and e.get("stroke-dasharray")]  # reference lines
            assert ys and min(ys) >= top, f"{name}: a value above the axis' top"
            assert (bottom - min(ys)) / (bottom - top) >= 0.8 - 0.01, f"{name}: the axis ends over 25 % above the largest value"
            assert [g for g in chart.iter(f"{SVG}g") if g.get("class") == "legend"], f"{name}: a legend"


def test_time_axis_ticks_are_round_values() -> None:
    """The home page's last hour (minutes before now, -13.7 .. 0): ticks at -10, -5, 0, not the span's quarters
    (-13.7 -10.3 -6.8 ...); any span gets multiples of one 1/2/2.5/5 x 10^k step inside it."""
    pts = [(-13.7, 40.0), (-6.0, 55.0), (0.0, 60.0)]
    root = ET.fromstring(svgplot.line_chart([{"label": "GPU 0", "points": pts}], legend=False))
    plot_bottom = max(float(r.attrib["y"]) + float(r.attrib["height"]) for r in root.iter(f"{SVG}rect") if r.get("class") == "plot-area")
    labels = [t.text for t in root.iter(f"{SVG}text") if float(t.attrib["y"]) > plot_bottom and t.get("text-anchor") == "middle"]
    assert labels[:3] == ["-10", "-5", "0"], labels
    for lo, hi in ((-13.7, 0), (0.3, 7.9), (120, 4000), (-0.07, 0.21)):
        ticks = svgplot.round_ticks(lo, hi)
        step = ticks[1] - ticks[0]
        assert 3 <= len(ticks) <= 6 and all(lo - 1e-9 <= t <= hi + 1e-9 for t in ticks), (lo, hi, ticks)
        assert any(abs(step - m * 10 ** math.floor(math.log10(step))) < 1e-9 for m in (1, 2, 2.5, 5)), (lo, hi, step)
        assert all(abs(t / step - round(t / step)) < 1e-9 for t in ticks), (lo, hi, ticks)
