"""images/presets.yaml: the architecture matrix the image-build component reads, and its agreement
with images/base.Containerfile."""

from __future__ import annotations

import re

import pytest

REQUIRED_KEYS = {"arch", "base_image", "cuda", "torch", "flash_attn", "torch_index_url", "tag", "build_args", "python"}
# python3 of the base images: the Ubuntu release's own (CUDA devel images install it from apt), and NGC
# PyTorch 25.xx's (release notes: Python 3.12). It picks the base stage's hash lock.
UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}
NGC_PYTORCH_PYTHON = "3.12"
ARCH_PRESETS = ("ampere", "hopper", "turing")
TAG_RE = re.compile(
    r"^(?P<arch>[a-z0-9]+)-(?P<cuda>cu\d{3})-torch(?P<torch>\d+\.\d+[0-9a-z.]*)"
    r"-fa(?P<fa>none|\d+\.\d+[0-9a-z.]*)$"
)
OCI_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
CUDA_IMAGE_RE = re.compile(
    r"^nvcr\.io/nvidia/cuda:(?P<major>\d+)\.(?P<minor>\d+)\.\d+"
    r"-cudnn-devel-ubuntu\d+\.\d+$"
)


def test_default_is_the_nvidia_pytorch_image(presets):
    assert presets["default"] == "nvidia-pytorch"
    default = presets["presets"]["nvidia-pytorch"]
    assert default["base_image"] == "nvcr.io/nvidia/pytorch:25.09-py3"
    assert default["cuda"] == "cu130"
    assert default["torch"].startswith("2.9")
    assert default["torch_index_url"] is None, "torch and Flash-Attention ship in NGC PyTorch"
    assert default["flash_attn"] not in (None, "", "none")


@pytest.mark.parametrize("name", ["nvidia-pytorch", *ARCH_PRESETS])
def test_preset_has_required_keys(presets, name):
    preset = presets["presets"][name]
    assert REQUIRED_KEYS <= set(preset), sorted(REQUIRED_KEYS - set(preset))
    for key in ("base_image", "cuda", "torch", "flash_attn", "tag"):
        assert isinstance(preset[key], str) and preset[key], key


def test_turing_has_no_flash_attention(presets):
    turing = presets["presets"]["turing"]
    assert turing["flash_attn"] == "none"
    assert turing["build_args"]["FLASH_ATTN_VERSION"] == "none"
    assert turing["tag"].endswith("-fanone")


@pytest.mark.parametrize("name", ["nvidia-pytorch", *ARCH_PRESETS])
def test_tag_is_derived_from_the_preset(presets, name):
    preset = presets["presets"][name]
    match = TAG_RE.match(preset["tag"])
    assert match, f"{preset['tag']} does not match <arch>-<cuda>-torch<ver>-fa<ver>"
    assert match.groupdict() == {"arch": preset["arch"], "cuda": preset["cuda"], "torch": preset["torch"], "fa": preset["flash_attn"]}
    assert preset["tag"] == presets["tag_format"].format(**preset)
    assert OCI_TAG_RE.match(preset["tag"]), "not a valid image tag"
    if name in ARCH_PRESETS:
        assert preset["arch"] == name


def test_tags_are_unique(presets):
    tags = [p["tag"] for p in presets["presets"].values()]
    assert len(tags) == len(set(tags))


@pytest.mark.parametrize("name", ARCH_PRESETS)
def test_arch_preset_cuda_matches_image_and_wheel_index(presets, name):
    preset = presets["presets"][name]
    image = CUDA_IMAGE_RE.match(preset["base_image"])
    assert image, f"{preset['base_image']} is not a CUDA cudnn-devel image"
    assert preset["cuda"] == f"cu{image['major']}{image['minor']}"
    assert preset["torch_index_url"] == f"https://download.pytorch.org/whl/{preset['cuda']}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", preset["torch"]), "arch presets pin a torch release"


@pytest.mark.parametrize("name", ["nvidia-pytorch", *ARCH_PRESETS])
def test_build_args_agree_with_the_preset(presets, name):
    preset = presets["presets"][name]
    args = preset["build_args"]
    assert args["PRESET"] == name
    assert args["BASE_TAG"] == preset["tag"]
    assert args["BASE_IMAGE"] == preset["base_image"]
    assert args["CUDA_VERSION"] == preset["cuda"]
    assert args["TORCH_VERSION"] == preset["torch"]
    assert args["TORCH_INDEX_URL"] == (preset["torch_index_url"] or "")
    assert args["FLASH_ATTN_VERSION"] == preset["flash_attn"]
    assert args["TORCHVISION_VERSION"] == (preset.get("torchvision") or "")
    assert args["TORCHAUDIO_VERSION"] == (preset.get("torchaudio") or "")
    assert args["TORCH_CUDA_ARCH_LIST"] == (preset.get("torch_cuda_arch_list") or "")
    assert args["FLASH_ATTN_CUDA_ARCHS"] == (preset.get("flash_attn_cuda_archs") or "")
    assert all(isinstance(v, str) for v in args.values()), "buildArgs values are strings"


@pytest.mark.parametrize("name", ["nvidia-pytorch", *ARCH_PRESETS])
def test_build_args_are_declared_in_the_base_containerfile(presets, base_cf, name):
    declared = base_cf.stage_args()
    unknown = set(presets["presets"][name]["build_args"]) - set(declared)
    assert not unknown, f"not ARGs of base.Containerfile: {sorted(unknown)}"


def test_base_containerfile_defaults_are_the_default_preset(presets, base_cf):
    default = presets["presets"][presets["default"]]["build_args"]
    declared = base_cf.stage_args()
    assert {k: declared[k] for k in default} == default
    assert base_cf.global_args()["BASE_IMAGE"] == default["BASE_IMAGE"]


@pytest.mark.parametrize("name", ["nvidia-pytorch", *ARCH_PRESETS])
def test_preset_python_is_its_base_images_and_has_a_lock(presets, name):
    from core.presets import base_lock

    preset = presets["presets"][name]
    ubuntu = re.search(r"-ubuntu(\d+\.\d+)$", preset["base_image"])
    expected = UBUNTU_PYTHON[ubuntu[1]] if ubuntu else NGC_PYTORCH_PYTHON
    assert preset["python"] == expected, f"{name}: base image {preset['base_image']} runs Python {expected}"
    assert base_lock(name).name == f"base-requirements-py{expected}.txt"
    assert base_lock(name).is_file(), f"no lock for Python {expected}: run make lock"
