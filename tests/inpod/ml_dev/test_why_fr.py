"""`ml-dev why`'s pod side asks every torch rank for its Flight Recorder dump at once and waits long enough, without torch.

A real rank takes seconds to write its dump after its pipe is written (4.3 s on the H200 run, data/SOURCES.md), so the
sampler asks all ranks of its pod first, in threads, and reads the dumps while py-spy samples (sampler.sample_pod,
FR_WAIT_SECONDS). The ranks here are stand-ins (data/fake_fr_rank.py): Python processes that map a "libtorch" file, make
the dump FIFO `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><RANK>.pipe` and write their dump (the real GPU dumps of data/fr/) only
once both ranks' pipes were written. A sampler that asked one rank after another would get no dump from the first:
the test checks both dumps were used, and that asking one rank alone gets none (the barrier holds). Nothing is timed.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inpod import contract
from inpod.ml_dev import collectives, sampler

pytestmark = pytest.mark.timeout(240)

DATA = Path(__file__).parent / "data"
FAKE = DATA / "fake_fr_rank.py"
SOURCES = [DATA / "fr" / "h200-pipe-dump-0", DATA / "fr" / "h200-inprocess-dump-last20.pkl"]
"""The dump each stand-in rank writes (rank = index): real torch 2.11 dumps."""
PY_SPY = Path(sys.executable).parent / "py-spy"
AGENT = """
import os, subprocess, sys
fake, directory, library, *sources = sys.argv[1:]
kids = [
    subprocess.Popen([sys.executable, fake, directory, str(len(sources)), library, src], env=dict(os.environ, RANK=str(r)))
    for r, src in enumerate(sources)
]
for kid in kids:
    kid.wait()
"""
"""The rank agent (as `ml-dev _rank` is): its children are the ranks; it leads a session, so its process group is theirs."""


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def wait_for(paths: list[Path], agent: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert agent.poll() is None, f"the stand-in ranks ended (rc {agent.returncode})"
        assert time.monotonic() < deadline, f"not there after {timeout} s: {[p.name for p in paths if not p.exists()]}"
        time.sleep(0.1)


def test_dumps_of_all_torch_ranks_are_asked_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, work = tmp_path / "state", tmp_path / "ranks"
    (state / contract.HEARTBEAT_DIR).mkdir(parents=True)
    work.mkdir()
    library = work / "libtorch_cuda.so"  # any file whose path names libtorch, mapped by each stand-in
    library.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(sampler, "STATE_DIR", state)  # common.STATE_DIR is read at import; the sampler uses its copy
    if PY_SPY.exists():
        monkeypatch.setenv("ML_DEV_PY_SPY", str(PY_SPY))
    env = dict(
        os.environ,
        TORCH_FR_BUFFER_SIZE="2000",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(work / "fr-pipe-"),
        TORCH_FR_DUMP_TEMP_FILE=str(work / "fr-dump-"),
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(work / "fr-dump-"),
        NCCL_RAS_ADDR=f"127.0.0.1:{closed_port()}",  # the pod's RAS is asked where the ranks say: nothing listens
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(FAKE), str(work), str(library), *map(str, SOURCES)],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for([work / f"ready-{r}" for r in range(len(SOURCES))], agent)
        ranks = {r: int((work / f"ready-{r}").read_text()) for r in range(len(SOURCES))}
        assert all(sampler.torch_loaded(pid) for pid in ranks.values()), "the stand-ins look like torch ranks to the sampler"
        beat = {"pid": agent.pid, "pgid": agent.pid, "run": "r-fr", "launcher": "test"}
        (state / contract.HEARTBEAT_DIR / f"rank-{agent.pid}.json").write_text(json.dumps(beat))

        report = sampler.sample_pod("r-fr", 2, 1.0)

        procs = {p["pid"]: p for a in report["agents"] for p in a["processes"]}
        assert sorted(procs) == sorted(ranks.values()), report
        for rank, pid in ranks.items():
            got = procs[pid]
            assert got["rank"] == str(rank) and len(got["samples"]) == 2
            want = collectives.summarise_fr(pickle.loads(SOURCES[rank].read_bytes()))
            assert got.get("fr") == {"status": "used", "rank": rank, "dump": want}, f"rank {rank}: {got.get('fr')}"
        # each rank was asked once, and only then did both dump: the asks overlapped
        assert sorted(p.name for p in work.glob("asked-*")) == ["asked-0-1", "asked-1-1"]
        assert report["ras"]["status"] == "silent", report["ras"]
        assert "TORCH_" not in json.dumps(report) and str(work / "fr-pipe-") not in json.dumps(report)  # no env values

        # the barrier holds: one rank asked alone (a sampler asking rank after rank) gets no dump within the bound
        monkeypatch.setattr(sampler, "FR_WAIT_SECONDS", 2)
        values = sampler.environ_of(ranks[0])
        assert values is not None
        alone = sampler.trigger_fr(ranks[0], values)
        assert alone == {"status": "failed", "detail": "no dump within 2 s of writing its pipe"}, alone
        assert (work / "asked-0-2").exists() and not (work / "asked-1-2").exists()
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(30)
