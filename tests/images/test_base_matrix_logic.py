"""Execute the base image's PyTorch / Flash-Attention RUN step — the exact shell text from
images/base.Containerfile, with each preset's build args as its environment — against a stub
``python3``. The stub answers version queries with the real interpreter over a fake
site-packages (so the step's own importlib.metadata code runs) and records every
``python3 -m pip`` call instead of downloading anything.

This pins down the matrix behaviour: the NVIDIA preset installs nothing and only verifies the
versions NGC ships; the arch presets install torch from their PyTorch CUDA index and build
Flash-Attention with MAX_JOBS; turing installs no Flash-Attention."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STUB = textwrap.dedent("""\
    #!{python}
    import json, os, re, sys
    site = os.environ["STUB_SITE"]
    argv = sys.argv[1:]
    if argv[:2] == ["-m", "pip"]:
        env = {{k: os.environ.get(k) for k in ("MAX_JOBS", "NVCC_THREADS",
               "FLASH_ATTN_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "FLASH_ATTENTION_FORCE_BUILD")}}
        with open(os.environ["STUB_LOG"], "a") as log:
            log.write(json.dumps({{"args": argv[2:], "env": env}}) + "\\n")
        if os.environ.get("STUB_PIP_EXIT", "0") != "0":
            sys.exit(int(os.environ["STUB_PIP_EXIT"]))
        index = argv[argv.index("--index-url") + 1] if "--index-url" in argv else ""
        local = re.search(r"/whl/(cu\\d+)$", index)
        for arg in argv[2:]:
            if "==" in arg and not arg.startswith("-"):
                name, version = arg.split("==")
                version += "+" + local.group(1) if local else ""
                info = os.path.join(site, re.sub(r"[-_.]+", "_", name) + "-" + version + ".dist-info")
                os.makedirs(info)
                with open(os.path.join(info, "METADATA"), "w") as f:
                    f.write("Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n" % (name, version))
        sys.exit(0)
    os.environ["PYTHONPATH"] = site
    os.execv("{python}", ["{python}", "-S", *argv])
    """)


def install_fake(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def run_matrix_step(base_cf, tmp_path):
    script = base_cf.run_with("FLASH_ATTN_VERSION")
    bindir, site = tmp_path / "bin", tmp_path / "site"
    bindir.mkdir()
    site.mkdir()
    real_python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stub = bindir / "python3"
    stub.write_text(STUB.format(python=real_python))
    stub.chmod(0o755)
    log = tmp_path / "pip.log"
    dash = shutil.which("dash") or "/bin/sh"

    def run(build_args: dict[str, str], installed: dict[str, str] | None = None, stub_env: dict[str, str] | None = None):
        for name, version in (installed or {}).items():
            install_fake(site, name, version)
        env = {
            **base_cf.build_env(build_args),
            "PATH": f"{bindir}:/usr/bin:/bin",
            "STUB_SITE": str(site),
            "STUB_LOG": str(log),
            **(stub_env or {}),
        }
        proc = subprocess.run([dash, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    return run


LOCK_INSTALL = ["install", "--no-cache-dir", "--require-hashes", "--no-deps", "-r", "/etc/ml-dev-env/base-requirements.txt"]
NGC_SHIPS = {"torch": "2.9.0a0+50eac811a6.nv25.09", "flash_attn": "2.7.4.post1"}


def test_nvidia_preset_installs_nothing(presets, run_matrix_step):
    proc, calls = run_matrix_step(presets["presets"]["nvidia-pytorch"]["build_args"], NGC_SHIPS)
    assert proc.returncode == 0, proc.stderr
    assert calls == []
    assert "provided by nvcr.io/nvidia/pytorch:25.09-py3" in proc.stdout


def test_containerfile_defaults_behave_as_the_nvidia_preset(run_matrix_step):
    proc, calls = run_matrix_step({}, NGC_SHIPS)
    assert proc.returncode == 0, proc.stderr
    assert calls == []


@pytest.mark.parametrize(
    "installed, wrong",
    [
        ({"torch": "2.8.0a0+5228986c39.nv25.06", "flash_attn": "2.7.4.post1"}, "torch"),
        ({"torch": "2.9.0a0+50eac811a6.nv25.09"}, "flash_attn"),
        ({"flash_attn": "2.7.4.post1"}, "PyTorch"),
    ],
)
def test_nvidia_preset_fails_when_the_image_does_not_match(presets, run_matrix_step, installed, wrong):
    proc, calls = run_matrix_step(presets["presets"]["nvidia-pytorch"]["build_args"], installed)
    assert proc.returncode != 0
    assert wrong in proc.stderr
    assert calls == [], "a base-provided preset must never fall back to installing"


@pytest.mark.parametrize("name", ["ampere", "hopper"])
def test_arch_preset_installs_torch_and_builds_flash_attention(presets, run_matrix_step, name):
    preset = presets["presets"][name]
    args = {**preset["build_args"], "MAX_JOBS": "7"}
    proc, calls = run_matrix_step(args)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 3, calls
    lock, torch, fa = calls
    # the hash lock first: Flash-Attention's build tools come from it, hash-checked, nothing resolved
    assert lock["args"] == LOCK_INSTALL
    assert torch["args"] == [
        "install",
        "--no-cache-dir",
        "--index-url",
        preset["torch_index_url"],
        f"torch=={preset['torch']}",
        f"torchvision=={preset['torchvision']}",
        f"torchaudio=={preset['torchaudio']}",
    ]
    assert fa["args"] == ["install", "--no-cache-dir", "--no-build-isolation", f"flash-attn=={preset['flash_attn']}"]
    assert fa["env"]["MAX_JOBS"] == "7"
    assert fa["env"]["FLASH_ATTN_CUDA_ARCHS"] == preset["flash_attn_cuda_archs"]
    assert fa["env"]["TORCH_CUDA_ARCH_LIST"] == preset["torch_cuda_arch_list"]
    # the +cuXXX local version of the installed wheel still counts as the preset's torch
    assert f"PyTorch {preset['torch']} ({preset['cuda']})" in proc.stdout


def test_turing_installs_torch_but_no_flash_attention(presets, run_matrix_step):
    preset = presets["presets"]["turing"]
    proc, calls = run_matrix_step(preset["build_args"])
    assert proc.returncode == 0, proc.stderr
    installed = [arg for call in calls if call["args"] != LOCK_INSTALL for arg in call["args"] if "==" in arg]
    assert installed == ["torch==2.7.1", "torchvision==0.22.1", "torchaudio==2.7.1"]
    assert "Flash-Attention: not installed" in proc.stdout


def test_arch_preset_keeps_a_matching_torch(presets, run_matrix_step):
    preset = presets["presets"]["hopper"]
    proc, calls = run_matrix_step(preset["build_args"], {"torch": "2.8.0+cu128", "flash_attn": "2.8.3"})
    assert proc.returncode == 0, proc.stderr
    assert [c["args"] for c in calls] == [LOCK_INSTALL], "only the lock is installed"


def test_failed_pip_install_fails_the_step(presets, run_matrix_step):
    proc, calls = run_matrix_step(presets["presets"]["hopper"]["build_args"], stub_env={"STUB_PIP_EXIT": "1"})
    assert proc.returncode != 0
    assert len(calls) == 1, "the step must stop at the first failing pip"
