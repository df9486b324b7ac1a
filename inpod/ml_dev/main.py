"""ml-dev: run one command on every pod of an ml-dev-env stack, from any pod.

    ml-dev run -- torchrun train.py        sync the tree, start on every pod, stream, stop all on failure
    ml-dev run --debug 1 -- python x.py    rank 1's Python waits for a debugger on 127.0.0.1:5678 of its pod
                                           (--debug-host pod: on the pod IP, for a debugger in another pod)
    ml-dev sync                            sync the working tree to every pod (no-op on shared storage)
    ml-dev exec -- nvidia-smi              run on every pod, output prefixed by rank
    ml-dev pip install x==1.2              install once: pip on every pod (once into a shared venv); logged
    ml-dev freeze                          pin what was installed on top of the image in images/runtime-requirements.txt
    ml-dev status                          pods, reachability, ranks, GPUs, RDMA devices, SSH sessions, idle agent's view
    ml-dev status --all                    every environment of the namespace: owner, size, state, GPU-hours 7 days
    ml-dev status --start                  the start ledger: each pod's phases from creation to its first rank
    ml-dev why                             which rank of the running job is stuck, and where (every rank's stack)
    ml-dev logs [RUN] [--rank N] [-f]      a run's output, kept by every rank's agent on its pod (no nohup needed)
    ml-dev ranks start|exec|status|stop    warm ranks: one Python per GPU that stays, cells run in every rank's namespace

Delivered by the stack in the <app>-startup ConfigMap (mounted at /opt/ml-dev-env), so it works in any
image with Python 3.8+, OpenSSH and rsync. Reads the rank contract only: $ML_DEV_STATE_DIR/rank.env
(ML_DEV_HOSTS, ML_DEV_PODS, NODE_RANK, ...), written by the startup script; never computes ranks.
The pods talk over the stack's SSH fabric (sshd.sh): $ML_DEV_STATE_DIR/ssh/client.conf.

The synced tree: the git top level of the current directory (else the current directory), without
.gitignore'd paths (git's own rules) and without paths matching `.ml-devignore` at the tree root
(gitignore-style globs: `name`, `dir/`, `/anchored`, `*.ext`). Its hash is sha256 over the sorted
(path, mode, sha256 of content) of every file. Files the launcher synced earlier and that are gone now
are deleted on the other pods; files created on the other pods are never touched.

Activity records: while a run is alive, $ML_DEV_STATE_DIR/heartbeat/run-<pid>.json (on the launching pod)
and rank-<pid>.json (on every pod running a rank) are rewritten every 10 s and removed at the end.

The program is split at its seams, modules shipped next to it in the same ConfigMap (inpod.SHIPPED):
common (paths, rank contract, environment rule, the pods), sync (the synced tree and the sync), fanout (its copy),
launch (run, exec and the per-pod `_rank`), status and why (sampler, collectives, watchdog); this file holds the command line.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import DEBUG_PORT, FROM_RANK_FILE, HERE, PER_POD_ENV
from .fanout import cmd_relay
from .install import cmd_freeze, cmd_pip
from .launch import cmd_exec, cmd_rank, cmd_run
from .logs import cmd_log_here, cmd_logs
from .ranks import COMMANDS as RANKS_COMMANDS
from .ranks import main as ranks_main
from .ranks import refuse_run
from .status import cmd_status
from .sync import cmd_apply, cmd_check, cmd_sync
from .watchdog import WHY_LAUNCHER

ENV_RULE = (
    "Environment of every rank: the pod's container env, its rank.env (NODE_RANK, NNODES, MASTER_ADDR, ...),\n"
    "then every variable of this shell that differs from the container env (an activated venv's PATH,\n"
    "NCCL_DEBUG=..., HF_*, CUDA_VISIBLE_DEVICES, ...), sent over the SSH session's stdin, never argv;\n"
    "then each --env K=V (any key). Never carried (they differ per pod): " + " ".join(PER_POD_ENV) + ";\n"
    "nor the rank keys, which every rank reads from its own pod's current rank.env (a shell's copy is\n"
    "stale after a count change): " + " ".join(FROM_RANK_FILE) + ".\n"
    "Last, the keys of env.secrets, from each pod's own Secret mount: never from this shell, never --env\n"
    "(a value in argv is readable by every process of the pod); a key missing on any pod stops the launch."
)

EXIT_RULE = (
    "Exit status: 0 when every rank exited 0; a failed rank's status (every other rank stopped); 129 after SIGHUP\n"
    "(terminal closed), 130 after Ctrl-C, 143 after SIGTERM or when a pod's stop (drain, eviction, rolling update,\n"
    "scale to 0) reached a rank, 141 when its output's reader went away: each time every rank got the checkpoint\n"
    "signal and the grace. Several events: the first decides, each is named. A SIGKILLed `ml-dev run` (137) stops\n"
    "nothing itself: the rank agents stop their ranks the same way. Each rank's output is also in its run log on\n"
    "its pod's workspace: `ml-dev logs`, so nohup or a background launch is never needed.\n"
    "1 when no rank started: a pod unreachable, a sync problem, or ranks whose environments differ (the drift gate:\n"
    "interpreter, packages, CUDA/NCCL libraries, PYTHONPATH, sys.path; --allow-drift starts them anyway)."
)


def run_unless_warm(args: argparse.Namespace) -> int:
    """`ml-dev run`, refused on GPUs that warm ranks hold (ranks.refuse_run says how to stop them)."""
    refuse_run()
    return cmd_run(args)


def environment_commands(sub: argparse._SubParsersAction, run: argparse.ArgumentParser) -> None:
    """`ml-dev run --allow-drift` (inpod/ml_dev/envgate.py), `ml-dev pip` and `ml-dev freeze` (inpod/ml_dev/install.py):
    one environment on every rank."""
    run.add_argument(
        "--allow-drift",
        action="store_true",
        help="start the ranks even when their environments differ (interpreter, packages, CUDA/NCCL libraries, "
        "PYTHONPATH, sys.path); the run's record says so",
    )
    pip = sub.add_parser(
        "pip",
        help="run one pip command for the whole environment: on every pod (or once, into a folder on shared storage); logged",
    )
    pip.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod to be reachable (60)")
    pip.add_argument("words", nargs=argparse.REMAINDER, metavar="PIP-ARGS")
    freeze = sub.add_parser("freeze", help="write what was installed on top of the image into the runtime image's requirements")
    freeze.add_argument("--output", metavar="FILE", help="the requirements file (default: <repository>/images/runtime-requirements.txt)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ml-dev", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser(
        "run",
        help="sync, then run a command on every pod with its rank environment",
        epilog=ENV_RULE + "\n\n" + EXIT_RULE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--no-sync", action="store_true", help="do not sync the working tree first")
    run.add_argument("--debug", type=int, metavar="RANK", help=f"run RANK's Python under debugpy on port {DEBUG_PORT}")
    run.add_argument("--no-wait", action="store_true", help="with --debug: do not wait for the debugger to attach")
    run.add_argument(
        "--debug-host",
        choices=("localhost", "pod"),
        default="localhost",
        help="with --debug: listen on 127.0.0.1 (default; oc port-forward) or on the pod IP (attach from another pod of the stack)",
    )
    run.add_argument(
        "--per-pod",
        action="store_true",
        help="one process per pod: also set RANK=NODE_RANK, LOCAL_RANK=0, WORLD_SIZE=NNODES (else nothing new is set)",
    )
    for p in (
        run,
        sub.add_parser("sync", help="sync the working tree to every pod"),
        sub.add_parser("exec", help="run a command on every pod (no sync)"),
        sub.add_parser("status", help="pods, ranks, GPUs, RDMA devices, SSH sessions, the idle agent's view"),
    ):
        p.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod to be reachable (60)")
        if p.prog.split()[-1] == "status":
            p.add_argument("--all", action="store_true", help="every environment of the namespace: owner, size, state, GPU-hours")
            p.add_argument("--start", action="store_true", help="the start ledger: each pod's phases from creation to its first rank")
        if p.prog.split()[-1] in ("run", "exec"):
            p.add_argument("--env", action="append", default=[], metavar="K=V", help="set K=V on every rank (repeatable)")
            p.add_argument("command", nargs=argparse.REMAINDER)
    environment_commands(sub, run)
    apply = sub.add_parser("_apply")
    apply.add_argument("--root", required=True)
    sub.add_parser("_check").add_argument("--root", required=True)
    relay = sub.add_parser("_relay")  # one hop of the fan-out, on a pod that holds the verified tree
    for flag, kind in (("--root", str), ("--to", int), ("--hash", str), ("--stall", int)):
        relay.add_argument(flag, type=kind, required=True)
    relay.add_argument("--rsync-only", action="store_true")  # `ml-dev run`: the receiver's rank agent applies
    relay.add_argument("--checksum", action="store_true")
    rank = sub.add_parser("_rank")
    rank.add_argument("--cwd", required=True)
    rank.add_argument("--debug-port", type=int)
    rank.add_argument("--debug-host", choices=("localhost", "pod"), default="localhost")
    rank.add_argument("--no-stdin-watch", action="store_true")
    rank.add_argument("--env-stdin", action="store_true")
    # ml-dev exec: what the command leaves running when it ends on its own (a daemon it started) is left alone
    rank.add_argument("--leave-rest", action="store_true")
    rank.add_argument("command", nargs=argparse.REMAINDER)
    logs = sub.add_parser(
        "logs",
        help="a run's output from every rank's run log (kept on its pod's workspace whatever became of the terminal)",
    )
    logs.add_argument("run", nargs="?", help="the run's id (default: the newest run with a log on this pod)")
    logs.add_argument("--rank", type=int, help="only this rank's log (unprefixed)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until each rank's last line")
    log_here = sub.add_parser("_log")
    log_here.add_argument("--run", required=True)
    log_here.add_argument("--rank", type=int, required=True)
    log_here.add_argument("-f", "--follow", action="store_true")
    sub.add_parser("why", help="which rank is stuck, and where: every rank's stack from every pod, one verdict (ml-dev why -h)")
    given = sys.argv[1:] if argv is None else argv
    if given[:1] and given[0] in RANKS_COMMANDS:  # warm ranks (ranks.py, hub.py, warm.py): their own command line
        return ranks_main(given)
    if given[:1] == ["why"]:  # its own program (why.py): run and the rank agents never load the sampler and the merge
        os.execv(sys.executable, [sys.executable, str(HERE / WHY_LAUNCHER), *given])
    sub.add_parser("ranks", help="warm ranks: start, exec a cell on every rank, status, stop (ml-dev ranks -h)")
    args = parser.parse_args(argv)
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    handlers = {"run": run_unless_warm, "sync": cmd_sync, "exec": cmd_exec, "status": cmd_status, "_apply": cmd_apply, "_rank": cmd_rank}
    handlers.update(pip=cmd_pip, freeze=cmd_freeze, _check=cmd_check, _relay=cmd_relay, logs=cmd_logs, _log=cmd_log_here)
    return handlers[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
