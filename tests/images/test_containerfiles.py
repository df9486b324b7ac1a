"""Static checks of images/*.Containerfile, read with dockerfile_parse (a real Dockerfile
parser) and shlex (a real shell lexer): what the images must contain, and what they must not
(no cluster-specific NCCL values: images/README.md)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import get_key_val_dictionary
from packaging.requirements import Requirement

IMAGES = Path(__file__).resolve().parents[2] / "images"

RDMA_PACKAGES = {
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "infiniband-diags",
    "libibverbs-dev",
    "librdmacm-dev",
    "numactl",
    "pciutils",
}
CUDA_BOUND = {"torch", "torchvision", "torchaudio", "triton", "flash-attn"}


def nccl_violations(parser: DockerfileParser) -> list[str]:
    """Every instruction that would put an NCCL_* value into the image: an ENV key, or an
    NCCL_ name anywhere in an ARG, LABEL or RUN (e.g. written into /etc/profile). Comments
    are not instructions, so documenting the rule is fine."""
    found = []
    for instruction in parser.structure:
        if instruction["instruction"] == "ENV":
            found += [f"ENV {key}" for key in get_key_val_dictionary(instruction["value"]) if key.startswith("NCCL_")]
        elif instruction["instruction"] != "COMMENT" and "NCCL_" in instruction["value"]:
            found.append(f"{instruction['instruction']} (line {instruction['startline'] + 1})")
    return found


# --------------------------------------------------------------------------- FROM / ARG


def test_base_from_resolves_to_default_preset(base_cf, presets):
    default = presets["presets"][presets["default"]]
    assert base_cf.parent_images() == [default["base_image"]]
    assert base_cf.instructions("FROM")[0]["value"] == "${BASE_IMAGE}"
    # ...and a build arg (what the BuildConfig passes for another preset) overrides it.
    hopper = presets["presets"]["hopper"]["base_image"]
    assert base_cf.parent_images({"BASE_IMAGE": hopper}) == [hopper]


def test_runtime_from_resolves_to_default_base_tag(runtime_cf, presets):
    default = presets["presets"][presets["default"]]
    assert runtime_cf.parent_images() == [f"{presets['image_stream']}:{default['tag']}"]
    assert runtime_cf.instructions("FROM")[0]["value"] == "${BASE_IMAGE}"
    assert runtime_cf.parent_images({"BASE_IMAGE": "registry.local/ns/base:x"}) == ["registry.local/ns/base:x"]


@pytest.mark.parametrize("name", ["base_cf", "runtime_cf"])
def test_single_stage_with_base_image_arg_before_from(name, request):
    cf = request.getfixturevalue(name)
    assert len(cf.instructions("FROM")) == 1, "OpenShift's `from` override replaces one FROM"
    assert cf.structure[0]["instruction"] == "ARG"
    assert "BASE_IMAGE" in cf.global_args()
    # redeclared in the stage so LABELs can record the base
    assert "BASE_IMAGE" in cf.stage_args()


# --------------------------------------------------------------------------- NCCL


@pytest.mark.parametrize("name", ["base_cf", "runtime_cf"])
def test_no_nccl_values_baked_in(name, request):
    cf = request.getfixturevalue(name)
    assert not [k for k in cf.env_keys() if k.startswith("NCCL_")]
    assert nccl_violations(cf.parser) == []


def test_nccl_check_catches_the_original_images_env():
    """The original image's BuildConfig ENV (a fixed barcelona HCA list) must be flagged, as must a RUN
    that writes an NCCL value into a profile script."""
    original = (
        b"FROM nvcr.io/nvidia/pytorch:25.09-py3 AS base\n"
        b"ENV NCCL_DEBUG=INFO NCCL_IB_DISABLE=0 NCCL_IB_HCA=mlx5_6,mlx5_7,mlx5_10,mlx5_11 \\\n"
        b"    NCCL_IB_GID_INDEX=3 NCCL_SOCKET_IFNAME=net1,net2,net3,net4\n"
        b"RUN echo 'export NCCL_IB_HCA=mlx5_6' >> /etc/profile\n"
    )
    found = nccl_violations(DockerfileParser(fileobj=io.BytesIO(original)))
    assert "ENV NCCL_IB_HCA" in found and "ENV NCCL_SOCKET_IFNAME" in found
    assert any(f.startswith("RUN") for f in found)


# --------------------------------------------------------------------------- base content


def test_base_installs_rdma_userspace(base_cf, shell_helpers):
    packages = shell_helpers["apt"]("\n".join(base_cf.runs()))
    assert RDMA_PACKAGES <= packages, f"missing: {sorted(RDMA_PACKAGES - packages)}"


def test_base_sets_memlock_unlimited(base_cf, shell_helpers):
    run = base_cf.run_with("memlock")
    writes = [c for c in shell_helpers["commands"](run) if c[0] == "printf" and ">" in c]
    limits = [c for c in writes if c[-1].startswith("/etc/security/limits.d/")]
    assert limits, "no file written under /etc/security/limits.d/"
    lines = set(limits[0][2:-2])
    assert {"* soft memlock unlimited", "* hard memlock unlimited"} <= lines


def test_base_installs_only_the_hash_lock(base_cf, shell_helpers):
    """Every pip install of the stage outside the torch family is the lock, hash-checked, unresolved."""
    lock_installs = []
    for command in shell_helpers["commands"]("\n".join(base_cf.runs())):
        pip = command.index("pip") if "pip" in command else -1
        rest = command[pip + 2 :] if pip > 0 and command[pip - 1] == "-m" and command[pip + 1 : pip + 2] == ["install"] else None
        if rest is None or any("${TORCH_VERSION}" in a or "${FLASH_ATTN_VERSION}" in a for a in rest):
            continue
        assert {"--require-hashes", "--no-deps"} <= set(rest), command
        assert rest[rest.index("-r") + 1] == "/etc/ml-dev-env/base-requirements.txt", command
        assert not [a for a in rest if "==" in a], f"a pin outside the lock: {command}"
        lock_installs.append(command)
    assert len(lock_installs) == 2, "arch presets: before torch (build tools); every preset: the dev tools"
    copy = [i["value"].split() for i in base_cf.instructions("COPY")]
    assert ["ml-dev-env-lock/base-requirements.txt", "/etc/ml-dev-env/base-requirements.txt"] in copy


def test_base_torch_and_flash_attn_come_from_build_args(base_cf, shell_helpers):
    args = [a for group in shell_helpers["pip"](base_cf.run_with("FLASH_ATTN_VERSION")) for a in group]
    assert "torch==${TORCH_VERSION}" in args
    assert "flash-attn==${FLASH_ATTN_VERSION}" in args
    commands = shell_helpers["commands"](base_cf.run_with("FLASH_ATTN_VERSION"))
    torch_install = next(c for c in commands if "torch==${TORCH_VERSION}" in c)
    assert torch_install[torch_install.index("--index-url") + 1] == "${TORCH_INDEX_URL}"
    fa_install = next(c for c in commands if "flash-attn==${FLASH_ATTN_VERSION}" in c)
    assert "--no-build-isolation" in fa_install
    assert "MAX_JOBS=${MAX_JOBS}" in fa_install


def test_base_installs_code_server_from_a_verified_release(base_cf, shell_helpers):
    args = base_cf.stage_args()
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["CODE_SERVER_VERSION"])
    for arch in ("AMD64", "ARM64"):
        assert re.fullmatch(r"[0-9a-f]{128}", args[f"CODE_SERVER_SHA512_{arch}"])
    run = base_cf.run_with("code-server")
    commands = shell_helpers["commands"](run)
    download = next(c for c in commands if c[0] == "curl")
    assert download[-1].startswith("https://github.com/coder/code-server/releases/download/v${CODE_SERVER_VERSION}/")
    assert any(c[:2] == ["sha512sum", "-c"] for c in commands), "download is not verified"
    assert ["ln", "-sf", "/opt/code-server/bin/code-server", "/usr/local/bin/code-server"] in commands


@pytest.mark.parametrize("name", ["base_cf", "runtime_cf"])
def test_nothing_is_piped_into_a_shell(name, request):
    cf = request.getfixturevalue(name)
    for run in cf.runs():
        assert not re.search(r"\|\s*(sudo\s+)?(ba|z|da)?sh\b", run), run[:200]


def test_base_profile_hook_sources_the_pod_env_file(base_cf, shell_helpers):
    commands = shell_helpers["commands"](base_cf.run_with("/etc/profile.d/ml-dev-env.sh"))
    profile = next(c for c in commands if c[-1] == "/etc/profile.d/ml-dev-env.sh")
    body = "\n".join(profile[2:-2])
    assert '. "${ML_DEV_ENV_FILE:-/tmp/ml-dev-env/env.sh}"' in body
    assert 'if [ -r "${ML_DEV_ENV_FILE:-/tmp/ml-dev-env/env.sh}" ]' in body
    bashrc = next(c for c in commands if c[-1] == "/etc/bash.bashrc")
    assert bashrc[-2] == ">>", "the hook must be appended to bash.bashrc, not replace it"


def test_base_layout_for_arbitrary_uids(base_cf, shell_helpers):
    commands = shell_helpers["commands"](base_cf.run_with("g=u"))
    chmod = next(c for c in commands if c[:3] == ["chmod", "-R", "g=u"])
    chgrp = next(c for c in commands if c[:3] == ["chgrp", "-R", "0"])
    home = base_cf.parser.envs["HOME"]
    for path in ("/workspace", home):
        assert path in chmod and path in chgrp
    assert base_cf.instructions("WORKDIR")[-1]["value"] == "/workspace"
    assert not base_cf.instructions("USER"), "OpenShift picks the UID; the image must not"


def test_base_exposes_dev_ports_and_starts_no_servers(base_cf):
    exposed = set(" ".join(i["value"] for i in base_cf.instructions("EXPOSE")).split())
    assert {"8080", "8888", "6006"} <= exposed
    assert not base_cf.instructions("ENTRYPOINT")
    for cmd in base_cf.instructions("CMD"):
        assert not re.search(r"code-server|jupyter|tensorboard", cmd["value"])


def test_base_freezes_cuda_bound_packages_for_later_installs(base_cf, runtime_cf):
    assert base_cf.parser.envs["PIP_CONSTRAINT"] == "/etc/ml-dev-env/constraints.txt"
    keep = base_cf.pins_keep_set()
    assert {"torch", "torchvision", "flash-attn", "triton"} <= keep
    assert keep == runtime_cf.pins_keep_set(), "base and runtime must freeze the same set"


# --------------------------------------------------------------------------- runtime content


def test_runtime_installs_requirements_constrained(runtime_cf, shell_helpers):
    args = runtime_cf.stage_args()
    for name in ("BASE_IMAGE", "SOURCE_REF", "REQUIREMENTS_FILE", "APP_REQUIREMENTS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        assert name in args
    # index args reach pip only when given: empty by default and then unset for pip
    assert args["PIP_INDEX_URL"] == "" and args["PIP_EXTRA_INDEX_URL"] == ""
    commands = shell_helpers["commands"]("\n".join(runtime_cf.runs()))
    assert ["unset", "PIP_INDEX_URL"] in commands and ["unset", "PIP_EXTRA_INDEX_URL"] in commands
    copy = runtime_cf.instructions("COPY")
    assert len(copy) == 1 and "*requirements*.txt" in copy[0]["value"].split()
    installs = [c for c in shell_helpers["commands"]("\n".join(runtime_cf.runs())) if "pip" in c and "install" in c[c.index("pip") :]]
    assert len(installs) == 1
    install = installs[0]
    assert install[install.index("--constraint") + 1] == "${app}/constraints.txt"
    assert install[install.index("--requirement") + 1] == "${reqs}"


def test_runtime_labels_the_source_ref(runtime_cf):
    labels = runtime_cf.parser.labels
    assert labels["org.opencontainers.image.revision"] == "unknown"  # the ARG default
    assert labels["ml-dev-env.source-ref"] == "unknown"
    overridden = runtime_cf._parse({"SOURCE_REF": "abc123"})
    assert overridden.labels["ml-dev-env.source-ref"] == "abc123"


def test_runtime_does_not_change_user_entrypoint_or_env(runtime_cf):
    for name in ("USER", "ENTRYPOINT", "CMD", "ENV", "WORKDIR"):
        assert not runtime_cf.instructions(name), f"runtime stage must not set {name}"


def test_default_runtime_requirements_are_pinned_and_leave_torch_alone():
    lines = [
        line.strip() for line in (IMAGES / "runtime-requirements.txt").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert lines
    for line in lines:
        req = Requirement(line)
        assert str(req.specifier).startswith("=="), f"{line} is not pinned"
        assert req.name not in CUDA_BOUND
        assert not req.url


# --------------------------------------------------------------------------- shell syntax


@pytest.mark.parametrize("name", ["base_cf", "runtime_cf"])
def test_every_run_is_valid_posix_shell(name, request):
    dash = shutil.which("dash") or "/bin/sh"
    cf = request.getfixturevalue(name)
    for run in cf.runs():
        proc = subprocess.run([dash, "-n", "-c", run], capture_output=True, text=True)
        assert proc.returncode == 0, f"{proc.stderr}\n{run[:300]}"


def test_base_replaces_ngc_pip_constraints_with_its_own(base_cf, shell_helpers):
    """NGC >= 25.03 pins every package in /etc/pip/constraint.txt; NVIDIA's documented remedy
    is to change that file. The base keeps it aside and points it at its own freeze list
    before installing anything."""
    commands = shell_helpers["commands"](base_cf.run_with("constraint.txt.ngc"))
    move = ["mv", "/etc/pip/constraint.txt", "/etc/pip/constraint.txt.ngc"]
    link = ["ln", "-s", "/etc/ml-dev-env/constraints.txt", "/etc/pip/constraint.txt"]
    install = next(i for i, c in enumerate(commands) if "pip" in c and "install" in c)
    assert commands.index(move) < commands.index(link) < install
    assert commands[install][commands[install].index("--constraint") + 1] == ("/etc/ml-dev-env/constraints.txt")


# --------------------------------------------------------------------------- nccl-tests (fabric gate)


def test_base_builds_nccl_tests_with_mpi_from_a_pinned_tarball(base_cf, shell_helpers):
    args = base_cf.stage_args()
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["NCCLTESTS_VERSION"])
    assert re.fullmatch(r"[0-9a-f]{64}", args["NCCLTESTS_SHA256"])
    run = base_cf.run_with("NCCLTESTS_SHA256")
    commands = shell_helpers["commands"](run)
    download = next(c for c in commands if c[0] == "curl")
    assert download[-1] == "https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v${NCCLTESTS_VERSION}.tar.gz"
    out = download[download.index("-o") + 1]
    verify = commands.index(["sha256sum", "-c", "-"])
    extract = next(i for i, c in enumerate(commands) if c[0] == "tar" and out in c)
    assert verify < extract, "the tarball is verified before it is unpacked"
    make = next(c for c in commands if c[0] == "make")
    assert "MPI=1" in make, "multi-pod runs need the MPI build"
    assert "MPI_HOME=${mpi_home}" in make and "CUDA_HOME=${cuda_home}" in make
    install = next(c for c in commands if c[0] == "install" and "/usr/local/bin/" in c)
    assert "/tmp/nccl-tests/build/all_reduce_perf" in install
    # linked against MPI and NCCL, and the launcher and ib_write_bw are there at runtime
    assert ["ldd", "/usr/local/bin/all_reduce_perf"] in commands
    assert ["grep", "-q", "libmpi"] in commands and ["grep", "-q", "libnccl"] in commands
    assert ["command", "-v", "mpirun"] in commands and ["command", "-v", "ib_write_bw"] in commands


def test_base_nccl_tests_uses_the_images_mpi_or_apt_openmpi(base_cf, shell_helpers):
    run = base_cf.run_with("NCCLTESTS_SHA256")
    assert shell_helpers["apt"](run) == {"openmpi-bin", "libopenmpi-dev"}
    commands = shell_helpers["commands"](run)
    # OpenMPI from apt only when the base has none (the NGC image ships /usr/local/mpi)
    assert any(c[:3] == ["command", "-v", "mpicc"] for c in commands)
    assert "--showme:incdirs" in run, "MPI_HOME is derived from the OpenMPI compiler wrapper"


def test_base_installs_perftest_for_ib_write_bw(base_cf, shell_helpers):
    assert "perftest" in shell_helpers["apt"]("\n".join(base_cf.runs()))


def test_nccl_tests_pin_matches_the_parser_fixture_version():
    # the stubs print nccl-tests 2.17.6's format; the image must build that release
    from tests.podsim.nccl import nccl_report

    pin = re.search(r"ARG NCCLTESTS_VERSION=(\S+)", (Path(__file__).parents[2] / "images" / "base.Containerfile").read_text())
    assert pin, "base.Containerfile pins nccl-tests with ARG NCCLTESTS_VERSION=<version>"
    version = pin.group(1)
    assert f"# nccl-tests version {version} " in nccl_report(["a", "b"], 1, 1 << 20, 1 << 20, 1.0)
