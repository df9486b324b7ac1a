"""Who holds the GPUs: each environment's GPU-hours, and one table of every environment of a cluster.

`loop` (the environment's usage recorder, a record every `--period` seconds; `record` does one): adds pods running × GPUs per pod × the
time since the last record to today's bucket (`gpu-seconds.<UTC date>`) of the environment's usage ConfigMap.
A suspended or idle-stopped environment has no pods: nothing is added. A missed run counts at most two periods.

`status` (`ml-dev status --all` in a pod, `make status CLUSTER=<cluster>` from a laptop (tools/status.py)): reads the live
StatefulSets and ConfigMaps labelled `ml-dev-env/cluster=<cluster>` (a List as `oc get -o json` prints it, or
read from the API with the pod's token) and prints owner, namespace, size, state and GPU-hours of the last 7 days.

Standard library only, nothing of ours imported (it runs on any Python image).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from . import contract
from .lib import kube
from .lib.kube import Client

BUCKET = "gpu-seconds."
LAST = "last-record"
KEEP_DAYS = 14
WEEK_DAYS = 7
STACK_LABEL, CLUSTER_LABEL, USAGE_LABEL = contract.STACK_LABEL, contract.CLUSTER_LABEL, contract.USAGE_LABEL
GPU = "nvidia.com/gpu"
FIELD_MANAGER = "ml-dev-env-usage"
Api = functools.partial(kube.Client, FIELD_MANAGER)
"""`Api(base=None, sa_dir=None)`: the in-cluster client (lib/kube.py) as the usage recorder."""


def day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def add_usage(data: dict[str, str], pods: int, gpus_per_pod: int, now: float, period: float) -> dict[str, str]:
    """The usage ConfigMap's new data: pods × GPUs × seconds since the last record (≤ 2 periods) added to today's bucket."""
    out = dict(data)
    try:
        last = float(out.get(LAST, ""))
    except ValueError:
        last = now - period
    elapsed = min(max(now - last, 0.0), 2 * period)
    key = BUCKET + day(now)
    out[key] = str(int(float(out.get(key, "0") or 0) + pods * gpus_per_pod * elapsed))
    out[LAST] = str(int(now))
    oldest = day(now - KEEP_DAYS * 86400)
    return {k: v for k, v in out.items() if not k.startswith(BUCKET) or k[len(BUCKET) :] >= oldest}


def week_hours(data: dict[str, str], now: float) -> float:
    """GPU-hours of the last 7 days (today included) in a usage ConfigMap's data."""
    first = day(now - (WEEK_DAYS - 1) * 86400)
    seconds = sum(float(v or 0) for k, v in data.items() if k.startswith(BUCKET) and k[len(BUCKET) :] >= first)
    return seconds / 3600


def record(
    api: Client, namespace: str, statefulset: str, configmap: str, gpus_per_pod: int, period: float, now: float | None = None
) -> str:
    scale = api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{statefulset}/scale")
    pods = int((scale.get("status") or {}).get("replicas") or 0)
    path = f"/api/v1/namespaces/{namespace}/configmaps/{configmap}"
    current = api.call("GET", path).get("data") or {}
    now = time.time() if now is None else now
    data = add_usage(current, pods, gpus_per_pod, now, period)
    # A merge patch: keys it drops (older than KEEP_DAYS) are sent as null, which removes them.
    api.call("PATCH", path, {"data": {**{k: None for k in current if k not in data}, **data}}, "application/merge-patch+json")
    return f"{namespace}/{statefulset}: {pods} pod(s) × {gpus_per_pod} GPU(s); today {int(data[BUCKET + day(now)]) / 3600:.2f} GPU-hours"


def run_loop(api: Client, namespace: str, statefulset: str, configmap: str, gpus: int, period: float, rounds: int | None = None) -> int:
    """Record every `period` seconds; a failed record is logged and retried next period (never exits on its own)."""
    done = 0
    while rounds is None or done < rounds:
        try:
            print(record(api, namespace, statefulset, configmap, gpus, period), flush=True)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            print(f"WARNING: no record this period: {exc}", flush=True)
        done += 1
        if rounds is None or done < rounds:
            time.sleep(period)
    return 0


# ------------------------------------------------------------------------------------------ status


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _gpus(sts: dict[str, Any]) -> int:
    containers = ((((sts.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)) for c in containers)


def environments(items: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """One row per environment StatefulSet among live `items`: owner, namespace, size, state, GPU-hours this week."""
    maps = {((o["metadata"].get("namespace")), o["metadata"]["name"]): o for o in items if o.get("kind") == "ConfigMap"}
    rows = []
    for sts in (o for o in items if o.get("kind") == "StatefulSet"):
        meta = sts["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        replicas = int((sts.get("spec") or {}).get("replicas") or 0)
        record = (maps.get((ns, f"{name}-idle-stop")) or {}).get("data") or {}
        state = "running" if replicas else ("idle-stopped" if record else "suspended")
        usage = (maps.get((ns, f"{name}-usage")) or {}).get("data") or {}
        pods = replicas or int((sts.get("status") or {}).get("replicas") or 0)
        rows.append(
            {
                "owner": _labels(sts).get(STACK_LABEL, "?"),
                "namespace": ns,
                "environment": name,
                "size": f"{max(replicas, pods)} × {_gpus(sts)} GPU",
                "state": state,
                "gpuHoursWeek": round(week_hours(usage, now), 2),
            }
        )
    return sorted(rows, key=lambda r: (-r["gpuHoursWeek"], r["namespace"] or "", r["environment"]))


def table(rows: list[dict[str, Any]]) -> str:
    head = ("OWNER (STACK)", "NAMESPACE", "ENVIRONMENT", "SIZE", "STATE", "GPU-HOURS 7D")
    cells = [head] + [(r["owner"], r["namespace"], r["environment"], r["size"], r["state"], f"{r['gpuHoursWeek']:.2f}") for r in rows]
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(str(c[i]).ljust(widths[i]) for i in range(len(head))).rstrip() for c in cells) + "\n"


def read_live(api: Client, cluster: str | None, namespaces: list[str]) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"{CLUSTER_LABEL}={cluster}" if cluster else f"{contract.PART_OF_LABEL}={contract.PART_OF}")
    items: list[dict[str, Any]] = []
    for ns in namespaces:
        for kind, path in (
            ("StatefulSet", f"/apis/apps/v1/namespaces/{ns}/statefulsets"),
            ("ConfigMap", f"/api/v1/namespaces/{ns}/configmaps"),
        ):
            for item in api.call("GET", f"{path}?labelSelector={selector}").get("items") or []:
                items.append({**item, "kind": kind})
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="add this interval's GPU-seconds to the usage ConfigMap")
    loop = sub.add_parser("loop", help="record every --period seconds, forever (the recorder Deployment)")
    for p in (rec, loop):
        p.add_argument("--namespace", required=True)
        p.add_argument("--statefulset", required=True)
        p.add_argument("--configmap", required=True)
        p.add_argument("--gpus-per-pod", type=int, required=True)
        p.add_argument("--period", type=float, required=True, help="seconds between records")
    st = sub.add_parser("status", help="every environment of a cluster")
    st.add_argument("--from-json", help=f"a List as `oc get statefulsets,configmaps -A -l {CLUSTER_LABEL}=<c> -o json` prints (- = stdin)")
    st.add_argument("--cluster", help="with the API: only this cluster's objects (default: every ml-dev-env object of --namespace)")
    st.add_argument("--namespace", action="append", default=[], help="namespaces to read with the API (repeatable)")
    st.add_argument("--json", action="store_true", help="rows as JSON")
    args = parser.parse_args(argv)
    if args.cmd == "loop":
        return run_loop(Api(), args.namespace, args.statefulset, args.configmap, args.gpus_per_pod, args.period)
    try:
        if args.cmd == "record":
            print(record(Api(), args.namespace, args.statefulset, args.configmap, args.gpus_per_pod, args.period), flush=True)
            return 0
        if args.from_json:
            text = sys.stdin.read() if args.from_json == "-" else Path(args.from_json).read_text()
            items = json.loads(text).get("items") or []
        else:
            if not args.namespace:
                parser.error("status needs --from-json or --namespace")
            items = read_live(Api(), args.cluster, args.namespace)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    rows = environments(items, time.time())
    sys.stdout.write(json.dumps(rows, indent=2) + "\n" if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
