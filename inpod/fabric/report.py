"""The gate's report: the table, the JSON result files in the workspace and the state dir, the latest result.

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..lib.pod import env_records_dir
from .util import GIB, ensure, state_dir

try:  # shipped with the home group; a ConfigMap without it draws no curve (the gate never fails for a plot)
    from ..lib import svgplot
except ImportError:  # pragma: no cover - exercised by tests/inpod/fabric/test_curve.py on a pod
    svgplot = None  # type: ignore[assignment]


def gate_svg(result: dict) -> str | None:
    """The bus-bandwidth curve against the expectation (svgplot.gate_curve, shipped beside the fabric check in
    the "home" group); None when svgplot is missing (an older ConfigMap): the gate never fails for a plot."""
    return svgplot.gate_curve(result) if svgplot is not None else None


def gate_table(result: dict) -> str:
    lines = [
        f"fabric gate {result['status'].upper()}  {result['time']}  mode {result.get('mode')}  "
        f"{len(result.get('hosts', []))} pods x {result.get('gpusPerNode')} GPUs"
    ]
    exp = result.get("expectation")
    if exp:
        lines.append(
            f"expected bus bandwidth {exp['expected_busbw_gbs']:.1f} GB/s = {exp['nics']} NICs x {exp['link_gbps']:g} Gbit/s / 8 "
            f"x {exp['efficiency']}; pass at >= {exp['pass_busbw_gbs']:.1f} GB/s ({exp['threshold_fraction']:g})"
        )
    else:
        lines.append("no expectation configured (fabricCheck.linkGbps): measurement only")
    if result.get("plateauBusbw") is not None:
        lines.append(f"plateau bus bandwidth (sizes >= {result['plateauMinBytes'] / GIB:g} GiB): {result['plateauBusbw']:.2f} GB/s")
    if result.get("sizes"):
        lines.append(f"{'size':>12}  {'algbw GB/s':>10}  {'busbw GB/s':>10}  {'in-place busbw':>14}")
        for r in result["sizes"]:
            mark = "  *" if r["bytes"] >= result["plateauMinBytes"] else ""
            lines.append(f"{human(r['bytes']):>12}  {r['algbw']:>10.2f}  {r['busbw']:>10.2f}  {r['in_place_busbw']:>14.2f}{mark}")
    if result.get("pairs"):
        lines.append("pairs (round, pods, plateau busbw):")
        for p in result["pairs"]:
            bw = f"{p['busbw']:.2f}" if p["busbw"] is not None else "-"
            lines.append(f"  {p['round']}  {p['pods'][0]} <-> {p['pods'][1]}  {bw} GB/s  {'ok' if p['pass'] else 'LOW'}")
    if result.get("nics"):
        lines.append("per-HCA ib_write_bw (pod -> cleared partner):")
        for n in result["nics"]:
            got = f"{n['gbps']:.2f} Gb/s" if n["gbps"] is not None else n.get("error", "-")
            lines.append(f"  {n['pod']} {n['hca']} ({n['interface']}) -> {n['partner']}: {got}  {'ok' if n['pass'] else 'LOW'}")
    for d in result.get("diagnosis", []):
        lines.append(f"diagnosis: {d}")
    return "\n".join(lines) + "\n"


def human(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def result_dirs() -> list[Path]:
    return [env_records_dir() / "fabric", state_dir() / "fabric"]


def write_result(result: dict) -> list[Path]:
    text = gate_table(result)
    svg = gate_svg(result)
    stamp = result["time"].replace(":", "").replace("-", "")
    written = []
    for d in result_dirs():
        try:
            ensure(d)
            files = [
                (f"gate-{stamp}.json", json.dumps(result, indent=2)),
                ("latest.json", json.dumps(result, indent=2)),
                ("latest.txt", text),
            ]
            if svg is not None:  # the curve next to its JSON
                files += [(f"gate-{stamp}.svg", svg), ("latest.svg", svg)]
            for name, content in files:
                tmp = d / f".{name}.tmp"
                tmp.write_text(content + ("" if content.endswith("\n") else "\n"))
                tmp.replace(d / name)
            written.append(d)
        except OSError as exc:
            print(f"WARNING: cannot write results to {d}: {exc}", file=sys.stderr)
    return written


def latest() -> dict | None:
    for d in reversed(result_dirs()):
        path = d / "latest.json"
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                return None
    return None
