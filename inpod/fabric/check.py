"""fabric-check: prove the GPU fabric inside the pods (Python 3 standard library only).

Delivered in the startup ConfigMap next to startup.sh (/opt/ml-dev-env/fabric_check.py) with
fabric.json, the stack's settings. Subcommands:

  preflight [--all]   checks this pod (or every pod over SSH): HCAs, SR-IOV allocation, link state and
                      rate, interface MTU/address, RoCEv2 GID, memlock, IOMMU mode, GPU count.
                      One line per failure naming pod, node, device and the fix. Exit 1 on any failure.
  gate                all_reduce_perf (nccl-tests, MPI build) across every pod with mpirun over SSH,
                      1 MiB..8 GiB; judges the plateau bus bandwidth against fabric.json's expectation;
                      on failure localises with pairwise runs (log2 n rounds) and per-HCA ib_write_bw.
                      Writes a table and JSON to the workspace and the state dir. Exit 1 on failure.
  status              prints the latest gate result (exit 0 pass, 1 fail, 2 none).
  hold                pod 0 at start with fabricCheck.onDeploy: retries preflight + gate until they pass
                      or the timeout; then keeps holding until a passing gate or `release`.
  release             lets a holding pod 0 start its dev servers although the gate did not pass.
  rank-order          prints pod names in rack-aware rank order (pod 0 first, consecutive ranks share a rack).

Environment: ML_DEV_FABRIC_CONFIG (fabric.json), ML_DEV_STATE_DIR (/tmp/ml-dev-env, holds rank.env),
ML_DEV_WORKSPACE (/workspace), ML_DEV_FABRIC_ROOT (prefix for /sys and /proc, tests), ML_DEV_SSH
(ssh command, default `ssh -o BatchMode=yes`), ML_DEV_PYTHON (python3 on the other pods), POD_NAME/ML_DEV_POD,
NODE_NAME. Runs on Python 3.8 and later (the images' own interpreters).

The program is split at its seams, modules shipped next to it in the same ConfigMap (inpod.SHIPPED):
util (the fabric's paths and config over inpod/lib), parse (every tool's output format),
allreduce, preflight, gate, localise and report; this file holds the command line, the
on-deploy hold and the rack-aware rank order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from .. import contract
from ..lib import kube, ledger
from .gate import gate
from .parse import parse_ip_addr
from .preflight import hca_netdevs, preflight, preflight_all
from .report import gate_table, latest, write_result
from .util import PROGRAM, ensure, env, load_config, log, read_rank_env, remote, run, state_dir, sys_root, utc_now

FIELD_MANAGER = "ml-dev-env-fabric-check"


def cmd_preflight(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if not args.all:
        findings = preflight(cfg)
        for line in (findings.passes if args.verbose else []) + findings.failures:
            print(line)
        print(f"preflight {findings.pod}: {'FAILED, ' + str(len(findings.failures)) + ' problem(s)' if findings.failures else 'passed'}")
        return 1 if findings.failures else 0
    ok, lines = preflight_all()
    print("\n".join(lines))
    return 0 if ok else 1


def cmd_netdev(args: argparse.Namespace) -> int:
    """JSON list: each HCA's interface in this pod (sysfs) and its IPv4 addresses (the localisation asks each pod)."""
    out = []
    for hca in args.hcas:
        names = hca_netdevs(sys_root(), hca)
        netdev = names[0] if names else None
        inet: list[str] = []
        if netdev:
            info = parse_ip_addr(run(["ip", "addr", "show", "dev", netdev], timeout=30).stdout).get(netdev)
            inet = info["inet"] if info else []
        out.append({"hca": hca, "netdev": netdev, "inet": inet})
    print(json.dumps(out))
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    result = gate(cfg, localise=not args.no_localise)
    written = write_result(result)
    if result["status"] in ("pass", "no-expectation"):
        ledger.mark(contract.START_FABRIC)  # the start ledger's `fabric` phase: the first gate this container passed
    sys.stdout.write(gate_table(result))
    for d in written:
        print(f"result: {d / 'latest.json'}")
    return 0 if result["status"] in ("pass", "no-expectation", "skipped") else 1


def cmd_latest(args: argparse.Namespace) -> int:
    result = latest()
    if result is None:
        print("no fabric gate result yet (run: fabric_check.py gate)")
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(gate_table(result))
    return 0 if result["status"] in ("pass", "no-expectation", "skipped") else 1


def release_marker() -> Path:
    return state_dir() / "fabric" / "release"


def cmd_release(args: argparse.Namespace) -> int:
    ensure(release_marker().parent)
    release_marker().write_text(utc_now() + "\n")
    print(f"released: pod 0 starts its dev servers ({release_marker()})")
    return 0


def passed_or_released(since: float) -> bool:
    if release_marker().exists():
        return True
    path = state_dir() / contract.FABRIC_LATEST
    if path.exists() and path.stat().st_mtime >= since:
        try:
            return json.loads(path.read_text()).get("status") in ("pass", "no-expectation", "skipped")
        except ValueError:
            return False
    return False


RELEASE_POLL_SECONDS = 1.0
"""How often the hold looks for `release` or a passing `gate` between its attempts (two stat calls)."""


def wait_released(since: float, seconds: float) -> bool:
    """Sleep up to `seconds` (the hold's interval between attempts), returning True as soon as a `release` or a
    passing gate run is there: a user's `release` takes effect within RELEASE_POLL_SECONDS, not at the next attempt."""
    end = time.monotonic() + seconds
    while True:
        if passed_or_released(since):
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(RELEASE_POLL_SECONDS, left))


def peers_reachable() -> tuple[bool, str]:
    try:
        rank = read_rank_env()
    except OSError:
        return False, "rank.env not written yet"
    hosts = rank.get("ML_DEV_HOSTS", "").split()
    if len(hosts) != int(rank.get("NNODES") or 0):
        return False, f"rank.env lists {len(hosts)} hosts for NNODES={rank.get('NNODES')}"
    for host in hosts:
        if run(remote(host, ["true"]), timeout=30).returncode != 0:
            return False, f"{host} not reachable over SSH yet"
    return True, ""


def cmd_hold(args: argparse.Namespace) -> int:
    """Holding pod 0 before its dev servers keeps it un-Ready (no readiness file), and `pulumi up` waits for
    every replica to be Ready (pulumi/pulumi-kubernetes provider/pkg/await/statefulset.go,
    statefulsetInitAwaiter.Await: .status.readyReplicas == .spec.replicas), failing at the StatefulSet's
    pulumi.com/timeoutSeconds."""
    try:
        cfg = load_config(args.config)
    except FileNotFoundError:
        return 0  # no fabric.json next to the program: nothing configured, nothing to hold
    if not cfg.get("onDeploy"):
        return 0
    timeout = args.timeout if args.timeout is not None else float(cfg.get("onDeployTimeoutSeconds") or 1800)
    interval = args.interval
    start = time.time()
    deadline = start + timeout
    attempt = 0
    log(f"fabricCheck.onDeploy: dev servers wait for the fabric check (up to {timeout:g} s)")
    while time.time() < deadline:
        if passed_or_released(start):
            log("fabric check passed (or released)")
            return 0
        ready, why = peers_reachable()
        if not ready:
            log(f"waiting: {why}")
            wait_released(start, interval)
            continue
        attempt += 1
        ok, lines = preflight_all()
        for line in lines:
            if line.startswith("FAIL"):
                log(line)
        if not ok:
            write_result(
                {
                    "time": utc_now(),
                    "status": "fail",
                    "mode": cfg.get("mode"),
                    "hosts": read_rank_env().get("ML_DEV_HOSTS", "").split(),
                    "gpusPerNode": cfg.get("gpusPerPod"),
                    "expectation": cfg.get("expectation"),
                    "plateauMinBytes": cfg.get("plateauMinBytes"),
                    "preflight": lines,
                    "diagnosis": [f"preflight failed (attempt {attempt})"],
                }
            )
            log(f"attempt {attempt}: preflight failed; retrying in {interval:g} s")
            wait_released(start, interval)
            continue
        result = gate(cfg)
        write_result(result)
        for line in gate_table(result).splitlines():
            log(line)
        if result["status"] in ("pass", "no-expectation", "skipped"):
            return 0
        log(f"attempt {attempt}: gate {result['status']}; retrying in {interval:g} s")
        wait_released(start, interval)
    log(
        f"the fabric check did not pass within {timeout:g} s (fabricCheck.onDeployTimeoutSeconds). Dev servers stay held until "
        f"`{PROGRAM} gate` passes on this pod or `{PROGRAM} release`; `{PROGRAM} status` shows the last result."
    )
    while not wait_released(start, interval):
        pass
    log("fabric check passed (or released)")
    return 0


def rack_order(pods: list[str], pod_nodes: Mapping[str, str | None], node_racks: Mapping[str, str]) -> list[str]:
    """Pods in rank order: pod 0 (first in `pods`) stays rank 0, its rack's pods follow, then the other
    racks in the order nodeRacks lists them; inside a rack by pod ordinal. Pods whose node is unknown
    (not scheduled yet, or not in nodeRacks) come last, by ordinal."""
    if not pods or not node_racks:
        return list(pods)
    racks_in_order: list[str] = []
    first_rack = node_racks.get(pod_nodes.get(pods[0]) or "")
    if first_rack:
        racks_in_order.append(first_rack)
    for rack in node_racks.values():
        if rack not in racks_in_order:
            racks_in_order.append(rack)
    position = {rack: i for i, rack in enumerate(racks_in_order)}

    def key(item: tuple[int, str]) -> tuple[int, int, int]:
        ordinal, pod = item
        if ordinal == 0:
            return (0, -1, 0)
        rack = node_racks.get(pod_nodes.get(pod) or "")
        return (0, position[rack], ordinal) if rack is not None else (1, 0, ordinal)

    return [pod for _, pod in sorted(enumerate(pods), key=key)]


def pod_nodes_from_api(namespace: str, selector: str) -> dict[str, str | None]:
    """spec.nodeName of this StatefulSet's pods through the Kubernetes API (needs get/list on pods in the namespace)."""
    query = urllib.parse.urlencode({"labelSelector": selector})
    items = kube.Client(FIELD_MANAGER).call("GET", f"/api/v1/namespaces/{namespace}/pods?{query}", timeout=10)["items"]
    return {i["metadata"]["name"]: (i.get("spec") or {}).get("nodeName") for i in items}


def cmd_rank_order(args: argparse.Namespace) -> int:
    """Prints the pods in rank order; always succeeds (falls back to ordinal order with a note on stderr)."""
    pods = args.pods.split()
    try:
        cfg = load_config(args.config)
    except (OSError, ValueError):
        cfg = {}
    racks = cfg.get("nodeRacks") or {}
    if not racks:
        print(" ".join(pods))
        return 0
    pod_nodes: dict[str, str | None] = {}
    for pair in (args.nodes or "").split():
        pod, _, node = pair.partition("=")
        pod_nodes[pod] = node or None
    if args.from_api:
        app = cfg.get("appName") or "ml-dev-env"
        selector = args.selector or f"app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance={app}"
        try:
            pod_nodes.update(pod_nodes_from_api(args.namespace or env("POD_NAMESPACE"), selector))
        except (OSError, ValueError, KeyError) as exc:
            print(f"rank-order: cannot read pod placement ({exc}); ranks = ordinals", file=sys.stderr)
            pod_nodes = {}
    unknown = [p for p in pods if not pod_nodes.get(p)]
    if unknown:
        print(f"rank-order: node of {', '.join(unknown)} not known yet; they rank last until it is", file=sys.stderr)
    print(" ".join(rack_order(pods, pod_nodes, racks)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fabric_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="fabric.json (default: next to this program, or $ML_DEV_FABRIC_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight", help="check this pod (or --all pods)")
    p.add_argument("--all", action="store_true", help="run on every pod of rank.env over SSH")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the checks that passed")
    p.set_defaults(func=cmd_preflight)
    p = sub.add_parser("gate", help="NCCL all-reduce bandwidth gate across all pods")
    p.add_argument("--no-localise", action="store_true", help="skip pairwise and per-HCA localisation on failure")
    p.set_defaults(func=cmd_gate)
    p = sub.add_parser("netdev", help="each HCA's network interface in this pod (sysfs) and its IPv4, as JSON")
    p.add_argument("hcas", nargs="+")
    p.set_defaults(func=cmd_netdev)
    p = sub.add_parser("status", help="print the latest gate result")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_latest)
    p = sub.add_parser("hold", help="(startup, pod 0) wait for the fabric check when fabricCheck.onDeploy is set")
    p.add_argument("--timeout", type=float, help="seconds (default fabricCheck.onDeployTimeoutSeconds)")
    p.add_argument(
        "--interval",
        type=float,
        default=float(env("ML_DEV_FABRIC_INTERVAL", "30")),
        help="seconds between attempts (default $ML_DEV_FABRIC_INTERVAL or 30); a release or a passing gate is seen within 1 s",
    )
    p.set_defaults(func=cmd_hold)
    p = sub.add_parser("release", help="let a holding pod 0 start its dev servers")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("rank-order", help="pods in rack-aware rank order")
    p.add_argument("--pods", required=True, help="pod names in ordinal order, space-separated")
    p.add_argument("--nodes", help="space-separated pod=node pairs")
    p.add_argument("--from-api", action="store_true", help="read spec.nodeName of the pods from the Kubernetes API")
    p.add_argument("--namespace")
    p.add_argument("--selector", help="pod label selector (default: this stack's StatefulSet pods)")
    p.set_defaults(func=cmd_rank_order)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
