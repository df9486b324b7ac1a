"""`make bench-launch` and `make bench-package` write their plot of every run beside their markdown report and raw
JSON (issue 20 item 4): the SVG shows one line per measured case (launch: plus the cold run; package: per approach),
with the numbers of the JSON (svgplot draws it)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import bench_launch, bench_package
from bench.bench_package import Result

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
