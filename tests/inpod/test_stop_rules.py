"""What the docs promise about stops, held to the code and the stop matrix (no root needed).

* docs/use/suspend-and-idle.md's "Every stop, every launcher" table has exactly the matrix's stops and launchers
  (tests/podsim/test_stop_matrix.py runs each cell); every page that shows `deepspeed --hostfile` says its ranks
  get no checkpoint signal.
* `ml-dev run` warns at launch when torchrun or DeepSpeed's launcher would cap a grace above 30 s.
* The 30 s the docs, the warning and the launcher stand-ins use is one number.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inpod import contract as pod_contract
from inpod.ml_dev import launch as ml_dev_launch
from tests.podsim import stopjob
from tests.podsim.test_stop_matrix import DOCS_COLUMNS, LAUNCHERS, STOP_LABELS, STOPS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "use" / "suspend-and-idle.md"


def table() -> list[list[str]]:
    text = DOC.read_text()
    block = text.split("<!-- stop-matrix -->", 1)[1].split("<!-- /stop-matrix -->", 1)[0]
    rows = [line for line in block.strip().splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows if not set(row) <= set("|- ")]


def test_the_docs_table_is_the_matrix() -> None:
    header, *rows = table()
    assert header[1:] == [f"`{DOCS_COLUMNS[name]}`" for name in [*LAUNCHERS, "deepspeed"]]
    assert [row[0] for row in rows] == [STOP_LABELS[stop] for stop in STOPS]
    for row in rows:
        assert len(row) == len(header), row
        assert all(cell.startswith(("saves", "the others save")) for cell in row[1:4]), row
        # the DeepSpeed column: the pinned behaviour (test_deepspeed_hostfile_ranks_get_no_signal)
        assert row[4] in ("**no signal, nothing saved**", "not an `ml-dev` job"), row
    torchrun = header.index(f"`{DOCS_COLUMNS['torchrun']}`")
    assert all("30 s cap" in row[torchrun] for row in rows if row[0] != STOP_LABELS["rank-fails"])


def test_every_page_showing_deepspeed_hostfile_says_it_gets_no_signal() -> None:
    pages = [p for p in (REPO / "docs").rglob("*.md") if "deepspeed --hostfile" in p.read_text()]
    assert DOC in pages and len(pages) >= 3
    for page in pages:
        text = re.sub(r"\s+", " ", page.read_text())
        assert "no checkpoint signal" in text or "no signal, nothing saved" in text, page


@pytest.mark.parametrize(
    "command",
    [
        ["torchrun", "train.py"],
        ["/opt/venv/bin/torchrun", "--nproc-per-node=8", "train.py"],
        ["python", "-m", "torch.distributed.run", "train.py"],
        ["python", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"],
        ["deepspeed", "--hostfile", "hf", "train.py"],
        ["bash", "-c", "cd x && torchrun train.py"],
    ],
)
def test_launchers_with_a_30_s_cap_warn_above_30_s(command: list[str]) -> None:
    warning = ml_dev_launch.launcher_cap_warning(command, 120)
    assert warning is not None and warning.startswith("ml-dev: warning: ")
    assert "30 s" in warning and "checkpointGraceSeconds is 120 s" in warning
    assert ml_dev_launch.launcher_cap_warning(command, 30) is None  # the grace fits: nothing to say


@pytest.mark.parametrize("command", [["python", "train.py"], ["./train.sh"], ["python3", "-m", "mypkg.torchrunner"]])
def test_other_commands_do_not_warn(command: list[str]) -> None:
    assert ml_dev_launch.launcher_cap_warning(command, 3600) is None


def test_the_30_s_cap_is_one_number() -> None:
    cap = ml_dev_launch.LAUNCHER_CAP_SECONDS
    assert cap == 30
    assert f"def close(death_sig, timeout={cap}):" in stopjob.TORCHRUN
    assert f"end = time.monotonic() + {cap}" in stopjob.DEEPSPEED_LAUNCH
    text = re.sub(r"\s+", " ", DOC.read_text())
    assert f"`PContext.close(death_sig, timeout={cap})`" in text
    assert f"warns at launch: `ml-dev: warning: torchrun gives its workers {cap} s" in text


def test_the_stop_facts_are_the_contracts() -> None:
    assert ml_dev_launch.STOPPED_STATUS == pod_contract.RUN_STOPPED_STATUS
    marker = pod_contract.STOPPING_MARKER
    # the shell reads the marker's name from contract.env (inpod/contract.py shell_env), never spells it
    assert 'date +%s >"$STATE_DIR/$CONTRACT_STOPPING_MARKER"' in (REPO / "inpod" / "sh" / "checkpoint_stop.sh").read_text()
    assert f"CONTRACT_STOPPING_MARKER='{marker}'" in pod_contract.shell_env().splitlines()
    assert "(STATE_DIR / contract.STOPPING_MARKER).exists()" in (REPO / "inpod" / "ml_dev" / "launch.py").read_text()


def test_a_stopped_job_exits_143_as_the_docs_say() -> None:
    assert ml_dev_launch.STOPPED_STATUS == 143
    text = re.sub(r"\s+", " ", DOC.read_text())
    assert "exits **143** with `ml-dev: STOPPED: pod <pod> is stopping (SIGTERM from its stop hook); …`" in text


def test_ml_dev_run_help_names_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    from inpod.ml_dev import main as ml_dev

    with pytest.raises(SystemExit):
        ml_dev.main(["run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "130 after Ctrl-C," in shown and f"{ml_dev_launch.STOPPED_STATUS} after SIGTERM or when a pod's stop" in shown, shown
    for code, _, _ in ml_dev_launch.RUN_EXIT_STATUSES:  # every status the docs' table has (issue 45)
        assert not code.isdigit() or int(code) < 3 or re.search(rf"\b{code}\b", shown), (code, shown)


def run_rank(tmp_path: Path, script: str, *flags: str) -> tuple[int, float, int, str]:
    """`ml-dev _rank` (the real agent, this machine) running `bash -c script`, which prints a PID it leaves behind;
    returns the agent's status, its seconds, that PID and the agent's stderr."""
    import os
    import subprocess
    import sys
    import time

    from tests.inpod import mount

    env = {**os.environ, "ML_DEV_STATE_DIR": str(tmp_path), "ML_DEV_CHECKPOINT_GRACE_SECONDS": "2"}
    argv = [sys.executable, str(mount.shipped() / "ml-dev"), "_rank", "--no-stdin-watch", *flags, "--cwd", str(tmp_path), "--"]
    t0 = time.monotonic()
    # files, not pipes: a pipe would stay open in what the script leaves running
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        run = subprocess.run(
            [*argv, "bash", "-c", script], env=env, stdout=out, stderr=err, timeout=60, stdin=subprocess.DEVNULL, check=False
        )
    seconds = time.monotonic() - t0
    return run.returncode, seconds, int((tmp_path / "out").read_text().split()[-1]), (tmp_path / "err").read_text()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    "script",
    [
        "sleep 30 & echo $!",  # a background process of the rank's group
        "setsid bash -c 'echo $$; exec sleep 30' & sleep 0.5",  # one in a session of its own (torchrun's workers)
        "trap '' TERM; (trap '' TERM; exec sleep 30) & echo $!",  # one that ignores the checkpoint signal
    ],
    ids=["group", "own-session", "ignores-sigterm"],
)
def test_what_a_ranks_command_leaves_behind_is_stopped(tmp_path: Path, script: str) -> None:
    code, seconds, pid, err = run_rank(tmp_path, script)
    try:
        assert code == 0 and not alive(pid), (code, pid, err)
        assert seconds < 30, seconds  # stopped, not waited out
        # the checkpoint signal first; SIGKILL only for what ignores it, at the grace
        assert ("still running after 2 s: killed" in err) == ("trap ''" in script), err
    finally:
        if alive(pid):
            import os

            os.kill(pid, 9)


def test_ml_dev_exec_leaves_a_background_process_alone(tmp_path: Path) -> None:
    code, _, pid, _ = run_rank(tmp_path, "setsid bash -c 'echo $$; exec sleep 30' & sleep 0.5", "--leave-rest")
    try:
        assert code == 0 and alive(pid)
    finally:
        import os

        os.kill(pid, 9)


@pytest.mark.parametrize(
    "command, label, cap",
    [
        (["accelerate", "launch", "--multi_gpu", "train.py"], "accelerate launch", 30),
        (["mpirun", "-np", "8", "python", "train.py"], "mpirun (Open MPI)", 1),
        (["/usr/bin/mpiexec", "-n", "2", "./a.out"], "mpirun (Open MPI)", 1),
        (["bash", "-c", "accelerate launch train.py"], "accelerate launch", 30),
    ],
)
def test_every_launcher_with_a_cap_is_named_with_its_cap_and_source(command: list[str], label: str, cap: int) -> None:
    warning = ml_dev_launch.launcher_cap_warning(command, 120)
    assert warning is not None and warning.startswith(f"ml-dev: warning: {label}"), warning
    assert f"gives its workers {cap} s after the stop signal, then SIGKILL" in warning and "upstream: " in warning, warning
    assert ml_dev_launch.launcher_cap_warning(command, cap) is None


@pytest.mark.parametrize(
    "script, command, label, line",
    [
        ('#!/bin/bash\ncd "$(dirname "$0")"\ntorchrun --nproc-per-node=8 train.py "$@"\n', ["./train.sh"], "torchrun", 3),
        ("#!/bin/sh\nexec deepspeed train.py --deepspeed ds.json\n", ["sh", "run.sh"], "DeepSpeed's launcher", 2),
        ("#!/bin/bash\n# mpirun is not used here\npython3 -m torch.distributed.run train.py\n", ["bash", "-e", "go.sh"], "torchrun", 3),
        ("#!/bin/bash\nmpirun -np 8 python train.py\n", ["./mpi.sh", "--fast"], "mpirun (Open MPI)", 2),
    ],
)
def test_a_launcher_inside_a_script_is_named_with_its_line(tmp_path: Path, script: str, command: list[str], label: str, line: int) -> None:
    name = next(c for c in command if c.endswith(".sh"))
    (tmp_path / name).write_text(script)
    warning = ml_dev_launch.launcher_cap_warning(command, 120, tmp_path)
    assert warning is not None and warning.startswith(f"ml-dev: warning: {label} gives its workers"), warning
    assert f"(in {Path(name).name}, line {line})" in warning, warning


def test_a_script_without_a_launcher_and_a_comment_naming_one_do_not_warn(tmp_path: Path) -> None:
    (tmp_path / "train.sh").write_text("#!/bin/bash\n# we used to run torchrun here\npython3 train.py\n")
    assert ml_dev_launch.launcher_cap_warning(["./train.sh"], 3600, tmp_path) is None
