"""Unit tests of the in-pod programs that run under every CPython from inpod.MIN_PYTHON on.

Standard library only (unittest) and nothing of ours imported but the programs: the `inpod` package is
imported as the pods import it, from the startup ConfigMap's mount (tests/inpod/mount.py; $POD_UNITS_MOUNT,
on PYTHONPATH), and its launchers are run from there. tests/inpod/test_pythons.py runs this file under each interpreter it finds:

  python tests/inpod/pod_units.py          the unit tests (unittest; exit status 0 when all pass)
  python tests/inpod/pod_units.py --dump   what every `parse_*` function of the programs makes of every
                                           tool-output fixture (tests/**/data/), and of a few generated
                                           inputs, as JSON: the same on every interpreter, or a program
                                           behaves differently there
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import types
import unittest
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent.parent
INPOD = ROOT / "inpod"
MOUNT = Path(os.environ.get("POD_UNITS_MOUNT") or INPOD / "bin")  # where the launchers are (the pod's mount)
LAUNCHERS = ("ml-dev", "fabric_check.py", "idle_agent.py", "home_page.py", "usage.py")


def program_modules() -> list[str]:
    """Every module of the package (inpod.fabric.parse, …) but the table (inpod/__init__.py) and the launchers."""
    found = []
    for path in sorted(INPOD.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[1] != "bin" and rel.name != "__init__" and "__pycache__" not in rel.parts:
            found.append(".".join(rel.parts))
    return found


def load(name: str) -> types.ModuleType:
    """The package's module `name` (inpod.idle.probes), imported as the pod imports it."""
    return importlib.import_module(name)


def find(function: str) -> Callable[..., Any]:
    """A function by name, from whichever program defines it (the programs may be split into modules)."""
    for name in program_modules():
        module = load(name)
        if callable(getattr(module, function, None)) and getattr(module, function).__module__ == module.__name__:
            return getattr(module, function)
    raise LookupError(f"no in-pod program defines {function}")


def outcome(function: Callable[..., Any], *args: object) -> dict[str, object]:
    try:
        return {"ok": function(*args)}
    except Exception as exc:  # the exception's type is the result
        return {"raised": type(exc).__name__}


def fixtures() -> list[Path]:
    found = [p for p in ROOT.glob("tests/**/data/**/*") if p.is_file() and p.suffix != ".md" and p.stat().st_size < 1 << 20]
    return sorted(found)


NODETOOL = ROOT / "tests" / "podsim" / "nodetool.py"
"""The node tools' stub the simulated pods run (tests/podsim/nodetools.py installs it; standard library only)."""
H200 = ROOT / "tests" / "data" / "tool_output" / "nvidia-smi-h200"
"""The real nvidia-smi of an H200 (SOURCES.md there)."""


def node_tool(directory: Path, tool: str, **state: object) -> str:
    """The node's `tool` (tests/podsim/nodetool.py, the stub every simulated pod runs), run by this interpreter, in
    `directory`: a one-GPU node without HCAs with `state` over it, its node.json as tests/podsim/nodetools.py
    `HostNode` writes it (tests/repo/test_simulators.py holds the two alike). This file cannot import nodetools.py
    (it runs on every interpreter of the matrix), so it writes the state itself. The tool's path."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(str(NODETOOL), str(directory / "nodetool.py"))
    node = {"pod": "host", "gpus": 1, "hcas": []}
    node.update(state)
    (directory / "node.json.tmp").write_text(json.dumps(node))
    os.replace(str(directory / "node.json.tmp"), str(directory / "node.json"))
    path = directory / tool
    command = " ".join(shlex.quote(str(a)) for a in (sys.executable, directory / "nodetool.py", tool))
    path.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    path.chmod(0o755)
    return str(path)


def replay(gpu: Path, apps: Path | None = None, rc: int = 0) -> dict[str, object]:
    """nodetools.py `set_gpus`' replay: a real tool's output, verbatim, for each query."""
    return {"gpu": str(gpu), "apps": None if apps is None else str(apps), "rc": rc}


GPU_HEADER = "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]\n"
GPU_ROWS = [
    GPU_HEADER + "0, GPU-1f2e3d4c-0000-1111-2222-333344445555, 87, 45, 40211",
    GPU_HEADER + "0, GPU-1f2e3d4c-0000-1111-2222-333344445555, 87 %, 45 %, 40211 MiB",
    GPU_HEADER + "0, GPU-1f2e3d4c-0000-1111-2222-333344445555, [N/A], [N/A], 0",
    GPU_HEADER + "1, MIG-6f1b7a3e-aaaa-bbbb-cccc-ddddeeeeffff, [Not Supported], [Not Supported], 3 MiB",
    "",
    GPU_HEADER + "0, GPU-x, 1, 2",
]


def dump() -> dict[str, object]:
    out: dict[str, object] = {}
    parsers = {}
    for module_name in program_modules():
        module = load(module_name)
        for name in sorted(vars(module)):
            function = getattr(module, name)
            if name.startswith("parse_") and callable(function) and getattr(function, "__module__", None) == module.__name__:
                parsers[f"{module_name}:{name}"] = function
    for fixture in fixtures():
        text = fixture.read_text(errors="replace")
        for name, function in parsers.items():
            out[f"{fixture.relative_to(ROOT)} | {name}"] = outcome(function, text)
    for i, row in enumerate(GPU_ROWS):
        out[f"gpu row {i}"] = outcome(find("parse_gpu_csv"), row)
    out["pair_rounds"] = [outcome(find("pair_rounds"), n) for n in range(1, 18)]
    racks = {"n1": "r1", "n2": "r2", "n3": "r1"}
    pods = [f"p-{i}" for i in range(6)]
    nodes = {"p-0": "n2", "p-1": "n1", "p-2": "n3", "p-3": "n2", "p-4": None}
    out["rack_order"] = outcome(find("rack_order"), pods, nodes, racks)
    out["jupyter times"] = [outcome(find("parse_time"), t) for t in ("2026-11-23T10:05:00.123456Z", "2026-11-23T10:05:00Z", "x")]
    # the bodies a real JupyterLab answered (tests/data/tool_output/jupyter), judged 10 minutes after the last activity
    jupyter = ROOT / "tests" / "data" / "tool_output" / "jupyter"
    for status in sorted(jupyter.glob("*-status.json")):
        state = status.name[: -len("-status.json")]
        b = {name: json.loads((jupyter / (state + "-" + name + ".json")).read_text()) for name in ("status", "kernels", "terminals")}

        def judge(b: dict[str, Any] = b) -> dict[str, Any]:
            now = find("parse_time")(b["status"]["last_activity"]) + 600
            return find("judge_jupyter")(b["status"], b["kernels"], b["terminals"], now)

        out["jupyter " + state] = outcome(judge)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        for rel, text in {"a.py": "print(1)\n", "pkg/b.txt": "b\n", "pkg/c.log": "c\n", ".gitignore": "*.log\n"}.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
        files = outcome(find("tree_files"), tree)
        out["tree_files"] = files
        out["tree_hash"] = outcome(find("tree_hash"), tree, files.get("ok", []))
    return out


class IdleAgent(unittest.TestCase):
    def setUp(self) -> None:
        self.agent = load("inpod.idle.probes")  # the idle agent's probes; idle_agent.py is its server and command line
        self.decider = load("inpod.idle.decider")
        self.tmp = Path(tempfile.mkdtemp(prefix="pod-units-"))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(self.tmp)], check=False)

    def test_gpu_rows_with_and_without_units_read_the_same(self) -> None:
        plain, units = (self.agent.parse_gpu_csv(row) for row in GPU_ROWS[:2])
        self.assertEqual(plain, units)
        self.assertEqual((plain[0]["util"], plain[0]["memUtil"], plain[0]["memUsedMiB"]), (87.0, 45.0, 40211.0))

    def test_values_a_gpu_does_not_report_are_none_not_errors(self) -> None:
        for row in GPU_ROWS[2:4]:
            with self.subTest(row=row):
                (gpu,) = self.agent.parse_gpu_csv(row)
                self.assertEqual((gpu["util"], gpu["memUtil"]), (None, None))
        for row in GPU_ROWS[4:]:
            with self.subTest(row=row), self.assertRaises(ValueError):
                self.agent.parse_gpu_csv(row)

    def node_smi(self, row: str) -> str:
        """The node's nvidia-smi printing `row` for --query-gpu and no compute process for --query-compute-apps."""
        gpu = self.tmp / f"gpu-{len(list(self.tmp.glob('gpu-*.csv')))}.csv"
        gpu.write_text(row + "\n")
        return node_tool(self.tmp / "node", "nvidia-smi", replay=replay(gpu))

    def test_probe_gpu_runs_the_tool(self) -> None:
        settings = dict(self.agent.DEFAULTS)
        with mock_env(ML_DEV_NVIDIA_SMI=self.node_smi(GPU_ROWS[0])):
            busy = self.agent.probe_gpu(settings)
        with mock_env(ML_DEV_NVIDIA_SMI=self.node_smi(GPU_ROWS[2])):
            unknown = self.agent.probe_gpu(settings)
        self.assertTrue(busy["ok"] and busy["active"])
        self.assertTrue(unknown["ok"] and not unknown["active"])  # [N/A] is no evidence, not a failed probe

    def test_probe_gpu_on_the_real_h200_output(self) -> None:
        """The real nvidia-smi of an H200 (tests/data/tool_output/nvidia-smi-h200, replayed by the node's tool):
        busy during a matmul + NCCL job (a compute process, 99-100 %), idle before it, idle right after it (4 %,
        under the default 5 % threshold, no process)."""
        settings = dict(self.agent.DEFAULTS)

        def probe(gpu: str, apps: str) -> dict[str, Any]:
            smi = node_tool(self.tmp / ("node-" + gpu), "nvidia-smi", replay=replay(H200 / gpu, H200 / apps))
            with mock_env(ML_DEV_NVIDIA_SMI=smi):
                return dict(self.agent.probe_gpu(settings))

        for i in range(3):
            busy = probe(f"gpu-busy-{i}.csv", f"apps-busy-{i}.csv")
            self.assertTrue(busy["ok"] and busy["active"], busy)
            self.assertEqual((busy["detail"]["busy"], busy["detail"]["processes"]), (["0"], 1))
        for state in ("idle", "after-0", "after-1"):
            gpu, apps = f"gpu-{state}.csv", f"apps-{state}.csv"
            idle = probe(gpu, apps)
            self.assertTrue(idle["ok"] and not idle["active"], idle)
            self.assertEqual(idle["detail"]["processes"], 0)

    def test_an_unexpected_exception_in_a_local_probe_counts_as_active(self) -> None:
        def broken(*_: object) -> dict[str, object]:
            raise AttributeError("'str' object has no attribute 'removesuffix'")

        patch = mock.patch.object(self.agent, "probe_terminals", broken)
        patch.start()
        self.addCleanup(patch.stop)
        with mock_env(ML_DEV_NVIDIA_SMI=self.node_smi(GPU_ROWS[3]), ML_DEV_STATE_DIR=str(self.tmp), ML_DEV_SSH_PROCESS_SCAN="0"):
            report = self.agent.local_activity(dict(self.agent.DEFAULTS))
        terminals = [s for s in report["signals"] if s["name"] == "terminals"]
        self.assertEqual(len(terminals), 1)
        self.assertFalse(terminals[0]["ok"])
        self.assertIn("AttributeError", terminals[0]["detail"]["error"])
        decider = self.decider.Decider(now=1000.0)
        self.assertEqual(decider.observe([report], now=5000.0), 0.0)
        self.assertIn("probe failed", decider.reason)

    def test_peers_come_from_rank_env(self) -> None:
        (self.tmp / "rank.env").write_text("export ML_DEV_PODS='env-0 env-1 env-2'\nexport ML_DEV_HOSTS='10.0.0.1 10.0.0.2 10.0.0.3'\n")
        with mock_env(ML_DEV_STATE_DIR=str(self.tmp), POD_NAME="env-1"):
            peers = self.decider.peers({"activityPort": 9099})
        self.assertEqual(peers, [("env-0", "http://10.0.0.1:9099"), ("env-2", "http://10.0.0.3:9099")])

    def test_probe_command_prints_the_signals(self) -> None:
        (self.tmp / "pts").mkdir()
        env = dict(os.environ, ML_DEV_NVIDIA_SMI=str(self.tmp / "missing"), ML_DEV_STATE_DIR=str(self.tmp), ML_DEV_SSH_PROCESS_SCAN="0")
        env.update(ML_DEV_IDLE_SETTINGS=str(self.tmp / "none.json"), ML_DEV_PTS_DIR=str(self.tmp / "pts"))
        proc = subprocess.run([sys.executable, str(MOUNT / "idle_agent.py"), "probe"], capture_output=True, env=env, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        report = json.loads(proc.stdout.decode().split("\n", 1)[1])  # after the log line about the settings
        self.assertEqual([s["name"] for s in report["signals"]], ["gpu", "terminals", "ssh", "launcher", "warm"])
        self.assertFalse(report["signals"][0]["ok"])


class Usage(unittest.TestCase):
    """inpod/usage.py: the GPU-hours arithmetic and the status rows, on every interpreter."""

    NOW = 1_780_000_000.0

    def setUp(self) -> None:
        self.usage = load("inpod.usage")

    def test_record_arithmetic(self) -> None:
        u = self.usage
        data = u.add_usage({u.LAST: str(int(self.NOW - 600))}, 2, 4, self.NOW, 600)
        self.assertEqual(data[u.BUCKET + u.day(self.NOW)], "4800")
        self.assertEqual(u.add_usage({u.LAST: "0"}, 1, 1, self.NOW, 600)[u.BUCKET + u.day(self.NOW)], "1200")
        self.assertEqual(u.week_hours({u.BUCKET + u.day(self.NOW - d * 86400): "3600" for d in range(10)}, self.NOW), 7.0)

    def test_status_rows(self) -> None:
        sts = {
            "kind": "StatefulSet",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"ml-dev-env/stack": "c-a"}},
            "spec": {"replicas": 0, "template": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
        }
        record = {"kind": "ConfigMap", "metadata": {"name": "a-idle-stop", "namespace": "ns"}, "data": {"x": "y"}}
        (row,) = self.usage.environments([sts, record], self.NOW)
        self.assertEqual((row["owner"], row["state"], row["size"], row["gpuHoursWeek"]), ("c-a", "idle-stopped", "0 × 2 GPU", 0.0))
        self.assertIn("c-a", self.usage.table([row]))


class StatusIdleView(unittest.TestCase):
    """inpod/ml_dev/status.py: the idle agent's view as `ml-dev status` prints it, on every interpreter."""

    NOW = 1_780_000_000.0

    def setUp(self) -> None:
        self.status = load("inpod.ml_dev.status")

    def view(self, **over: object) -> dict[str, object]:
        unreachable = {"ml-dev-env-1": {"seconds": 700.0, "since": self.NOW - 700, "writtenOff": True, "error": "timed out"}}
        base = {"at": self.NOW - 1, "enabled": True, "idleSeconds": 42.5, "reason": "ml-dev-env-0/ssh: active"}
        return {**base, "unreachableSeconds": 600, "unreachable": unreachable, **over}

    def test_a_written_off_worker_with_since_when(self) -> None:
        lines, notes = self.status.idle_lines(self.view(), "", {"intervalSeconds": 60}, self.NOW)
        self.assertEqual(lines, ["idle stop: idle 42 s; last activity: ml-dev-env-0/ssh: active"])
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.NOW - 700))
        self.assertEqual(
            notes["ml-dev-env-1"],
            "UNREACHABLE for the idle agent since " + since + " (700 s; timed out): "
            "written off after 600 s: the idle stop no longer waits for it",
        )

    def test_within_the_bound_it_still_holds_the_stop(self) -> None:
        held = {"ml-dev-env-1": {"seconds": 30.0, "since": self.NOW - 30, "writtenOff": False, "error": ""}}
        _, notes = self.status.idle_lines(self.view(unreachable=held), "", {}, self.NOW)
        self.assertIn("(30 s): counts as active until 600 s", notes["ml-dev-env-1"])

    def test_off_stale_and_no_view(self) -> None:
        off, _ = self.status.idle_lines(self.view(enabled=False), "", {}, self.NOW)
        self.assertEqual(off, ["idle stop: off (lifecycle.idleStop.enabled); the idle agent only reports"])
        stale, _ = self.status.idle_lines(self.view(at=self.NOW - 600), "", {"intervalSeconds": 60}, self.NOW)
        self.assertIn("(stale: pod 0's agent last decided 600 s ago)", stale[0])
        none, notes = self.status.idle_lines(None, "URLError: refused", {"activityPort": 9099}, self.NOW)
        self.assertEqual((none, notes), (["idle agent: no view from pod 0 (URLError: refused)"], {}))
        self.assertEqual(self.status.idle_lines(None, "no settings", {}, self.NOW), ([], {}))


class Programs(unittest.TestCase):
    def test_every_program_starts(self) -> None:
        for launcher in LAUNCHERS:
            with self.subTest(program=launcher):
                proc = subprocess.run([sys.executable, str(MOUNT / launcher), "--help"], capture_output=True, timeout=60)
                self.assertEqual(proc.returncode, 0, proc.stderr.decode())

    def test_pair_rounds_test_each_pair_at_most_once(self) -> None:
        pair_rounds = find("pair_rounds")
        for n in range(1, 18):
            pairs = [pair for rnd in pair_rounds(n) for pair in rnd]
            with self.subTest(n=n):
                self.assertEqual(len(pairs), len(set(pairs)))
                self.assertTrue(all(0 <= i < j < n for i, j in pairs))
                self.assertEqual({i for pair in pairs for i in pair}, set(range(n)) if n > 1 else set())


class Plots(unittest.TestCase):
    """svgplot (the fabric gate's curve, the home page's GPU plots) and the home page's escaping."""

    SVG = "{http://www.w3.org/2000/svg}"

    def test_a_chart_is_svg_and_its_text_is_escaped(self) -> None:
        import xml.etree.ElementTree as ET

        svgplot = load("inpod.lib.svgplot")
        label = "<script>alert(1)</script> & 'q'"
        root = ET.fromstring(svgplot.line_chart([{"label": label, "points": [(1, 2), (4, 8)]}], title=label, hlines=[(5, "<x>", "#000")]))
        self.assertEqual(root.tag, self.SVG + "svg")
        self.assertFalse(list(root.iter(self.SVG + "script")))
        self.assertIn(label, [t.text for t in root.iter(self.SVG + "text")])

    def test_gate_curve_of_a_real_run(self) -> None:
        import xml.etree.ElementTree as ET

        parse = find("parse_nccl_tests")
        rows = parse((ROOT / "tests" / "inpod" / "fabric" / "data" / "all_reduce_perf-2x8-h100.txt").read_text())["rows"]
        result = {"status": "pass", "time": "t", "hosts": ["a", "b"], "gpusPerNode": 8, "sizes": rows,
                  "expectation": {"expected_busbw_gbs": 194.6, "pass_busbw_gbs": 175.14}}  # fmt: skip
        root = ET.fromstring(load("inpod.lib.svgplot").gate_curve(result))
        line = next(root.iter(self.SVG + "polyline")).get("points", "").split()
        self.assertEqual(len(line), len(rows))
        self.assertIn("pass at 175.1 GB/s", [t.text for t in root.iter(self.SVG + "text")])
        self.assertIsNone(load("inpod.lib.svgplot").gate_curve({"status": "error"}))

    def test_home_page_escapes_what_users_write(self) -> None:
        home = load("inpod.home.page")
        with tempfile.TemporaryDirectory() as tmp, mock_env(ML_DEV_STATE_DIR=tmp, ML_DEV_WORKSPACE=tmp, ML_DEV_HOME_AGENTS=""):
            now = __import__("time").time()
            run = {"pid": 1, "command": ["python", "<img src=x onerror=alert(1)>"], "cwd": "/w/<b>", "pods": [], "started": now}
            session = {"pid": 2, "user": "<i>u</i>", "connection": "10.0.0.1 5000", "run": ""}
            report = {"signals": [{"name": "launcher", "ok": True, "detail": {"runs": ["run-1.json"], "launches": [run]}},
                                  {"name": "ssh", "ok": True, "detail": {"sessions": [session]}}]}  # fmt: skip
            col = home.Collector(Path(tmp, "history.json"))
            col.pods, col.reports = ["<u>pod</u>"], {"<u>pod</u>": report}
            page = home.fragment(col, now)
        for raw in ("<img src=x", "<b>", "<i>u", "<u>pod"):
            self.assertNotIn(raw, page)
        for shown in ("&lt;img src=x onerror=alert(1)&gt;", "/w/&lt;b&gt;", "&lt;i&gt;u&lt;/i&gt; from 10.0.0.1", "&lt;u&gt;pod&lt;/u&gt;"):
            self.assertIn(shown, page)


class GatePatch(unittest.TestCase):
    """inpod/ml_dev/sync.py: a small change through the rank agent's gate (`patch <n>`, serve_gate and apply_patch), fed
    straight to serve_gate in a process of its own (stdin: the launcher's words; stdout: its answers)."""

    MTIME_NS = 1_700_000_000_123_456_789  # nanoseconds travel (rsync's quick check compares them: --modify-window=-1)

    def setUp(self) -> None:
        self.sync = load("inpod.ml_dev.sync")
        self.tmp = Path(tempfile.mkdtemp(prefix="pod-units-"))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(self.tmp)], check=False)
        self.src, self.dst, self.outside = self.tmp / "launching", self.tmp / "pod", self.tmp / "outside"
        for root in (self.src, self.dst):
            self.put(root, "a.txt", b"a, as sent last\n")
            self.put(root, "sub/b.txt", b"b\n")
            self.put(root, "gone.txt", b"deleted on the launching pod\n")
            (root / ".ml-dev-synced").write_bytes(b"\0".join([b"a.txt", b"gone.txt", b"sub/b.txt"]))
        self.outside.mkdir()

    @staticmethod
    def put(root: Path, rel: str, data: bytes) -> Path:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        return root / rel

    def hash_of(self, root: Path, files: list[str]) -> str:
        with mock.patch.object(self.sync, "STATE_DIR", self.tmp / "state-here"):
            return str(self.sync.tree_hash(root, files))

    def gate(self, spec: dict[str, object], words: bytes) -> tuple[subprocess.CompletedProcess[bytes], list[Any]]:
        code = "import json, sys\nfrom inpod.ml_dev import sync\nsys.exit(0 if sync.serve_gate(json.loads(sys.argv[1])) else 1)"
        package = str(Path(str(self.sync.__file__)).parents[2])  # the `inpod` this run loads (the mount's)
        env = dict(os.environ, ML_DEV_STATE_DIR=str(self.tmp / "state-pod"), PYTHONPATH=package)
        argv = [sys.executable, "-c", code, json.dumps(spec)]
        proc = subprocess.run(argv, input=words, capture_output=True, env=env, cwd=str(self.tmp), timeout=60)
        mark = self.sync.GATE_MARK.encode()
        answers = [json.loads(ln[len(mark) :]) for ln in proc.stdout.splitlines() if ln.startswith(mark)]
        return proc, answers

    def patch(self, changed: list[str], files: list[str]) -> tuple[subprocess.CompletedProcess[bytes], list[dict[str, Any]]]:
        listing = "\0".join(files).encode()
        payload = self.sync.patch_payload(self.src, changed, listing)
        self.assertIsNotNone(payload)
        spec: dict[str, object] = {"root": str(self.dst), "hash": self.hash_of(self.src, files), "secrets": []}
        return self.gate(spec, b"patch %d\n" % len(payload) + payload + b"go\n")

    def test_a_change_lands_with_the_launching_pods_mode_and_mtime_and_deletions_apply(self) -> None:
        changed = self.put(self.src, "a.txt", b"a, changed on the launching pod\n")
        os.chmod(changed, 0o750)
        os.utime(changed, ns=(self.MTIME_NS, self.MTIME_NS))
        self.put(self.src, "sub/new/c.txt", b"a new file in a new directory\n")
        (self.src / "gone.txt").unlink()
        files = ["a.txt", "sub/b.txt", "sub/new/c.txt"]
        proc, answers = self.patch(["a.txt", "sub/new/c.txt"], files)
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        self.assertEqual(len(answers), 2, proc.stdout)
        self.assertEqual(answers[1]["tree"], self.hash_of(self.src, files))
        self.assertNotIn("refused", answers[1])
        got = os.stat(self.dst / "a.txt")
        self.assertEqual((self.dst / "a.txt").read_bytes(), b"a, changed on the launching pod\n")
        self.assertEqual((got.st_mode & 0o777, got.st_mtime_ns), (0o750, self.MTIME_NS))
        self.assertEqual((self.dst / "sub/new/c.txt").read_bytes(), b"a new file in a new directory\n")
        self.assertFalse((self.dst / "gone.txt").exists())
        self.assertEqual((self.dst / ".ml-dev-synced").read_bytes().split(b"\0"), [f.encode() for f in files])
        self.assertEqual([p.name for p in self.dst.rglob(".ml-dev-patch.*")], [])  # no temporary file left

    def test_a_path_outside_the_tree_or_the_list_is_refused_and_nothing_is_written(self) -> None:
        (self.dst / "link").symlink_to(self.outside)
        self.put(self.src, "a.txt", b"would be written first\n")
        cases = {
            "../escape.txt": "not a plain relative path",
            "sub/../../escape.txt": "not a plain relative path",
            str(self.outside / "abs.txt"): "not a plain relative path",
            "./a2.txt": "not a plain relative path",
            "link/x.txt": "goes through the symlink link here",
            "a.txt/x": "a.txt is not a directory here",
        }
        for rel, words in cases.items():
            with self.subTest(path=rel):
                src_rel = Path(rel.lstrip("./")).name  # the bytes come from a harmless file of the launching pod
                self.put(self.src, src_rel, b"payload\n")
                listing = "\0".join(["a.txt", rel]).encode()
                payload = self.sync.patch_payload(self.src, ["a.txt", src_rel], listing)
                header, _, rest = payload.partition(b"\n")
                spec = json.loads(header)
                spec["files"][1]["path"] = rel  # what a forged launcher would send
                forged = json.dumps(spec).encode() + b"\n" + rest
                proc, answers = self.gate({"root": str(self.dst), "hash": "x", "secrets": []}, b"patch %d\n" % len(forged) + forged)
                self.assertEqual(proc.returncode, 1, proc.stderr.decode())  # EOF, no `go`: nothing starts
                self.assertIn(words, answers[1].get("refused", ""), answers)
                self.assertEqual(answers[1]["tree"], answers[0]["tree"])  # the tree as it was
                self.assertEqual((self.dst / "a.txt").read_bytes(), b"a, as sent last\n")  # the good file neither
                self.assertEqual(list(self.outside.iterdir()), [])
                self.assertFalse((self.tmp / "escape.txt").exists())
        not_listed = self.sync.patch_payload(self.src, ["a.txt"], b"sub/b.txt")
        proc, answers = self.gate({"root": str(self.dst), "hash": "x", "secrets": []}, b"patch %d\n" % len(not_listed) + not_listed)
        self.assertIn("not in the launching pod's file list", answers[1].get("refused", ""), answers)
        self.assertEqual((self.dst / "a.txt").read_bytes(), b"a, as sent last\n")
        for bad in (
            b"not json\n",
            b'{"files": [{"path": "a.txt", "mode": 420, "size": 99, "mtime_ns": 1}]}\n',
            b'{"files": [{"path": "a.txt"}]}\n',
        ):
            proc, answers = self.gate({"root": str(self.dst), "hash": "x", "secrets": []}, b"patch %d\n" % len(bad) + bad)
            self.assertTrue(answers[1].get("refused"), answers)
            self.assertEqual((self.dst / "a.txt").read_bytes(), b"a, as sent last\n")

    def test_the_launching_pods_own_agent_takes_no_patch(self) -> None:
        payload = self.sync.patch_payload(self.src, ["a.txt"], b"a.txt")
        proc, answers = self.gate({"root": "", "hash": "x", "secrets": []}, b"patch %d\n" % len(payload) + payload)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(b"unexpected word from the launcher at the gate", proc.stderr)
        self.assertEqual(len(answers), 1)


class WarmWorkerTest(unittest.TestCase):
    """A warm rank's worker (inpod/ml_dev/warm.py), started as its node starts it, driven over its socketpair."""

    def setUp(self) -> None:
        import signal
        import socket

        self.signal = signal
        warm = load("inpod.ml_dev.warm")
        self.tmp = Path(tempfile.mkdtemp())
        package = str(Path(str(warm.__file__)).parents[2])  # the `inpod` this run loads (the mount's)
        self.ours, theirs = socket.socketpair()
        env = dict(os.environ, RANK="3", ML_DEV_STATE_DIR=str(self.tmp / "state"), PYTHONPATH=package)
        env[warm.WORKER_PYTHONPATH] = json.dumps("/the/ranks/own")
        argv = [sys.executable, "-c", warm.WORKER_MAIN, str(theirs.fileno()), "_warm-worker"]
        self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env=env, cwd=str(self.tmp), stdout=subprocess.DEVNULL)
        theirs.close()
        self.lines = self.ours.makefile("rb")
        self.seen: list[dict[str, Any]] = []
        self.assertEqual(self.next_op("up")["rank"], 3)

    def tearDown(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.lines.close()
        self.ours.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def next_op(self, op: str) -> dict[str, Any]:
        while True:
            msg = json.loads(self.lines.readline())
            if msg.get("op") == op:
                return dict(msg)
            self.seen.append(msg)

    def cell(self, cid: int, code: str, interrupt_after: float | None = None) -> tuple[dict[str, Any], str]:
        self.seen = []
        self.ours.sendall((json.dumps({"op": "cell", "id": cid, "code": code}) + "\n").encode())
        if interrupt_after is not None:
            time.sleep(interrupt_after)
            self.ours.sendall((json.dumps({"op": "interrupt", "id": cid}) + "\n").encode())
        done = self.next_op("done")
        return done, "".join(m["text"] for m in self.seen if m.get("op") == "out" and m.get("id") == cid)

    def test_cells_keep_the_namespace_interrupts_land_in_a_blocking_call_and_errors_name_the_line(self) -> None:
        done, out = self.cell(1, "import os\nx = 41\nprint(os.environ.get('PYTHONPATH'))\nx + 1")
        self.assertTrue(done["ok"], done)
        self.assertEqual(out, "/the/ranks/own\n42\n")  # the rank's own PYTHONPATH; the last expression shown
        done, out = self.cell(2, "import socket\na, b = socket.socketpair()\nprint('in')\na.recv(1)", interrupt_after=0.5)
        self.assertEqual((done["ok"], done["interrupted"], out), (False, True, "in\n"), done)
        self.interrupt_outside_a_cell_is_ignored()
        done, _ = self.cell(3, "y = x\n1 / 0")
        self.assertFalse(done["ok"] or done["interrupted"], done)
        self.assertIn("ZeroDivisionError: division by zero", done["error"])
        self.assertIn('cell-3.py", line 2', done["error"])
        self.assertIn("1 / 0", done["error"])  # the cell's own line
        self.assertNotIn("warm.py", done["error"])  # none of the worker's frames
        done, out = self.cell(4, "import sys\nsys.exit(5)")
        self.assertIn("the rank stays warm", done["error"])
        done, out = self.cell(5, "print(x + 1, y)")
        self.assertEqual((done["ok"], out), (True, "42 41\n"))
        self.ours.shutdown(2)  # the node gone: the worker ends
        self.assertEqual(self.proc.wait(timeout=30), 0)

    def interrupt_outside_a_cell_is_ignored(self) -> None:
        self.ours.sendall((json.dumps({"op": "interrupt", "id": 2}) + "\n").encode())
        self.proc.send_signal(self.signal.SIGINT)  # a stray SIGINT between cells
        time.sleep(0.3)
        self.assertIsNone(self.proc.poll())

    def test_the_checkpoint_signal_ends_an_idle_worker(self) -> None:
        self.proc.send_signal(self.signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=30), 128 + self.signal.SIGTERM)


class EnvgateUnits(unittest.TestCase):
    """inpod/ml_dev/envgate.py and envdrift.py on this interpreter: a fingerprint of a folder on PYTHONPATH with
    dist-info folders, the same after bytecode caches, another order and new timestamps; cached until a folder it
    watches changes; and the differences the launcher names. The fingerprint's `python3` is the one PATH finds (this machine's)."""

    def setUp(self) -> None:
        self.envgate = load("inpod.ml_dev.envgate")
        self.drift = load("inpod.ml_dev.envdrift")
        self.tmp = Path(tempfile.mkdtemp(prefix="pod-units-"))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(self.tmp)], check=False)
        self.site = self.tmp / "site"
        for name, version in (("Demo_Pkg", "1.0"), ("other.pkg", "2.1")):
            info = self.site / f"{name}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
        (self.site / "demo_pkg").mkdir()
        (self.site / "demo_pkg" / "__init__.py").write_text("")
        self.env = dict(os.environ, PYTHONPATH=str(self.site), HOME=str(self.tmp / "home"), LD_LIBRARY_PATH=str(self.tmp / "lib"))

    def fingerprint(self) -> dict[str, Any]:
        return dict(self.envgate.fingerprint(self.env, self.tmp / "state"))

    def age(self) -> None:
        """Every folder the fingerprint watches older than its 2 s guard (the cache is kept only then)."""
        old = time.time() - 10
        for path in [self.site, *self.site.rglob("*")]:
            os.utime(path, (old, old))

    def test_the_fingerprint_reads_dist_info_names_and_sys_path(self) -> None:
        fp = self.fingerprint()
        self.assertEqual({k: fp["distributions"].get(k) for k in ("demo-pkg", "other-pkg")}, {"demo-pkg": "1.0", "other-pkg": "2.1"})
        self.assertEqual(fp["pythonpath"], [str(self.site)])
        self.assertIn([str(self.site), True, ["demo_pkg"]], fp["sys_path"])
        self.assertEqual(fp["python"]["version"].count("."), 2)

    def test_bytecode_order_and_timestamps_are_no_difference_and_a_change_is_seen(self) -> None:
        self.age()
        first = self.fingerprint()
        (self.site / "demo_pkg" / "__pycache__").mkdir()
        (self.site / "__pycache__").mkdir()
        (self.site / "__pycache__" / "x.cpython-38.pyc").write_bytes(b"")
        os.utime(self.site, None)
        self.assertEqual(self.drift.differences(first, self.fingerprint()), [])
        self.age()
        cached = self.fingerprint()
        self.assertTrue((self.tmp / "state" / self.envgate.CACHE_FILE).is_file(), "kept once nothing changed for 2 s")
        self.assertEqual(self.fingerprint(), cached)
        (self.site / "Demo_Pkg-1.0.dist-info").rename(self.site / "Demo_Pkg-1.1.dist-info")
        diffs = self.drift.differences(first, self.fingerprint())
        self.assertEqual(diffs, [("package demo-pkg", "1.1", "1.0")])
        self.assertEqual(self.drift.align_command(diffs), "ml-dev pip install demo-pkg==1.0")

    def test_a_library_earlier_on_the_path_and_a_shadowing_entry_are_differences(self) -> None:
        first = self.fingerprint()
        (self.tmp / "lib").mkdir()
        (self.tmp / "lib" / "libnccl.so.2").write_bytes(b"stand-in")
        (self.site / "shadow.py").write_text("")
        diffs = dict((what, (theirs, mine)) for what, theirs, mine in self.drift.differences(first, self.fingerprint()))
        self.assertTrue(diffs["library libnccl"][0].startswith(str(self.tmp / "lib" / "libnccl.so.2") + " sha256 "), diffs)
        self.assertEqual(diffs[f"sys.path entry {self.site}"][0], "shadow importable from it")

    def test_a_rank_without_a_fingerprint_is_not_compared_and_one_that_differs_is_named(self) -> None:
        class Pods:
            me = 0

            @staticmethod
            def label(rank: int) -> str:
                return f"rank {rank} (p-{rank})"

        mine = self.fingerprint()
        theirs = dict(mine, distributions=dict(mine["distributions"], **{"demo-pkg": "9"}))
        with mock.patch("sys.stderr", new=io.StringIO()) as err:
            lines = self.drift.drift_lines(Pods(), {0: mine, 1: None, 2: theirs, 3: dict(mine)})
        self.assertEqual(lines, ["rank 2 (p-2): package demo-pkg 9; rank 0 (p-0), this pod: 1.0"])
        self.assertIn("rank 1 (p-1): no environment fingerprint to compare", err.getvalue())

    def gate_answer(self, spec: dict[str, object]) -> dict[str, Any]:
        """serve_gate's first answer, in a process of its own with this test's environment (a rank agent's)."""
        sync = load("inpod.ml_dev.sync")
        code = "import json, sys\nfrom inpod.ml_dev import sync\nsync.serve_gate(json.loads(sys.argv[1]))"
        package = str(Path(str(sync.__file__)).parents[2])  # the `inpod` this run loads (the mount's)
        env = dict(self.env, ML_DEV_STATE_DIR=str(self.tmp / "state"), PYTHONPATH=f"{self.site}:{package}")
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], input=b"", capture_output=True, env=env, timeout=60)
        mark = sync.GATE_MARK.encode()
        lines = [ln[len(mark) :] for ln in proc.stdout.splitlines() if ln.startswith(mark)]
        self.assertEqual(len(lines), 1, proc.stdout + proc.stderr)
        self.answer_bytes = len(lines[0])
        return dict(json.loads(lines[0]))

    def test_an_equal_rank_answers_the_launchers_digest_alone_and_a_different_one_its_fingerprint(self) -> None:
        class Pods:
            me = 0

            @staticmethod
            def label(rank: int) -> str:
                return f"rank {rank} (p-{rank})"

        spec: dict[str, object] = {"root": "", "hash": "", "secrets": [], "env": True}
        self.age()
        full = self.gate_answer(spec)  # no digest asked (a launcher from before it): the whole fingerprint
        mine, full_bytes = full["env"], self.answer_bytes
        guess = self.drift.Guess(self.tmp / "state")  # the cache the agent left: the launcher's guess
        self.assertEqual((guess.fingerprint, guess.digest), (mine, self.envgate.digest(mine)))
        same = self.gate_answer(dict(spec, env_digest=guess.digest))
        self.assertEqual(same, {"tree": "", "secrets": {}, "env_digest": guess.digest, "pip_applied": 0})
        self.assertLess(self.answer_bytes, full_bytes)
        self.assertIs(guess.heard(same), guess.fingerprint)
        (self.site / "Demo_Pkg-1.0.dist-info").rename(self.site / "Demo_Pkg-1.1.dist-info")
        other = self.gate_answer(dict(spec, env_digest=guess.digest))
        self.assertNotIn("env_digest", other)
        self.assertEqual(other["env"]["distributions"]["demo-pkg"], "1.1")
        prints = {0: guess.heard(same), 1: guess.heard(other), 2: guess.heard(same), 3: guess.heard({"tree": ""})}
        with mock.patch("sys.stderr", new=io.StringIO()) as err:
            lines = self.drift.drift_lines(Pods(), prints)
        self.assertEqual(lines, ["rank 1 (p-1): package demo-pkg 1.1; rank 0 (p-0), this pod: 1.0"])
        self.assertIn("rank 3 (p-3): no environment fingerprint to compare", err.getvalue())

    def test_an_empty_folder_on_the_path_is_the_same_as_none(self) -> None:
        first = self.fingerprint()
        empty = self.tmp / "empty"
        (empty / "__pycache__").mkdir(parents=True)
        (empty / "README").write_text("nothing to import\n")
        self.env["PYTHONPATH"] = f"{self.site}:{empty}"
        diffs = self.drift.differences(dict(first, pythonpath=[str(self.site), str(empty)]), self.fingerprint())
        self.assertEqual(diffs, [])
        (empty / "mod.py").write_text("")
        diffs = self.drift.differences(dict(first, pythonpath=[str(self.site), str(empty)]), self.fingerprint())
        self.assertEqual(diffs, [(f"sys.path entry {empty}", "mod importable from it", "")])

    def test_the_verdict_in_words(self) -> None:
        pod = load("inpod.lib.pod")
        self.assertIn("not checked yet", pod.environment_summary(None))
        record = {"at": "T", "ranks": 4, "one_environment": False, "differs": ["rank 3 (p-3)"], "allowed": True}
        self.assertEqual(pod.environment_summary(record), "ranks differ: rank 3 (p-3) (T, 4 ranks, launched with --allow-drift)")
        page = load("inpod.home.page")
        record.update(lines=["rank 3 (p-3): package x 2; rank 0 (p-0), this pod: <1>"], align="ml-dev pip install x==1")
        with mock.patch.object(page, "environment_record", return_value=record):
            body, cls = page.environment_html(None)
        self.assertEqual(cls, "bad")
        self.assertIn("rank 3 (p-3): package x 2; rank 0 (p-0), this pod: &lt;1&gt;", body)
        self.assertIn("ml-dev pip install x==1", body)
        with mock.patch.object(page, "environment_record", return_value=dict(record, one_environment=True)):
            self.assertIn("one environment (T, 4 ranks)", page.environment_html(None)[0])


@contextlib.contextmanager
def mock_env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


if __name__ == "__main__":
    if sys.argv[1:] == ["--dump"]:
        json.dump(dump(), sys.stdout, sort_keys=True, indent=1, default=repr)
        print()
    else:
        unittest.main()
