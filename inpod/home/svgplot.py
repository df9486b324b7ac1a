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

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


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


def fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2g}"


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
    """An SVG document: one polyline per series (x ascending), optional horizontal reference lines
    (value, label, color). `x_log2` spaces x on a log2 scale (message sizes); `x_range` fixes the x axis
    (points outside it are clipped to its edges)."""
    left, right, top, bottom = 52, 12, 24 if title else 10, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [float(p[0]) for s in series for p in _points(s)]
    ys = [float(p[1]) for s in series for p in _points(s)] + [h[0] for h in hlines]

    def xt(x: float) -> float:
        return math.log2(x) if x_log2 and x > 0 else x

    x_lo, x_hi = (min(map(xt, xs)), max(map(xt, xs))) if xs else (0.0, 1.0)
    if x_range is not None:
        x_lo, x_hi = xt(x_range[0]), xt(x_range[1])
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    top_y = y_max if y_max is not None else nice_max(max(ys) * 1.05 if ys else 1.0)

    def px(x: float) -> float:
        return left + (min(max(xt(x), x_lo), x_hi) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - min(max(y, 0.0), top_y) / top_y * plot_h

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" font-family="sans-serif" font-size="11">',
        f"<title>{xml_text(title or y_label)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    if title:
        out.append(f'<text x="{left}" y="15" font-weight="bold">{xml_text(title)}</text>')
    # y grid and labels (5 steps)
    for i in range(6):
        value = top_y * i / 5
        y = py(value)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{xml_text(fmt(value))}</text>')
    # x ticks: every point of the first series on a log scale (thinned), else 5 steps
    every_x = sorted(set(xs))
    ticks = sorted({float(p[0]) for p in _points(series[0])}) if (series and x_log2) else []
    if not x_log2 and x_range is None and every_x and len(every_x) <= 12 and all(x == int(x) for x in every_x):
        ticks = every_x  # run numbers, rounds: whole numbers only
    if not ticks:
        ticks = [x_lo + (x_hi - x_lo) * i / 4 for i in range(5)]
    stride = max(1, math.ceil(len(ticks) / 8))
    for x in ticks[::stride]:
        out.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle" fill="#555">{xml_text(x_format(x))}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    if x_label:
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" fill="#333">{xml_text(x_label)}</text>')
    if y_label:
        out.append(
            f'<text x="12" y="{top + plot_h / 2:.1f}" text-anchor="middle" fill="#333" '
            f'transform="rotate(-90 12 {top + plot_h / 2:.1f})">{xml_text(y_label)}</text>'
        )
    for value, label, color in hlines:
        y = py(value)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{xml_text(color)}" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{left + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end" fill="{xml_text(color)}">{xml_text(label)}</text>')
    for i, s in enumerate(series):
        color = str(s.get("color") or PALETTE[i % len(PALETTE)])
        pts = sorted(_points(s))
        if not pts:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="3 3"' if s.get("dash") else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{xml_text(color)}" stroke-width="2"{dash}/>')
        if len(pts) <= 40:
            for x, y in pts:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{xml_text(color)}"/>')
        if legend and s.get("label"):
            out.append(f'<text x="{left + 6}" y="{top + 14 + 13 * i}" fill="{xml_text(color)}">{xml_text(s["label"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _points(s: Series) -> list[Point]:
    points = s.get("points") or []
    return [(float(x), float(y)) for x, y in points]  # type: ignore[attr-defined]


def size_label(n: float) -> str:
    """Message sizes on the x axis: 1M, 64M, 8G."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def gate_curve(result: dict[str, Any]) -> str | None:
    """The fabric gate's bus bandwidth against message size, with the expectation and the pass line
    (fabric_check.py's result JSON: `sizes` rows, `expectation`). None when the gate measured nothing."""
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
    )
