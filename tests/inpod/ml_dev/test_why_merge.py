"""`ml-dev why`'s merge and sources without pods: Flight Recorder dumps and RAS status from fixtures with their provenance
(data/SOURCES.md), the verdict rules on sampler-shaped reports, the home page's section, the stack setting.

The sampler's own behaviour (py-spy, the kernel's refusal, the fan-out) is tested on simulated pods (test_why.py);
here the reports are built the way sampler.sample_pod writes them, from frames of the job data/barrier_job.py.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from inpod.home import page, why_view
from inpod.home.page import num
from inpod.ml_dev import collectives, sampler, watchdog, why
from stacks.config import StackConfig
from tests.conftest import stack_objects

DATA = Path(__file__).parent / "data"


def frame(name: str, line: int, lib: bool = False) -> dict[str, Any]:
    return {"name": name, "file": "socket.py" if lib else "barrier_job.py", "line": line, "lib": lib}


WAIT = [frame("barrier", 44), frame("main", 80)]
SERVE = [frame("socket.accept", 294, lib=True), frame("barrier", 29), frame("main", 80)]
STALL = [frame("stall_here", 16), frame("main", 78)]
WORK = [frame("work", 20), frame("main", 79)]


def report(pod: int, stacks: list[list[dict[str, Any]] | str], rank: str | None = None) -> dict[str, Any]:
    """One pod's report with one rank process sampled once per entry of `stacks` (a string: that py-spy error)."""
    samples = []
    for k, s in enumerate(stacks):
        if isinstance(s, str):
            samples.append({"error": s, "detail": f"{s} (test)", "proc": {"state": "S", "wchan": ""}, "at": k})
        else:
            samples.append({"threads": [{"name": "MainThread", "main": True, "idle": True, "frames": s}], "at": k})
    proc = {"pid": 100 + pod, "ppid": 10, "name": "python3", "rank": rank, "local_rank": None, "samples": samples}
    agents = [{"run": "r1", "processes": [proc]}]
    return {"pod": f"env-{pod}", "node": f"gpu-0{pod}", "node_rank": pod, "py_spy": "/usr/local/bin/py-spy", "agents": agents}


def test_a_straggler_is_named_when_it_holds_in_every_sample() -> None:
    reports = [report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), report(2, [STALL, STALL]), report(3, [WAIT, WAIT])]
    v = why.merge(reports)
    assert v["kind"] == "straggler" and why.EXIT_CODES[v["kind"]] == why.EXIT_STRAGGLER
    assert v["straggler"] == {
        "ranks": ["2"],
        "pod": "env-2",
        "node": "gpu-02",
        "frame": "stall_here (barrier_job.py:16)",
        "waiting_in": "barrier (barrier_job.py:44)",
    }
    assert v["text"].startswith("rank 2 (env-2, node gpu-02) is elsewhere: in stall_here (barrier_job.py:16); ranks 0–1, 3 wait in")


def test_one_odd_sample_is_never_a_straggler() -> None:
    """Rank 2 apart in the first sample only (it moved on): no straggler; one sample only: undecided."""
    moved = [report(0, [WORK, WORK]), report(1, [WORK, WORK]), report(2, [STALL, WORK]), report(3, [WORK, WORK])]
    assert why.merge(moved)["kind"] == "no-straggler"
    once = [report(0, [WAIT]), report(1, [WAIT]), report(2, [STALL]), report(3, [WAIT])]
    assert why.merge(once)["kind"] == "undecided"


def test_all_ranks_in_one_place_is_no_straggler_and_says_so() -> None:
    v = why.merge([report(i, [WAIT, WAIT]) for i in range(4)])
    assert v["kind"] == "no-straggler"
    assert v["text"] == "no straggler: ranks 0–3 are all in barrier (barrier_job.py:44) in every sample (stuck together, or idle there)"


def test_no_majority_without_a_straggler_is_no_straggler_and_an_unsampled_rank_undecided() -> None:
    split = [report(0, [WAIT, WORK]), report(1, [WORK, WAIT]), report(2, [WAIT, WORK]), report(3, [WORK, WAIT])]
    assert why.merge(split)["kind"] == "no-straggler"
    refused = [report(0, [WAIT, WAIT]), report(1, [WAIT, WAIT]), report(2, ["refused", "refused"]), report(3, [WAIT, WAIT])]
    v = why.merge(refused)
    assert v["kind"] == "undecided" and v["text"].endswith("not seen: rank 2 (py-spy refused)")
    assert "refused (test) for rank 2; stood in: process states from /proc (2 S), no stacks" in v["sources"]["py-spy"]


def test_nothing_sampled_names_the_refusal() -> None:
    v = why.merge([report(i, ["refused", "refused"]) for i in range(2)])
    assert v["kind"] == "nothing-sampled" and why.EXIT_CODES[v["kind"]] == why.EXIT_NOTHING
    assert v["sources"]["py-spy"].startswith("refused (test) for ranks 0–1; stood in")
    empty = why.merge([{"pod": "env-0", "agents": [], "py_spy": ""}])
    assert empty["text"] == "nothing could be sampled: no rank process found"
    assert "missing on env-0" in empty["sources"]["py-spy"]


def test_py_spy_that_cannot_run_is_named_not_no_rank() -> None:
    """py-spy present but failing on every rank (not executable for the pod's UID, a crash): the rank processes were
    found, so the verdict says they could not be sampled and the py-spy line gives py-spy's own words."""
    v = why.merge([report(i, ["failed", "failed"]) for i in range(2)])
    assert v["kind"] == "nothing-sampled" and v["text"].startswith("nothing could be sampled: no rank could be sampled; not seen: ")
    assert v["sources"]["py-spy"] == "failed for 2 process(es) (failed (test))", v["sources"]


def unreachable(pod: int) -> dict[str, Any]:
    """A pod whose report never came (why.sample_everywhere's shape)."""
    return {"pod": f"env-{pod}", "agents": [], "failed": "connection refused (no sshd listening on the pod)", "node_rank": pod}


def shell_rank(pod: int, samples: int = 2) -> dict[str, Any]:
    """A rank that is not Python: `bash -c '...; sleep 600'` (py-spy: not a Python process; /proc: state and wait)."""
    r = report(pod, ["not-python"] * samples)
    bash = r["agents"][0]["processes"][0]
    bash.update(name="bash")
    for x in bash["samples"]:
        x["proc"] = {"state": "S", "wchan": "do_wait"}
    sleep = json.loads(json.dumps(bash))
    sleep.update(pid=bash["pid"] + 1000, ppid=bash["pid"], name="sleep")
    for x in sleep["samples"]:
        x["proc"] = {"state": "S", "wchan": "hrtimer_nanosleep"}
    r["agents"][0]["processes"].append(sleep)
    return r


def test_a_pod_that_did_not_answer_makes_the_verdict_undecided_and_is_named() -> None:
    """Issue 45: the stalled rank's pod refuses SSH; the three ranks seen agree in the barrier. Not "no straggler":
    undecided (exit 4), the pod named with why, and py-spy is not said missing there (it was never asked)."""
    reports = [report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), report(2, [WAIT, WAIT]), unreachable(3)]
    v = why.merge(reports)
    assert v["kind"] == "undecided" and why.EXIT_CODES[v["kind"]] == why.EXIT_UNDECIDED, v["text"]
    assert v["text"].endswith("not seen: the ranks of env-3 (its pod did not answer)"), v["text"]
    assert v["not_seen"] == ["the ranks of env-3 (node rank 3): its pod did not answer: connection refused (no sshd listening on the pod)"]
    assert "missing" not in v["sources"]["py-spy"] and "not asked on env-3 (the pod did not answer)" in v["sources"]["py-spy"]


def test_a_rank_that_is_not_python_is_named_with_what_proc_tells() -> None:
    reports = [report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), shell_rank(2), report(3, [WAIT, WAIT])]
    v = why.merge(reports)
    assert v["kind"] == "undecided", v["text"]
    assert v["text"].endswith("not seen: rank 2 (not Python)"), v["text"]
    assert v["not_seen"] == [
        "rank 2 (env-2): not Python: bash (pid 102, state S, waiting in do_wait); children: sleep (pid 1102, state S, "
        "waiting in hrtimer_nanosleep); no Python process below it"
    ]
    assert "not used for rank 2 (not Python)" in v["sources"]["py-spy"]


def test_no_python_rank_at_all_is_undecided_naming_each() -> None:
    v = why.merge([shell_rank(i) for i in range(3)])
    assert v["kind"] == "undecided" and v["text"].startswith("undecided: no rank's stack could be sampled; not seen: rank 0"), v["text"]
    assert len(v["not_seen"]) == 3 and all("not Python: bash" in line for line in v["not_seen"])


def test_a_straggler_among_the_ranks_seen_is_still_named() -> None:
    reports = [report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), report(2, [STALL, STALL]), report(3, [WAIT, WAIT]), unreachable(4)]
    v = why.merge(reports)
    assert v["kind"] == "straggler" and v["straggler"]["ranks"] == ["2"], v["text"]
    assert v["text"].endswith("; not seen: the ranks of env-4 (its pod did not answer)"), v["text"]


def test_py_spy_missing_on_one_pod_only_is_named_there_and_undecided() -> None:
    missing = report(3, ["missing", "missing"])
    missing["py_spy"] = ""
    v = why.merge([report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), report(2, [WAIT, WAIT]), missing])
    assert v["kind"] == "undecided" and v["text"].endswith("not seen: rank 3 (no py-spy)"), v["text"]
    assert "missing on env-3 (" in v["sources"]["py-spy"] and "env-0" not in v["sources"]["py-spy"].split("missing on")[1]


def test_torchrun_launcher_processes_are_not_ranks() -> None:
    """torchrun (a Python process whose children are the rank's other Python processes) is left out of the comparison."""
    r = report(0, [WAIT, WAIT], rank="0")
    launcher = json.loads(json.dumps(r["agents"][0]["processes"][0]))
    launcher.update(pid=50, ppid=10, rank=None)
    launcher["samples"] = [{"threads": [{"name": "MainThread", "main": True, "frames": [frame("_poll", 1, lib=True)]}]}] * 2
    r["agents"][0]["processes"][0]["ppid"] = 50
    r["agents"][0]["processes"].insert(0, launcher)
    kept = [(w["label"], w["proc"]["pid"]) for w in why.workers([r])]
    assert kept == [("0", 100)]


def test_a_ranks_own_python_children_and_a_refused_shell_do_not_stand_for_it() -> None:
    """DataLoader workers share their rank's RANK: the rank's main process stands for it. Refused, a shell's child does."""
    r = report(1, [WAIT, WAIT], rank="1")
    main = r["agents"][0]["processes"][0]
    helper = dict(json.loads(json.dumps(main)), pid=300, ppid=main["pid"])
    helper["samples"] = [{"threads": [{"name": "MainThread", "main": True, "frames": [frame("_worker_loop", 3, lib=True)]}]}] * 2
    r["agents"][0]["processes"].append(helper)
    assert [w["proc"]["pid"] for w in why.workers([r])] == [main["pid"]]
    refused = report(2, ["refused", "refused"])
    shell = refused["agents"][0]["processes"][0]
    leaf = dict(json.loads(json.dumps(shell)), pid=400, ppid=shell["pid"])
    refused["agents"][0]["processes"].append(leaf)
    assert [w["proc"]["pid"] for w in why.workers([refused])] == [400]


@pytest.mark.parametrize("pickled", [False, True])
def test_flight_recorder_names_the_rank_that_did_not_enter_the_collective(tmp_path: Path, pickled: bool) -> None:
    dumps = {}
    for rank in range(4):
        data = json.loads((DATA / "fr" / f"rank-{rank}.json").read_text())
        path = tmp_path / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(data) if pickled else json.dumps(data).encode())
        summary = collectives.read_fr_dump(path)
        assert summary is not None
        dumps[str(rank)] = summary
    found = collectives.merge_fr(dumps)
    assert found == {
        "findings": [
            {
                "group": "0",
                "op": "all_reduce",
                "seq": 4812,
                "frame": {"name": "train_step", "file": "train.py", "line": 88},
                "behind": ["2"],
                "waiting": ["0", "1", "3"],
            }
        ]
    }
    # into the verdict: the collective first, with pod and node, then the stacks' view
    reports = [report(i, [WAIT, WAIT], rank=str(i)) for i in range(4)]
    for i, r in enumerate(reports):
        r["agents"][0]["processes"][0]["fr"] = {"status": "used", "dump": dumps[str(i)]}
    v = why.merge(reports)
    assert v["kind"] == "straggler" and v["straggler"]["ranks"] == ["2"] and v["straggler"]["pod"] == "env-2"
    assert v["text"].startswith(
        "rank 2 (env-2, node gpu-02) has not entered all_reduce #4812 of process group 0; "
        "ranks 0–1, 3 wait in it (train_step (train.py:88))"
    )
    assert v["sources"]["flight-recorder"] == "used: dumps of 4 rank(s)"


REAL_DUMPS = {
    # data/SOURCES.md: device runs on an NVIDIA H200, torch 2.11.0+cu130, NCCL 2.28.9; the job is data/devcap/train.py.txt
    "h200-pipe-dump-0": "scheduled",  # verbatim: written by the rank when ml-dev why's sampler wrote its pipe
    "h200-inprocess-dump-last20.pkl": None,  # _dump_nccl_trace() after the job's last step, its last 20 entries
}


def job_line(text: str) -> int:
    """The line of `text` in the device job's own source (data/devcap/train.py.txt), counted from 1."""
    lines = (DATA / "devcap" / "train.py.txt").read_text().splitlines()
    found = [i for i, line in enumerate(lines, 1) if line.strip() == text]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_real_flight_recorder_dumps_read_as_they_hold(name: str) -> None:
    """Dumps torch 2.11 wrote on a GPU: the expected summary comes from the pickle itself (a plain pickle load), per
    process group the furthest completed collective and the furthest one entered but not completed, with the job's own
    innermost frame."""
    path = DATA / "fr" / name
    raw = path.read_bytes()
    held = pickle.loads(raw)
    # the safe unpickler takes the real thing (protocol 2, tuples for process_group, None, bools, 64-bit ints) whole
    assert collectives._PlainUnpickler(io.BytesIO(raw)).load() == held
    assert isinstance(held["entries"][0]["process_group"], tuple) and held["entries"][0]["time_discovered_started_ns"] is None
    states = {e["state"] for e in held["entries"]}
    assert states <= {"scheduled", "started", "completed"}, states
    summary = collectives.read_fr_dump(path)
    assert summary is not None and summary["version"] == held["version"]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for e in held["entries"]:
        by_group.setdefault(e["process_group"][0], []).append(e)
    assert sorted(summary["groups"]) == sorted(by_group)
    for pg, entries in by_group.items():
        got = summary["groups"][pg]
        assert got["completed"] == max(e["collective_seq_id"] for e in entries if e["state"] == "completed")
        open_ = [e for e in entries if e["state"] != "completed"]
        if not open_:
            assert got["entered"] is None
            continue
        last = max(open_, key=lambda e: e["collective_seq_id"])
        own = next(f for f in last["frames"] if f["filename"].endswith("/train.py"))  # the job's file, innermost first
        assert got["entered"] == {
            "seq": last["collective_seq_id"],
            "op": last["profiling_name"].split(":")[-1],
            "state": last["state"],
            "frame": {"name": own["name"], "file": "train.py", "line": own["line"]},
        }
    # what the capture saw (data/SOURCES.md): the pipe dump holds an all_reduce still scheduled from train_step, at the
    # line of the job's all_reduce call; the in-process dump, taken after the last step, nothing open
    entered = summary["groups"]["0"]["entered"]
    if REAL_DUMPS[name] is None:
        assert entered is None
    else:
        assert entered["state"] == REAL_DUMPS[name] and entered["op"] == "all_reduce"
        assert entered["frame"] == {"name": "train_step", "file": "train.py", "line": job_line("dist.all_reduce(y)")}
    # two ranks at the same place: nobody is behind
    assert collectives.merge_fr({"0": summary, "1": summary}) == {"findings": []}


def test_a_pickle_naming_a_class_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "dump"
    path.write_bytes(pickle.dumps({"entries": [], "x": Path("/")}))
    assert collectives.read_fr_dump(path) is None


def test_ras_status_fixtures_parse() -> None:
    healthy = collectives.parse_ras((DATA / "ras" / "healthy.txt").read_text())
    assert healthy["communicators"] == [{"group": 0, "comms": 8, "ranks": 32, "status": "RUNNING", "errors": "OK"}]
    assert collectives.ras_words(healthy).startswith("8 communicator(s) RUNNING, no errors")
    bad = collectives.parse_ras((DATA / "ras" / "incomplete.txt").read_text())
    assert bad["communicators"][0]["errors"] == "INCOMPLETE"
    words = collectives.ras_words(bad)
    assert words.startswith("group 0: RUNNING INCOMPLETE (") and "The missing rank: 21" in words
    assert "Process 3487984 on node 172.16.64.213 managing GPU 5" in words


def ras_answering(text: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """ask_ras against a stand-in RAS thread on a real socket that answers `text`: the answer and what it was asked."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    asked: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        asked.append(conn.recv(100))
        conn.sendall(text)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        answer = collectives.ask_ras(f"127.0.0.1:{server.getsockname()[1]}", timeout=10)
    finally:
        t.join(10)
        server.close()
    return answer, asked


def test_real_ras_status_of_an_h200_job() -> None:
    """NCCL 2.28.9's own answer to `VERBOSE STATUS` (data/SOURCES.md): the expected row is the table's line as the text
    holds it (columns: group, comms in group, nodes per comm, ranks per node, ranks per comm, ranks in group, status,
    errors); its Errors and Warnings sections are empty."""
    raw = (DATA / "ras" / "h200-verbose-status.txt").read_bytes()
    text = raw.decode()
    lines = text.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("Communicators")) : lines.index("Errors")]
    rows = [line.split() for line in table if line.split() and line.split()[0].isdigit()]
    want: list[dict[str, Any]] = [
        {"group": int(r[0]), "comms": int(r[1]), "ranks": int(r[5]), "status": r[6], "errors": r[7]} for r in rows
    ]
    # each section's lines below its underline
    errors = [x.strip() for x in lines[lines.index("Errors") + 2 : lines.index("Warnings")] if x.strip()]
    warnings = [x.strip() for x in lines[lines.index("Warnings") + 2 :] if x.strip()]
    parsed = collectives.parse_ras(text)
    assert parsed == {"communicators": want, "errors": errors, "warnings": warnings}
    assert want and errors == [] and parsed["warnings"] == []  # a healthy one-rank job, as the capture ran it
    total = sum(r["comms"] for r in want)
    assert collectives.ras_words(parsed) == (
        f"{total} communicator(s) RUNNING, no errors (RAS sees no fault: a hang inside the job is still possible)"
    )
    answer, asked = ras_answering(raw)  # the same bytes over the socket, as the pod's sampler asks
    assert asked == [b"VERBOSE STATUS\n"] and answer["status"] == "used" and answer["parsed"] == parsed


def test_ras_over_its_socket_and_silent_when_nothing_listens() -> None:
    """The plain-text protocol on a real socket (a stand-in RAS thread answering the documented status)."""
    answer, asked = ras_answering((DATA / "ras" / "incomplete.txt").read_bytes())
    assert asked == [b"VERBOSE STATUS\n"] and answer["status"] == "used"
    assert answer["parsed"]["communicators"][0]["errors"] == "INCOMPLETE"
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert collectives.ask_ras(f"127.0.0.1:{port}")["status"] == "silent"


def test_home_page_card_shows_the_live_runs_last_verdict_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, workspace = tmp_path / "state", tmp_path / "ws"
    monkeypatch.setenv(contract.STATE_DIR_ENV, str(state))
    monkeypatch.setenv("ML_DEV_WORKSPACE", str(workspace))
    monkeypatch.setenv("POD_NAME", "env-0")
    runs = Path(contract.records_dir(str(workspace), "env")) / contract.RUNS_SUBDIR
    now = time.time()
    (state / contract.HEARTBEAT_DIR).mkdir(parents=True)
    (state / contract.HEARTBEAT_DIR / "run-1.json").write_text(json.dumps({"run": "r-live", "alive_at": now}))
    (state / contract.HEARTBEAT_DIR / "run-2.json").write_text(json.dumps({"run": "r-ended", "alive_at": now - 600}))
    assert why_view.why_html(now, num) == ""  # a live run without a verdict: no card
    evil = "<script>alert(1)</script>"
    straggler = {"ranks": ["2"], "pod": "env-2", "node": evil, "frame": evil}
    verdict = {"kind": "straggler", "time": now - 90, "text": f"rank 2 in {evil}", "straggler": straggler}
    for run in ("r-live", "r-ended"):
        (runs / run / "why").mkdir(parents=True)
        (runs / run / contract.WHY_LATEST).write_text(json.dumps({"verdict": verdict}))
    html = why_view.why_html(now, num)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<span class="why-rank"><span data-k="why-rank">2</span></span>' in html
    assert '<span data-k="why-pod">env-2</span>' in html and '<span data-k="why-age">90 s ago</span>' in html
    assert "r-ended" not in html and html.count('class="why ') == 1
    # every digit of the card is a marked value (the page's rule, tests/inpod/home/numbers.py)
    assert not re.search(r"\d", re.sub(r'<span data-k="[^"]*">[^<]*</span>|<[^>]*>', "", html))
    (state / contract.HEARTBEAT_DIR / "run-1.json").unlink()
    assert why_view.why_html(now, num) == ""
    # the page's table carries the card
    assert any(s.name == "why" for s in page.SECTIONS)


def test_home_page_card_shows_an_undecided_verdict_and_the_ranks_not_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, workspace = tmp_path / "state", tmp_path / "ws"
    monkeypatch.setenv(contract.STATE_DIR_ENV, str(state))
    monkeypatch.setenv("ML_DEV_WORKSPACE", str(workspace))
    now = time.time()
    (state / contract.HEARTBEAT_DIR).mkdir(parents=True)
    (state / contract.HEARTBEAT_DIR / "run-1.json").write_text(json.dumps({"run": "r-live", "alive_at": now}))
    monkeypatch.setenv("POD_NAME", "env-0")  # the environment `env`: its records folder (contract.records_dir)
    v = why.merge([report(0, [SERVE, SERVE]), report(1, [WAIT, WAIT]), shell_rank(2), unreachable(3)])
    runs = Path(contract.records_dir(str(workspace), "env")) / contract.RUNS_SUBDIR
    (runs / "r-live" / "why").mkdir(parents=True)
    (runs / "r-live" / contract.WHY_LATEST).write_text(json.dumps({"verdict": v}))
    html = why_view.why_html(now, num)
    assert 'class="why neutral"' in html and "</code>: undecided <" in html, html
    unseen = re.findall(r'<li class="why-unseen"><span data-k="why-unseen">([^<]*)</span></li>', html)
    assert [u.split(":")[0] for u in unseen] == ["rank 2 (env-2)", "the ranks of env-3 (node rank 3)"], html
    assert "not Python: bash" in unseen[0] and "its pod did not answer" in unseen[1]


def test_stall_setting_renders_and_rejects_what_cannot_work() -> None:
    objects = stack_objects("barcelona")
    assert StackConfig.model_validate(objects).lifecycle.stall_verdict_seconds == contract.STALL_DEFAULT
    for good in (0, contract.STALL_MIN, 86400):
        objects.setdefault("lifecycle", {})["stallVerdictSeconds"] = good
        assert StackConfig.model_validate(objects).lifecycle.stall_verdict_seconds == good


def test_rank_env_keeps_the_jobs_own_flight_recorder_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "STATE_DIR", tmp_path)
    mine = watchdog.rank_env("r1", "env-0", {})
    assert mine[contract.RUN_ID_ENV] == "r1" and mine[contract.PROGRESS_FILE_ENV] == str(tmp_path / "runs" / "r1" / "progress")
    assert mine["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].startswith(str(tmp_path / "runs" / "r1"))
    # the dump file under both names, one value: the new name for torch that reads it, the old for older torch
    assert mine["TORCH_FR_DUMP_TEMP_FILE"] == mine["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "runs" / "r1" / "fr-dump-")
    for own in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        theirs = watchdog.rank_env("r1", "env-0", {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/p", own: "/x/d"})
        assert not {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} & set(theirs), theirs
    # where the sampler looks for a rank's dump: the new name first, as torch reads it
    assert sampler.dump_prefix(mine) == mine["TORCH_FR_DUMP_TEMP_FILE"]
    assert sampler.dump_prefix({"TORCH_FR_DUMP_TEMP_FILE": "/n/", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/o/"}) == "/n/"
    assert sampler.dump_prefix({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/o/"}) == "/o/"


def test_progress_relay_marks_each_touch_of_the_progress_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The rank agent's relay: a touch of $ML_DEV_PROGRESS_FILE becomes one mark on its stderr (the launcher swallows it)."""
    path = tmp_path / "progress"
    relay = watchdog.ProgressRelay(str(path))
    relay.start()
    try:
        time.sleep(watchdog.POLL_SECONDS * 1.5)
        assert watchdog.PROGRESS_MARK not in capfd.readouterr().err  # nothing touched yet
        path.write_text("")
        deadline = time.monotonic() + 30
        seen = ""
        while watchdog.PROGRESS_MARK not in seen:
            assert time.monotonic() < deadline, "no mark after the touch"
            time.sleep(0.2)
            seen += capfd.readouterr().err
        assert seen.count(watchdog.PROGRESS_MARK) == 1
    finally:
        relay.stop.set()
        relay.join(10)


def test_watchdog_fires_once_per_stall_and_progress_rearms_it() -> None:
    fired: list[float] = []
    out = io.StringIO()
    dog = watchdog.Watchdog(1, lambda: fired.append(time.monotonic()), out)
    dog.start()
    try:
        deadline = time.monotonic() + 30
        while not fired:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(watchdog.POLL_SECONDS * 3)
        assert len(fired) == 1, "one verdict per stall"
        dog.progress()  # an output line or a progress mark: a later stall gets its own verdict
        while len(fired) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        dog.stop.set()
        dog.join(10)
    assert out.getvalue().count("no progress for") == 2


def test_a_job_kept_under_a_folder_named_torch_keeps_its_own_frame() -> None:
    """The frame shown is the first one outside installed packages, not the first without 'torch/' in its path: a
    user's checkout may well be ~/torch/ (a fork of PyTorch's examples, say)."""
    frames = [
        {"name": "all_reduce", "filename": "/opt/app/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", "line": 3068},
        {"name": "train_step", "filename": "/workspace/torch/train.py", "line": 88},
    ]
    entry = {"process_group": ["0", "default_pg"], "collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "state": "started"}
    entry["frames"] = frames
    summary = collectives.summarise_fr({"version": "2.10", "entries": [entry]})
    assert summary["groups"]["0"]["entered"]["frame"] == {"name": "train_step", "file": "train.py", "line": 88}
