"""`make bench-launch` and `make bench-package` write their plot beside their markdown report and raw JSON (issue 20
item 4): the SVG shows one line per measured case (launch: time against pods per case and launcher, the
extrapolation dashed; package: per approach), with the numbers of the JSON (svgplot draws it)."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import bench_launch, bench_package
from bench.bench_package import Result

SVG = "{http://www.w3.org/2000/svg}"


def launch_results(size: int) -> bench_launch.Results:
    """Two pod counts, both launchers, three runs per case: the shape of a real run's record."""

    def run(wall: float, tx: float, hops: list[dict[str, object]] | None = None) -> bench_launch.Sample:
        return {"wall": wall, "tx": tx, **({"hops": hops, "rounds": max(int(str(h["round"])) for h in hops)} if hops else {})}

    out: bench_launch.Results = {bench_launch.NEW: {}, bench_launch.OLD: {}}
    for n in (2, 4):
        hops: list[dict[str, object]] = [{"src": 0, "dst": 1, "round": 1, "seconds": 0.5}]
        hops += [{"src": 1, "dst": d, "round": 2, "seconds": 0.6} for d in range(2, n)]
        out[bench_launch.NEW][n] = {
            "unchanged": [run(0.3 + 0.05 * n + k / 100, 1e4) for k in range(3)],
            "one file changed": [
                run(
                    0.35 + 0.05 * n + k / 100, 1.1e6, [{"src": 0, "dst": d, "round": 1, "seconds": 0.1, "via": "gate"} for d in range(1, n)]
                )
                for k in range(3)
            ],
            "first copy": [run(1.0 + 0.2 * n + k / 100, 1.05 * size, hops) for k in range(3)],
            bench_launch.ALONE: [{**run(0.6, size), "hop": 0.5 + k / 100} for k in range(3)],
        }
        out[bench_launch.OLD][n] = {case: [run(0.5 * n + k / 100, (n - 1) * size) for k in range(3)] for case in bench_launch.CASES}
    return out


def test_launch_report_writes_the_plot_beside_the_table(tmp_path: Path) -> None:
    size = 20_000_000
    results = launch_results(size)
    stem = bench_launch.write_report(tmp_path, size, results, {"cpus": 2, "repeat": 3, "load_start": "1.0", "load_end": "2.0"})
    assert {p.name for p in tmp_path.iterdir()} == {f"{stem.name}.{ext}" for ext in ("md", "json", "svg")}
    assert json.loads(stem.with_suffix(".json").read_text())["results"]["this tree"]["4"]["unchanged"][0]["wall"] == 0.5
    md = stem.with_suffix(".md").read_text()
    # per N and case, both launchers: median, spread, every run, pod 0's bytes against the tree
    assert "| 4 | first copy | this tree | 1.81 | 1.80–1.82 | 1.80, 1.81, 1.82 | 21.0 MB (1.05 × tree) |" in md
    assert "| 4 | first copy | baseline | 2.01 | 2.00–2.02 | 2.00, 2.01, 2.02 | 60.0 MB (3.00 × tree) |" in md
    # the hops round by round, the critical path against (ceil(log2 N) + 1) x one copy alone
    assert "| 4 | 2 | r1: 0→1 0.50; r2: 1→2 0.60, 1→3 0.60 | 1.10 (≤ bound) | 0.51 | 1.53 |" in md
    # and the way each pod got a changed file (the median run's hops): the rank agent's gate or rsync
    assert re.search(r"^\| 4 \| 2 \| .* \| (yes|NO) \([0-9.]+ ×\) \| gate 3 \|$", md, re.M), md
    assert "**Extrapolated, not measured**" in md and "| 32 pods | 64 pods |" in md
    # this tree's first copy from the 4-pod median (1.81 s): the unchanged line's slope (0.05 s a pod) and one hop
    # alone (0.51 s) per round beyond 2 (5 rounds at 32 pods, 6 at 64)
    _, slope = bench_launch.fit([(2, 0.41), (4, 0.51)])
    at32, at64 = 1.81 + slope * 28 + 3 * 0.51, 1.81 + slope * 60 + 4 * 0.51
    assert f"| this tree: first copy | {at32:.2f} s | {at64:.2f} s |" in md
    svg = ET.fromstring(stem.with_suffix(".svg").read_text())
    assert svg.tag == f"{SVG}svg"
    labels = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"first copy (this tree)", "first copy (baseline)", "unchanged (this tree)"} <= labels, labels
    assert "pods" in labels and any("extrapolated" in (t or "") for t in labels)
    assert len(list(svg.iter(f"{SVG}polyline"))) == 8  # 3 cases x 2 launchers, 2 dashed extrapolations


def test_package_report_writes_the_plot_beside_the_table(tmp_path: Path) -> None:
    """`make bench-package`'s report, fed three recorded rounds of two approaches (the shape of a real run's
    JSON; no benchmark runs): the SVG lands next to the markdown, draws one series per approach with a point per
    round, and the markdown links it by its file name."""
    rounds = {"raw1": [7.0, 6.7, 9.8], "ours1": [7.8, 8.6, 11.4]}
    results = [Result(name, walls[i], 868_352, 97_202_176) for i in range(3) for name, walls in rounds.items()]  # interleaved
    out = tmp_path / "bench-out"
    md = bench_package.write_report(out, "1.5GiB", 1_610_612_736, [2.1, 2.2, 2.0], 3, results, "no CPU pinning")
    stem = "bench-package-1.5gib"  # a size with a dot keeps its whole name
    assert md == out / f"{stem}.md"
    assert {p.name for p in out.iterdir()} == {f"{stem}.{ext}" for ext in ("md", "json", "svg")}
    recorded = json.loads((out / f"{stem}.json").read_text())
    assert [r["seconds"] for r in recorded["results"] if r["name"] == "ours1"] == rounds["ours1"]

    svg = ET.fromstring((out / f"{stem}.svg").read_text())
    assert svg.tag == f"{SVG}svg"
    lines = list(svg.iter(f"{SVG}polyline"))
    assert len(lines) == len(rounds), "one series per approach"
    assert all(len(line.attrib["points"].split()) == 3 for line in lines), "a point per round"
    labels = {t.text for t in svg.iter(f"{SVG}text")}
    titles = {bench_package.APPROACHES[name][0] for name in rounds}
    assert titles <= labels, labels
    assert any("1.5GiB" in (t or "") for t in labels), "the title names the model size"

    text = md.read_text()
    assert f"]({stem}.svg)" in text, "the report links its plot by the name beside it"
    assert all(title in text for title in titles), "the table has a row per approach"


def test_package_benchmark_keeps_the_servers_off_the_packagers_cores() -> None:
    """`--pin auto`: with three or more CPUs the packager, the registry and the S3 server each get CPUs of their own
    (the issue's condition for the streaming wall-time goal); with two the servers share the one the packager has
    not; `none` pins nothing."""
    packager, registry, source = bench_package.split_cpus("auto", list(range(16)))
    assert packager and registry and source
    assert (len(packager), len(registry), len(source)) == (5, 5, 6)
    assert not (packager & registry or packager & source or registry & source)
    assert packager | registry | source == set(range(16))
    assert bench_package.split_cpus("auto", [0, 1]) == ({0}, {1}, {1})
    assert bench_package.split_cpus("auto", [3, 5, 7]) == ({3}, {5}, {7})
    assert bench_package.split_cpus("none", list(range(16))) == (None, None, None)
    assert bench_package.split_cpus("auto", [0]) == (None, None, None)


def test_package_report_compares_the_rerun_with_the_baselines() -> None:
    """rerun2 (packaging an unchanged model again, which verifies the layers the tag names) is set against
    basererun2 in the report's A/B lines, as stream2 is against basestream2."""
    walls = {"stream2": [10.0, 12.0, 11.0], "basestream2": [10.0, 11.0, 12.0], "rerun2": [4.0, 5.0, 6.0], "basererun2": [1.0, 2.0, 2.0]}
    results = [Result(name, w[i], 0, 0, cpu_user=w[i] / 2) for i in range(3) for name, w in walls.items()]
    text = bench_package.report(results, 1 << 30, "1GiB", 0.6, 3, "no CPU pinning")
    assert "stream2: 1.00 × basestream2's CPU, 1.00 × its wall time" in text, text
    assert "rerun2: 2.50 × basererun2's CPU, 2.50 × its wall time" in text, text


def test_scratch_walk_ignores_entries_that_vanish_or_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared /var/tmp holds other users' trees (a chroot's /proc: its entries vanish with ProcessLookupError
    mid-walk): such an entry counts nothing and the walk goes on."""
    (tmp_path / "a").write_bytes(b"x" * 8192)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gone").write_bytes(b"y" * 8192)
    real_lstat = os.lstat

    def lstat(path: str | os.PathLike[str], *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("gone"):
            raise ProcessLookupError(3, "No such process", str(path))
        return real_lstat(path)

    whole = bench_package.allocated(tmp_path)
    monkeypatch.setattr(bench_package.os, "lstat", lstat)
    assert 8192 <= bench_package.allocated(tmp_path) < whole
