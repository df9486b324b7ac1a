"""ml-dev sync's copy: one hop (rsync the launching pod's file list from here to one pod, then `_apply` there), run by
the launching pod itself or by a relay (`_relay`, a pod that holds the verified tree), and the rounds that pass the
tree on (contract.FANOUT_DEFAULTS says when).

Rules every hop keeps, relays included:
* the file list is the launching pod's, piped to the relay: a relay sends those files, never its own tree, so its
  per-pod directories and files created only there go nowhere (the launching pod left per-pod paths out);
* a pod is a source only once its tree hash, computed there by `_apply`, equals the launching pod's;
* a relay is reached through the fabric's SSH (the same client config on every pod) and runs the launcher from its
  own mount path (HERE), never a path resolved here.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

from .. import contract
from .common import HERE, PY, Cluster, die

Hop = Dict[str, Any]
"""One hop's outcome: src, dst, hash (computed on dst), sent (rsync's bytes), seconds, error ("" when none),
source_failed (the relay itself went silent or its SSH session broke), round, via ("rsync", or "gate": a small change
written by the receiver's rank agent, sync.gate_hop)."""


def settings(environ: dict[str, str] | None = None) -> dict[str, int]:
    """contract.FANOUT_DEFAULTS, with the keys of $ML_DEV_FANOUT (a JSON object) over them."""
    values = dict(contract.FANOUT_DEFAULTS)
    text = (environ if environ is not None else os.environ).get(contract.FANOUT_ENV, "")
    if not text:
        return values
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        die(f"{contract.FANOUT_ENV}={text!r}: expected a JSON object with keys among {', '.join(values)}")
    bad = [f"{k}={v!r}" for k, v in given.items() if k not in values or not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad:
        die(f"{contract.FANOUT_ENV}: {', '.join(bad)}: allowed keys {', '.join(values)}, each a whole number >= 0")
    values.update(given)
    return values


def rounds_needed(pods: int) -> int:
    """Rounds of the fan-out for `pods` receivers: the pods that hold the tree double each round (the launching pod
    sends once, to the first relay, which then also sends in its stead): ceil(log2(pods + 1)), at least 1."""
    return max(1, math.ceil(math.log2(pods + 1)))


# ------------------------------------------------------------------------------------------- one hop


def rsh(cluster: Cluster, stall: int) -> str:
    """rsync's ssh (-e): the fabric's client, and a connection this hop opens notices a dead peer within `stall` s
    (ssh_config(5) ServerAliveInterval/ServerAliveCountMax: options of the connection a master opens; a session
    multiplexed over an existing master has the master's). rsync's own `--timeout` (rsync(1): "If no data is
    transferred for the specified time then rsync will exit") ends a transfer to a receiver that went silent. The
    master a relay's hop starts (ControlPersist) leaves the relay's session: openssh-portable ssh.c
    control_persist_detach puts the backgrounded master's stdin, stdout and stderr on /dev/null (stdfd_devnull)."""
    alive = ["-o", "ServerAliveInterval=2", "-o", f"ServerAliveCountMax={max(1, stall // 2)}"]
    return cluster.rsh() + " " + shlex.join(alive)


Verify = Callable[[int, bytes], "tuple[str, str]"]
"""verify(rank, listing) -> (hash, error): `_apply` on that pod after a hop's rsync."""


def hop(
    cluster: Cluster,
    root: Path,
    dst: int,
    listing: bytes,
    expect: str,
    stall: int,
    verify: Verify | None = None,
    rsync_only: bool = False,
    checksum: bool = False,
) -> Hop:
    """From this pod to `dst`: rsync the listed files, then `_apply` there (deletions, manifest, tree hash). rsync's
    quick check (size + mtime, to the nanosecond with --modify-window=-1) misses a same-size rewrite within one
    timestamp tick: when the hash differs, the contents are compared (--checksum) once (`checksum`: at once).
    `verify(dst, listing)` -> (hash, error) runs `_apply` there: by default its own SSH command; `ml-dev run` asks
    the rank agent that waits at its gate on that pod (sync.serve_gate), over the session it already holds.
    `rsync_only`: no `_apply` here (a relay's hop in `ml-dev run`: the launching pod asks that agent afterwards)."""
    started = time.monotonic()
    out: Hop = {"src": cluster.me, "dst": dst, "hash": "", "sent": 0, "error": "", "source_failed": False, "via": "rsync"}
    files = listing + b"\0" if listing else b""
    for extra in ([["--checksum"]] if checksum else [[], ["--checksum"]])[: 1 if rsync_only else 2]:
        argv = ["rsync", "-a", "--stats", "--modify-window=-1", f"--timeout={stall}", *extra, "--from0", "--files-from=-"]
        # the remote side runs `mkdir -p <root> && rsync --server ...` (rsync(1) --rsync-path: "a shell command"):
        # the root exists on the receiver without a round trip of its own
        argv += ["--rsync-path", f"mkdir -p {shlex.quote(str(root))} && rsync"]
        argv += ["-e", rsh(cluster, stall), f"{root}/", f"{cluster.hosts[dst]}:{root}/"]
        res = subprocess.run(argv, input=files, capture_output=True, check=False)
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace")
            out["error"] = f"rsync exited {res.returncode}: {cluster.explain(dst, err, res.returncode)}"
            break
        stats = re.search(rb"Total bytes sent: ([\d,.]+)", res.stdout)
        out["sent"] += int(re.sub(rb"[,.]", b"", stats.group(1))) if stats else 0
        if rsync_only:
            break
        got, error = (verify or applied_over_ssh(cluster, root))(dst, listing)
        if error:
            out["error"] = f"hash: {error}"
            break
        out["hash"] = got
        if out["hash"] == expect:
            break
    out["seconds"] = round(time.monotonic() - started, 3)
    return out


def applied_over_ssh(cluster: Cluster, root: Path) -> Verify:
    """verify for a hop: `ml-dev _apply` on the receiver, its own SSH command."""

    def verify(dst: int, listing: bytes) -> tuple[str, str]:
        remote = [PY, str(HERE / "ml-dev"), "_apply", "--root", str(root)]
        res = subprocess.run(cluster.ssh(dst, remote), input=listing, capture_output=True, check=False)
        if res.returncode != 0:
            return "", cluster.explain(dst, res.stderr.decode(errors="replace"), res.returncode)
        return res.stdout.decode().strip(), ""

    return verify


def cmd_relay(args: argparse.Namespace) -> int:
    """(on a pod that holds the verified tree) one hop to pod `--to`, the launching pod's file list on stdin. Prints a
    line every second while it works (the launching pod's watchdog), then the hop as JSON."""
    cluster = Cluster()
    listing = sys.stdin.buffer.read()
    result: list[Hop] = []

    def work() -> None:
        try:
            result.append(
                hop(cluster, Path(args.root), args.to, listing, args.hash, args.stall, rsync_only=args.rsync_only, checksum=args.checksum)
            )
        except Exception as exc:  # reported to the launching pod
            result.append({"src": cluster.me, "dst": args.to, "hash": "", "sent": 0, "error": f"relay: {exc}", "seconds": 0})

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    while worker.is_alive():
        print(".", flush=True)
        worker.join(1)
    print(json.dumps(result[0]), flush=True)
    return 0


def relayed(
    cluster: Cluster,
    src: int,
    dst: int,
    root: Path,
    listing: bytes,
    expect: str,
    stall: int,
    rsync_only: bool = False,
    checksum: bool = False,
) -> Hop:
    """Run one hop on relay `src` over SSH; a relay that sends no line for `stall` s, or whose session breaks, failed."""
    started = time.monotonic()
    failed: Hop = {"src": src, "dst": dst, "hash": "", "sent": 0, "source_failed": True}
    remote = [PY, str(HERE / "ml-dev"), "_relay", "--root", str(root), "--to", str(dst), "--hash", expect, "--stall", str(stall)]
    remote += ["--rsync-only"] * rsync_only + ["--checksum"] * checksum
    proc = subprocess.Popen(
        cluster.ssh(src, remote), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    errors: list[bytes] = []

    def feed() -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(listing)
            proc.stdin.close()
        except OSError:
            pass

    threads = [threading.Thread(target=feed, daemon=True)]
    threads.append(threading.Thread(target=lambda: errors.append(proc.stderr.read() if proc.stderr else b""), daemon=True))
    for t in threads:
        t.start()
    assert proc.stdout is not None
    fd, buffered, last = proc.stdout.fileno(), b"", b""
    while True:
        ready, _, _ = select.select([fd], [], [], stall)
        if not ready:
            kill(proc)
            return {**failed, "error": f"relay {cluster.label(src)} sent no word for {stall} s", "seconds": time.monotonic() - started}
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        last = next((ln for ln in reversed(lines) if ln.strip() not in (b"", b".")), last)
    code = proc.wait()
    for t in threads:
        t.join(timeout=5)
    try:
        got: Hop = json.loads(last)
    except ValueError:
        err = b"".join(errors).decode(errors="replace")
        why = cluster.explain(src, err, code)
        return {**failed, "error": f"relay {cluster.label(src)}: {why}", "seconds": time.monotonic() - started}
    got.update(src=src, source_failed=False)
    return got


def kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# ------------------------------------------------------------------------------------------- rounds


def fan_out(
    cluster: Cluster,
    root: Path,
    stale: list[int],
    listing: bytes,
    expect: str,
    cfg: dict[str, int],
    say: Callable[[str], None],
    verify: Verify | None = None,
) -> tuple[list[Hop], dict[int, str]]:
    """Copy to every pod of `stale` in rounds; returns every hop and {rank: why} for pods that never got it.

    Round 1: the launching pod sends to one pod, the first relay. Then every pod that holds the verified tree sends
    to one pod that still needs it, and the first relay sends to one more in the launching pod's stead: the holders
    double each round while the launching pod sends the tree once (it sends again only when no relay is left). A
    failed hop puts its receiver back in line for the next round, from another source; a relay that failed is not
    used again; a pod that failed `tries` times is given up.

    With `verify` (`ml-dev run`: the rank agent waiting at each pod's gate) a relay only rsyncs, and this pod has the
    receiver's agent apply the launching pod's list and answer the hash: no `_apply` process and SSH session of
    its own per hop. A receiver whose hash still differs gets its next copy with --checksum.

    Why one function: the rounds are one loop over shared state (holders, tries per pod, stalled relays).
    """
    me, stall = cluster.me, max(1, cfg["stallSeconds"])
    holders: list[int] = []
    pending = list(stale)
    tried: dict[int, list[int]] = {r: [] for r in stale}  # the sources each pod's failed hops came from
    hops: list[Hop] = []
    gave_up: dict[int, str] = {}
    planned = rounds_needed(len(stale))
    contents: set[int] = set()  # receivers whose hash differed after a quick-check copy: compared by content next
    number = 0
    while pending:
        number += 1
        senders = [*holders, holders[0]] if holders else [me]
        pairs = assign(senders, pending, tried)
        started = time.monotonic()

        def one(k: int, pairs: list[tuple[int, int]] = pairs) -> Hop:
            src, dst = pairs[k]
            if src == me:
                extra = (verify,) if verify else ()  # (the rounds' tests stand in for hop with its six arguments)
                return hop(cluster, root, dst, listing, expect, stall, *extra)
            started = time.monotonic()
            if verify is None:
                got = relayed(cluster, src, dst, root, listing, expect, stall)
            else:
                got = relayed(cluster, src, dst, root, listing, expect, stall, rsync_only=True, checksum=dst in contents)
                if not got.get("error"):
                    got["hash"], error = verify(dst, listing)
                    if error:
                        got["error"] = f"hash: {error}"
                    elif got["hash"] != expect:
                        contents.add(dst)
            # the hop as this pod saw it (the SSH session to the relay and its start, the relay's rsync, the hash
            # answered): what the round waits for; the relay's own count leaves out its start and the answer
            got["relay_seconds"] = got.get("seconds", 0)
            got["seconds"] = round(time.monotonic() - started, 3)
            return got

        results = parallel_hops(one, len(pairs))
        words = []
        for k, (src, dst) in enumerate(pairs):
            res = results[k]
            res.update(src=src, dst=dst, round=number)
            hops.append(res)
            ok = not res.get("error") and res.get("hash") == expect
            words.append(f"{src}->{dst} {float(res.get('seconds', 0)):.2f} s" + ("" if ok else " FAILED"))
            if ok:
                holders.append(dst)
                pending.remove(dst)
                continue
            why = res.get("error") or f"tree hash {str(res.get('hash'))[:12]} differs from {expect[:12]} here"
            tried[dst].append(src)
            if res.get("source_failed") and src in holders:
                holders.remove(src)  # it keeps its verified tree; it just sends nothing more this time
            if len(tried[dst]) >= max(1, cfg["tries"]):
                pending.remove(dst)
                gave_up[dst] = f"{why} (tried {len(tried[dst])} times, from ranks {', '.join(map(str, tried[dst]))})"
            say(
                f"round {number}: {cluster.label(dst)} from {cluster.label(src)} failed: {why}; "
                + ("given up" if dst in gave_up else "retried")
            )
        label = f"round {number}/{planned}" if number <= planned else f"round {number} (a retry)"
        say(f"{label}: " + ", ".join(words) + f" ({time.monotonic() - started:.2f} s)")
    return hops, gave_up


def assign(senders: list[int], pending: list[int], tried: dict[int, list[int]]) -> list[tuple[int, int]]:
    """(source, receiver) pairs of one round: each sender slot to a pod that still needs the tree, in line order; a
    pod is given a source that has not failed it yet where one is free."""
    slots = list(senders)
    pairs = []
    for dst in pending:
        if not slots:
            break
        fresh = next((k for k, src in enumerate(slots) if src not in tried.get(dst, [])), 0)
        pairs.append((slots.pop(fresh), dst))
    return pairs


def parallel_hops(fn: Callable[[int], Hop], count: int) -> list[Hop]:
    out: list[Hop] = [{} for _ in range(count)]

    def one(k: int) -> None:
        try:
            out[k] = fn(k)
        except Exception as exc:  # that hop failed; the others go on
            out[k] = {"hash": "", "sent": 0, "error": str(exc), "seconds": 0}

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
