"""Small SVG line charts drawn by our own programs (standard library only, Python 3.8+).

Shipped next to the other in-pod programs (the fabric gate's curve, the home page's GPU plots) and used
by the benchmarks for their reports. No script, no external reference: the SVG is safe to inline in a
page and to open offline. Every text that reaches the SVG goes through `esc` (XML escaping).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

if TYPE_CHECKING:  # aliases only for the checker: the pods' Pythons may be 3.8 (no builtin generics at run time)
    Point = tuple[float, float]
    Series = dict[str, object]  # {"label": str, "points": [(x, y), ...], "color": str, "dash": bool}

# Ten colours (matplotlib's tab10) and six markers: a series is told apart by its colour and its marker together,
# so up to 60 series never share both (`styles`).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
MARKERS = ("circle", "square", "triangle", "diamond", "triangle-down", "cross")
FONT_SIZE = 12  # px at the chart's own size: the smallest text a page shows (the home page's and docs' minimum)
LEGEND_ROW = 18
MAX_MARKERS = 12  # markers drawn per series (evenly spread), so a long series still shows its marker


def xml_text(text: object) -> str:
    return escape(str(text), {'"': "&quot;", "'": "&#39;"})


def nice_max(value: float) -> float:
    """The smallest 1/2/2.5/5 x 10^k at or above `value` (axis tops people can read)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power + 1e-12:
            return step * power
    return 10 * power


def round_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of an axis from `lo` to `hi` at round values: the multiples of the smallest 1/2/2.5/5 x 10^k step at or
    above a fifth of the span that lie in it (-13.7 .. 0 reads -10, -5, 0; not the span's quarters -13.7 -10.3 ...)."""
    if hi <= lo:
        return [lo]
    step = nice_max((hi - lo) / 5)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [k * step + 0.0 for k in range(first, last + 1)]


def y_axis(largest: float) -> tuple[float, float]:
    """(top, step) of a y axis from 0 that shows `largest`: the step is the smallest 1/2/2.5/5 x 10^k at or above
    largest / 8, the top the first multiple of it at or above `largest`, so the axis ends less than one step (at
    most 25 %) above the largest value, with 4 to 8 grid steps."""
    if largest <= 0:
        return 1.0, 0.2
    step = nice_max(largest / 8)
    return max(1, math.ceil(largest / step - 1e-9)) * step, step


def fmt(value: float) -> str:
    """Axis numbers: whole numbers as such, 12.5 as 12.5 (not rounded to a neighbour tick's value), 0.25 as 0.25."""
    if value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2g}"


def text_width(text: str, size: float = FONT_SIZE) -> float:
    """A generous estimate of a sans-serif text's width (DejaVu Sans, the widest common default, averages about
    0.6 em): for laying out the legend; the docs' browser test measures the real thing."""
    return len(text) * 0.64 * size


def styles(series: Sequence[Series]) -> list[tuple[str, str]]:
    """(colour, marker) per series: the series' own where given, else the palette's next colour; the marker is the
    series' own, else the next marker (colours and markers cycle together: 30 series before a pair repeats), unless
    that pair is taken, then the first marker not yet used with that colour. No two series share both."""
    used: set[tuple[str, str]] = set()
    out = []
    for i, s in enumerate(series):
        color = str(s.get("color") or PALETTE[i % len(PALETTE)])
        wanted = str(s.get("marker") or MARKERS[i % len(MARKERS)])
        order = [wanted] + [m for m in MARKERS if m != wanted]
        free = [m for m in order if (color, m) not in used]
        if not free:
            raise ValueError(f"more than {len(MARKERS)} series drawn in {color}: give some another colour")
        used.add((color, free[0]))
        out.append((color, free[0]))
    return out


def marker_svg(kind: str, x: float, y: float, color: str, r: float = 3.5) -> str:
    """One marker centred on (x, y)."""
    c = xml_text(color)
    if kind == "circle":
        return f'<circle class="marker" cx="{x:.1f}" cy="{y:.1f}" r="{r * 0.85:.1f}" fill="{c}"/>'
    if kind == "square":
        return f'<rect class="marker" x="{x - r * 0.8:.1f}" y="{y - r * 0.8:.1f}" width="{r * 1.6:.1f}" height="{r * 1.6:.1f}" fill="{c}"/>'
    if kind == "cross":
        d = r * 0.9
        return (
            f'<path class="marker" d="M{x - d:.1f},{y - d:.1f}L{x + d:.1f},{y + d:.1f}M{x - d:.1f},{y + d:.1f}L{x + d:.1f},{y - d:.1f}" '
            f'stroke="{c}" stroke-width="2" fill="none"/>'
        )
    corners = {
        "triangle": ((0, -1.15), (1, 0.75), (-1, 0.75)),
        "triangle-down": ((0, 1.15), (1, -0.75), (-1, -0.75)),
        "diamond": ((0, -1.2), (1.1, 0), (0, 1.2), (-1.1, 0)),
    }[kind]
    points = " ".join(f"{x + dx * r:.1f},{y + dy * r:.1f}" for dx, dy in corners)
    return f'<polygon class="marker" points="{points}" fill="{c}"/>'


def legend_rows(entries: Sequence[str], width: float, x0: float = 8) -> list[list[tuple[float, int]]]:
    """Entries (their labels) flowed into rows that fit `width`: per row, (x, entry index)."""
    rows: list[list[tuple[float, int]]] = [[]]
    x = x0
    for i, label in enumerate(entries):
        w = 30 + text_width(label) + 14
        if rows[-1] and x + w > width - 4:
            rows.append([])
            x = x0
        rows[-1].append((x, i))
        x += w
    return rows if rows[-1] else rows[:-1]


def line_chart(
    series: Sequence[Series],
    *,
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    width: int = 520,
    height: int = 240,
    x_log2: bool = False,
    x_format: Callable[[float], str] = fmt,
    y_max: float | None = None,
    x_range: tuple[float, float] | None = None,
    hlines: Sequence[tuple[float, str, str]] = (),
    legend: bool = True,
) -> str:
    """An SVG document: one polyline per series (x ascending) with its markers, optional horizontal reference
    lines (value, label, color). `x_log2` spaces x on a log2 scale (message sizes); `x_range` fixes the x axis
    (points outside it are clipped to its edges); `y_max` fixes the y axis' top, else it ends at most 25 % above
    the largest value drawn (`y_axis`). `width` x `height` is the chart with its axes; the legend (a row per
    few series and reference lines, with their colour and marker) goes below it, outside the plotting
    rectangle, and makes the SVG taller. Without a legend the reference lines are labelled in the plot.

    Why one function: one SVG document drawn over one coordinate system, which the axes, the series, the
    reference lines and the legend all share.
    """
    left, right, top, bottom = 52, 12, 26 if title else 10, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [float(p[0]) for s in series for p in _points(s)]
    ys = [float(p[1]) for s in series for p in _points(s)] + [h[0] for h in hlines]
    looks = styles(series)

    def xt(x: float) -> float:
        return math.log2(x) if x_log2 and x > 0 else x

    x_lo, x_hi = (min(map(xt, xs)), max(map(xt, xs))) if xs else (0.0, 1.0)
    if x_range is not None:
        x_lo, x_hi = xt(x_range[0]), xt(x_range[1])
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    if y_max is not None:
        top_y, y_step = y_max, y_max / 5
    else:
        top_y, y_step = y_axis(max(ys) if ys else 0.0)

    def px(x: float) -> float:
        return left + (min(max(xt(x), x_lo), x_hi) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - min(max(y, 0.0), top_y) / top_y * plot_h

    entries: list[tuple[str, str, str, bool]] = []  # label, colour, marker ("" for a reference line), dashed
    if legend:
        entries += [(str(s["label"]), c, m, bool(s.get("dash"))) for s, (c, m) in zip(series, looks) if s.get("label")]
        entries += [(label, color, "", True) for _, label, color in hlines]
    rows = legend_rows([e[0] for e in entries], width) if entries else []
    total_h = height + (len(rows) * LEGEND_ROW + 4 if rows else 0)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total_h}" width="{width}" height="{total_h}" '
        f'role="img" font-family="sans-serif" font-size="{FONT_SIZE}">',
        f"<title>{xml_text(title or y_label)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{total_h}" fill="#ffffff"/>',
    ]
    if title:
        out.append(f'<text x="8" y="17" font-weight="bold">{xml_text(title)}</text>')
    # y grid and labels
    steps = max(1, round(top_y / y_step))
    for i in range(steps + 1):
        value = top_y * i / steps
        y = py(value)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{xml_text(fmt(value))}</text>')
    # x ticks: every point of the first series on a log scale (thinned), else 5 steps
    every_x = sorted(set(xs))
    ticks = sorted({float(p[0]) for p in _points(series[0])}) if (series and x_log2) else []
    if not x_log2 and x_range is None and every_x and len(every_x) <= 12 and all(x == int(x) for x in every_x):
        ticks = every_x  # run numbers, rounds: whole numbers only
    if not ticks:
        ticks = round_ticks(x_lo, x_hi)
    stride = max(1, math.ceil(len(ticks) / 8))
    for x in ticks[::stride]:
        out.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 15}" text-anchor="middle" fill="#555">{xml_text(x_format(x))}</text>')
    out.append(f'<rect class="plot-area" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    if x_label:
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" fill="#333">{xml_text(x_label)}</text>')
    if y_label:
        out.append(
            f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" fill="#333" '
            f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{xml_text(y_label)}</text>'
        )
    for value, label, color in hlines:
        y = py(value)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{xml_text(color)}" stroke-dasharray="6 4"/>')
        if not legend:
            out.append(f'<text x="{left + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end" fill="{xml_text(color)}">{xml_text(label)}</text>')
    for s, (color, marker) in zip(series, looks):
        pts = sorted(_points(s))
        if not pts:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5 3"' if s.get("dash") else ""
        out.append(f'<g class="series" data-color="{xml_text(color)}" data-marker="{marker}">')
        out.append(f'<polyline points="{path}" fill="none" stroke="{xml_text(color)}" stroke-width="2"{dash}/>')
        every = max(1, math.ceil(len(pts) / MAX_MARKERS))
        out += [marker_svg(marker, px(x), py(y), color) for x, y in pts[::every]]
        out.append("</g>")
    if rows:
        out.append('<g class="legend">')
        for r, row in enumerate(rows):
            y = height + 4 + r * LEGEND_ROW + LEGEND_ROW / 2
            for x, i in row:
                label, color, marker, dashed = entries[i]
                dash = f' stroke-dasharray="{"6 4" if not marker else "5 3"}"' if dashed else ""
                swatch = f'x1="{x:.1f}" x2="{x + 24:.1f}" y1="{y:.1f}" y2="{y:.1f}"'
                out.append(f'<line {swatch} stroke="{xml_text(color)}" stroke-width="2"{dash}/>')
                if marker:
                    out.append(marker_svg(marker, x + 12, y, color))
                out.append(f'<text x="{x + 30:.1f}" y="{y + 4:.1f}" fill="#222">{xml_text(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def panel_chart(panels: Sequence[tuple[str, Sequence[Series]]], *, title: str = "", height: int = 200, **options: Any) -> str:
    """Line charts stacked in one SVG, one per (subtitle, series) panel, each with its own y axis (values of very
    different sizes, each read on its own scale) and legend; colours and markers are assigned across all panels,
    so no two series anywhere share both. `options` go to every `line_chart`."""
    every = [s for _, group in panels for s in group]
    looks = iter(styles(every))
    charts = []
    for subtitle, group in panels:
        styled = [{**s, "color": c, "marker": m} for s, (c, m) in zip(group, looks)]
        charts.append(line_chart(styled, title=subtitle, height=height, **options))
    width = int(options.get("width", 520))
    head = 26 if title else 0
    out = []
    y = head
    for chart in charts:
        h = int(chart.split('height="', 1)[1].split('"', 1)[0])
        inner = chart.split(">", 1)[1].rsplit("</svg>", 1)[0]  # the chart's content, in a nested svg at its offset
        out.append(f'<svg x="0" y="{y}" width="{width}" height="{h}" viewBox="0 0 {width} {h}">{inner}</svg>')
        y += h
    head_svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {y}" width="{width}" height="{y}" '
        f'role="img" font-family="sans-serif" font-size="{FONT_SIZE}">',
        f"<title>{xml_text(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{y}" fill="#ffffff"/>',
    ]
    if title:
        head_svg.append(f'<text x="8" y="18" font-weight="bold">{xml_text(title)}</text>')
    return "\n".join(head_svg + out + ["</svg>"]) + "\n"


def _points(s: Series) -> list[Point]:
    points = s.get("points") or []
    return [(float(x), float(y)) for x, y in points]  # type: ignore[attr-defined]


def size_label(n: float) -> str:
    """Message sizes on the x axis: 1M, 64M, 8G."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


NARROW = 330
"""The width of a chart a phone shows at its own size (a 390 px screen's card: about 338 px): drawn any wider, it is
scaled down and its 12 px text drawn under 11 px."""


def gate_curve(result: dict[str, Any], width: int = 520) -> str | None:
    """The fabric gate's bus bandwidth against message size, with the expectation and the pass line
    (fabric_check.py's result JSON: `sizes` rows, `expectation`), `width` px wide. None when the gate measured
    nothing."""
    rows = result.get("sizes") or []
    if not rows:
        return None
    points = [(float(r["bytes"]), float(r["busbw"])) for r in rows]
    in_place = [(float(r["bytes"]), float(r.get("in_place_busbw", r["busbw"]))) for r in rows]
    exp = result.get("expectation") or {}
    hlines: list[tuple[float, str, str]] = []
    if isinstance(exp, dict) and exp.get("expected_busbw_gbs"):
        hlines.append((float(exp["expected_busbw_gbs"]), f"expected {float(exp['expected_busbw_gbs']):.1f} GB/s", "#2ca02c"))
    if isinstance(exp, dict) and exp.get("pass_busbw_gbs"):
        hlines.append((float(exp["pass_busbw_gbs"]), f"pass at {float(exp['pass_busbw_gbs']):.1f} GB/s", "#ff7f0e"))
    status = str(result.get("status", "?")).upper()
    hosts = result.get("hosts") or []
    return line_chart(
        [
            {"label": "busbw (out of place)", "points": points, "color": "#d62728" if status == "FAIL" else "#1f77b4"},
            {"label": "busbw (in place)", "points": in_place, "color": "#9467bd", "dash": True},
        ],
        title=f"fabric gate {status} {result.get('time', '')}: {len(hosts)} pods x {result.get('gpusPerNode')} GPUs",
        x_label="message size (bytes)",
        y_label="bus bandwidth GB/s",
        x_log2=True,
        x_format=size_label,
        hlines=hlines,
        width=width,
    )
