"""Who holds the GPUs: each environment's GPU-hours, and one table of every environment of a cluster.

`loop` (the environment's usage recorder, a record every `--period` seconds; `record` does one): adds, for each pod that
holds its GPUs, GPUs per pod × the time it held them since the last record, to today's bucket (`gpu-seconds.<UTC date>`) of
the environment's usage ConfigMap. A pod holds its GPUs once bound to a node and until it finishes: the kubelet's device
manager allocates them when it admits the pod on its node (kubernetes pkg/kubelet/cm/devicemanager/manager.go Allocate),
so a Pending, Kueue-gated or unschedulable pod holds none, and a crash-looping one still does. A suspended or idle-stopped
environment has no pods: nothing is added. A missed run is counted from each pod's binding time (its PodScheduled
condition), so a gap of the recorder loses only pods that came and went inside it.

`status` (`ml-dev status --all` in a pod, `make status CLUSTER=<cluster>` from a laptop (tools/status.py)): reads the live
StatefulSets and ConfigMaps labelled `ml-dev-env/cluster=<cluster>` (a List as `oc get -o json` prints it, or
read from the API with the pod's token) and prints owner, namespace, size, state and GPU-hours of the last 7 days.

Standard library only, nothing of ours imported (it runs on any Python image).
"""

from __future__ import annotations

import argparse
import calendar
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


def add_usage(
    data: dict[str, str],
    pods: int,
    gpus_per_pod: int,
    now: float,
    period: float,
    bound_at: list[float] | None = None,
    until: list[float] | None = None,
) -> dict[str, str]:
    """The usage ConfigMap's new data: GPU-seconds since the last record added to today's bucket.

    `bound_at` (the recorder): when each pod holding GPUs was bound; each adds GPUs × (the end − the later of its binding
    and the last record), a gap of the recorder included; the end is now, or the pod's entry of `until` (a lost pod:
    its node's last heartbeat, `lost`). Without it: `pods` × GPUs × the time since the last record, at most two periods.
    """
    out = dict(data)
    try:
        last = float(out.get(LAST, ""))
    except ValueError:
        last = now - period
    key = BUCKET + day(now)
    if bound_at is None:
        seconds = pods * gpus_per_pod * min(max(now - last, 0.0), 2 * period)
    else:
        ends = until if until is not None else [now] * len(bound_at)
        seconds = sum(gpus_per_pod * max(min(now, end) - max(last, bound), 0.0) for bound, end in zip(bound_at, ends))
    out[key] = str(int(float(out.get(key, "0") or 0) + seconds))
    out[LAST] = str(int(now))
    oldest = day(now - KEEP_DAYS * 86400)
    return {k: v for k, v in out.items() if not k.startswith(BUCKET) or k[len(BUCKET) :] >= oldest}


def week_hours(data: dict[str, str], now: float) -> float:
    """GPU-hours of the last 7 days (today included) in a usage ConfigMap's data."""
    first = day(now - (WEEK_DAYS - 1) * 86400)
    seconds = sum(float(v or 0) for k, v in data.items() if k.startswith(BUCKET) and k[len(BUCKET) :] >= first)
    return seconds / 3600


def rfc3339_seconds(text: Any) -> float | None:
    """'2026-05-28T10:00:00Z' (the API's timestamps) or '2026-05-28T10:00:00.123456Z' (a MicroTime: a Lease's
    renewTime) as seconds since the epoch; None when it is none."""
    whole, _, fraction = str(text).partition(".")
    if fraction:
        if not fraction.endswith("Z") or not fraction[:-1].isdigit():
            return None
        whole += "Z"
    try:
        seconds = float(calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None
    return seconds + (float("0." + fraction[:-1]) if fraction[:-1] else 0.0)


def own_pods(pods: list[dict[str, Any]], statefulset: str) -> list[dict[str, Any]]:
    """The StatefulSet's pods among `pods` (its ordinals: `<statefulset>-<n>`)."""
    out = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        if name.startswith(statefulset + "-") and name[len(statefulset) + 1 :].isdigit():
            out.append(pod)
    return out


def holds_gpus(pod: dict[str, Any]) -> bool:
    """Bound to a node and not finished (a crash-looping pod keeps its GPUs; a Pending or gated one has none)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


LOST_MARGIN = 60
"""Seconds past a pod's deletion grace after which, its node unreadable, a pod still there is lost (a live kubelet
kills it within the grace: kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer)."""


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def lost(
    pod: dict[str, Any], nodes: dict[str, dict[str, Any]] | None, now: float, beats: dict[str, float] | None = None
) -> tuple[float, str] | None:
    """(until when it is charged, why) for a pod holding GPUs whose node is lost; None while its node is up.

    With the nodes (`nodes`, by name; None: this reader may not list them): a node whose Ready condition is not True
    (False, or Unknown: the node lifecycle controller's word when the kubelet stopped posting, kubernetes
    pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth) ends the charge at the node's last
    heartbeat: `beats` (Nodes.read: the later of its Lease's renewTime and that condition's lastHeartbeatTime), else
    the condition's. A node that is gone ends it at the last heartbeat the recorder saw of it (`beats`, remembered from
    an earlier record) or, when later or none was seen, the pod's Ready condition's last transition (the node lifecycle
    controller marks the pods of a node it finds silent not ready: MarkPodsNotReady; pod GC removes such a pod soon:
    pkg/controller/podgc gcOrphaned). Without the
    nodes: a pod deleted longer ago than its grace plus LOST_MARGIN is lost since its deletion (a kubelet alive would
    have ended it; the taint manager deletes the pods of a NotReady node after their toleration,
    pkg/controller/tainteviction/taint_eviction.go), so the charge may run past the heartbeat by at most that time."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    meta = pod.get("metadata") or {}
    if nodes is not None and node:
        found = nodes.get(node)
        seen = (beats or {}).get(node)
        if found is None:
            ready = rfc3339_seconds(_condition(pod, "Ready").get("lastTransitionTime"))
            known = [t for t in (seen, ready) if t is not None]
            return (max(known) if known else now, f"on {node}, which is gone")
        cond = _condition(found, "Ready")
        if cond and cond.get("status") != "True":
            beat = seen if seen is not None else rfc3339_seconds(cond.get("lastHeartbeatTime"))
            return (beat if beat is not None else now, f"on {node}, NotReady")
        return None
    deleted = rfc3339_seconds(meta.get("deletionTimestamp"))
    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
    if deleted is not None and now > deleted + grace + LOST_MARGIN:
        return (deleted, f"on {node}, not ended {int(now - deleted)} s after its deletion")
    return None


def bound_at(pod: dict[str, Any], default: float) -> float:
    """When the pod was bound: its PodScheduled condition's transition to True (else its start, else `default`)."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            when = rfc3339_seconds(condition.get("lastTransitionTime"))
            if when is not None:
                return when
    when = rfc3339_seconds(status.get("startTime"))
    return default if when is None else when


def record(
    api: Client,
    namespace: str,
    statefulset: str,
    configmap: str,
    gpus_per_pod: int,
    period: float,
    now: float | None = None,
    selector: str = "",
    nodes_seen: Nodes | None = None,
) -> str:
    """One record; `nodes_seen` carries what the recorder knows of the nodes from one record to the next (`loop`)."""
    query = "?labelSelector=" + urllib.parse.quote(selector) if selector else ""
    pods = own_pods(api.call("GET", f"/api/v1/namespaces/{namespace}/pods{query}").get("items") or [], statefulset)
    now = time.time() if now is None else now
    reader = Nodes() if nodes_seen is None else nodes_seen
    nodes = reader.read(api)
    holding = [pod for pod in pods if holds_gpus(pod)]
    held = [bound_at(pod, now - period) for pod in holding]
    until = [(lost(pod, nodes, now, reader.beats) or (now, ""))[0] for pod in holding]
    path = f"/api/v1/namespaces/{namespace}/configmaps/{configmap}"
    current = api.call("GET", path).get("data") or {}
    data = add_usage(current, len(held), gpus_per_pod, now, period, bound_at=held, until=until)
    # A merge patch: keys it drops (older than KEEP_DAYS) are sent as null, which removes them.
    api.call("PATCH", path, {"data": {**{k: None for k in current if k not in data}, **data}}, "application/merge-patch+json")
    waiting = len(pods) - len(held)
    return (
        f"{namespace}/{statefulset}: {len(held)} pod(s) holding {gpus_per_pod} GPU(s) each"
        + (f", {waiting} not holding any" if waiting else "")
        + f"; today {int(data[BUCKET + day(now)]) / 3600:.2f} GPU-hours"
    )


NODE_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
"""Each kubelet's Lease, named after its node, renewed every 10 s (kubernetes pkg/kubelet/kubelet.go NewMainKubelet:
lease.NewController, renew interval NodeLeaseDurationSeconds 40 × nodeLeaseRenewIntervalFraction 0.25). The Node's
Ready condition is posted only when it changes or every nodeStatusReportFrequency (5 min by default:
pkg/kubelet/kubelet_node_status.go tryUpdateNodeStatus), so its lastHeartbeatTime alone may be 5 min behind."""


class Nodes:
    """What the recorder knows of the nodes, from one record to the next: `beats`, each node's last heartbeat seen
    (the later of its Lease's renewTime and its Ready condition's lastHeartbeatTime), kept for a node that is gone
    later. Reading them needs the cluster stack's rights (components/gpu_cluster.py _usage_node_reader: a ClusterRole
    for the nodes, a Role in kube-node-lease for the Leases, bound to its recorder and its environment stacks' at its
    `up`); without them (an environment added since, or usageReadsNodes false) the recorder reads the pods alone, as
    `lost` says, and prints so once."""

    def __init__(self) -> None:
        self.beats: dict[str, float] = {}
        self.said: set[str] = set()

    def _once(self, what: str, exc: BaseException, then: str) -> None:
        if what not in self.said:
            self.said.add(what)
            print(f"note: cannot read {what} ({exc}): {then}", flush=True)

    def read(self, api: Client) -> dict[str, dict[str, Any]] | None:
        """The cluster's nodes by name, or None where this reader may not list them (cluster-scoped)."""
        try:
            items = api.call("GET", "/api/v1/nodes").get("items") or []
        except (OSError, ValueError) as exc:
            self._once(
                "the cluster's nodes",
                exc,
                "a pod whose node is lost is charged until its deletion (the pods alone; the cluster stack's `pulumi up` "
                "with lifecycle.usageReadsNodes grants the nodes to its recorder and its environment stacks')",
            )
            return None
        nodes = {str((n.get("metadata") or {}).get("name")): n for n in items}
        renewed: dict[str, float] = {}
        try:
            for lease in api.call("GET", NODE_LEASES).get("items") or []:
                when = rfc3339_seconds((lease.get("spec") or {}).get("renewTime"))
                if when is not None:
                    renewed[str((lease.get("metadata") or {}).get("name"))] = when
        except (OSError, ValueError) as exc:
            self._once("the nodes' Leases", exc, "a lost node's heartbeat is its Ready condition's (up to 5 min early)")
        for name, node in nodes.items():
            known = [t for t in (renewed.get(name), rfc3339_seconds(_condition(node, "Ready").get("lastHeartbeatTime"))) if t]
            if known:
                self.beats[name] = max([*known, self.beats.get(name, 0.0)])
        return nodes


def run_loop(
    api: Client, namespace: str, statefulset: str, configmap: str, gpus: int, period: float, rounds: int | None = None, selector: str = ""
) -> int:
    """Record every `period` seconds; a failed record is logged and retried next period (never exits on its own)."""
    done = 0
    seen = Nodes()
    while rounds is None or done < rounds:
        try:
            print(record(api, namespace, statefulset, configmap, gpus, period, selector=selector, nodes_seen=seen), flush=True)
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


IDLE_AGENT = contract.IDLE_AGENT_MANAGER
NOTE = (
    "note: each record is the ConfigMap <environment>-usage, written by the recorder's own ServiceAccount; "
    "whoever may edit ConfigMaps in its namespace (its admins and editors) can change it too"
)


def replicas_set_by_idle_agent(sts: dict[str, Any]) -> bool | None:
    """Whether the idle agent is the one that last set spec.replicas (None: the object carries no managedFields).

    The API server records who owns each field (k8s.io/apimachinery pkg/apis/meta/v1 ManagedFieldsEntry): the agent's
    scale PUT makes it the owner of spec.replicas; a later `pulumi up` (suspend or resume) applies replicas and takes it.
    """
    entries = (sts.get("metadata") or {}).get("managedFields")
    if not entries:
        return None
    for entry in entries:
        spec = ((entry.get("fieldsV1") or {}).get("f:spec")) or {}
        if entry.get("manager") == IDLE_AGENT and "f:replicas" in spec:
            return True
    return False


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why a pod of a running environment does not do its work: pending (with the scheduler's reason) or crash-looping."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return f"{name} crash-looping ({container.get('restartCount', 0)} restarts)"
    if holds_gpus(pod):
        return None
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    if gates:
        return f"{name} pending: gated by {', '.join(str(g) for g in gates)}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "not scheduled"
            message = " ".join(str(condition.get("message") or "").split())
            return f"{name} pending: {reason}" + (f" ({message[:120]})" if message else "")
    return f"{name} pending: {status.get('phase') or 'not scheduled yet'}"


def environments(items: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """One row per environment StatefulSet among live `items`: owner, namespace, size, state, GPU-hours this week.

    With the pods among `items`, a running environment's state says how many pods hold their GPUs and why the others
    do not (pending with the scheduler's reason, gated, crash-looping).
    """
    maps = {((o["metadata"].get("namespace")), o["metadata"]["name"]): o for o in items if o.get("kind") == "ConfigMap"}
    pods_listed = any(o.get("kind") == "Pod" for o in items)
    listed_nodes = [o for o in items if o.get("kind") == "Node"]
    nodes = {str(o["metadata"].get("name")): o for o in listed_nodes} if listed_nodes else None
    rows = []
    for sts in (o for o in items if o.get("kind") == "StatefulSet"):
        meta = sts["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        replicas = int((sts.get("spec") or {}).get("replicas") or 0)
        record = (maps.get((ns, f"{name}-idle-stop")) or {}).get("data") or {}
        if replicas:
            state = "running"
            if pods_listed:
                own = own_pods([o for o in items if o.get("kind") == "Pod" and o["metadata"].get("namespace") == ns], name)
                gone = {str(p["metadata"].get("name")): why for p in own if holds_gpus(p) and (why := lost(p, nodes, now)) is not None}
                held = sum(1 for p in own if holds_gpus(p) and str(p["metadata"].get("name")) not in gone)
                problems = [f"{pod} lost ({why[1]}; charged until {charged_until_text(why[0])})" for pod, why in sorted(gone.items())]
                problems += [p for p in (pod_problem(x) for x in own if str(x["metadata"].get("name")) not in gone) if p]
                missing = replicas - len(own)
                if missing > 0:
                    problems.append(f"{missing} pod(s) not created (oc describe statefulset {name})")
                if problems:
                    word = "lost" if gone else ("running" if held else "pending")
                    state = f"{word} {held}/{replicas}: " + "; ".join(problems)
        else:
            by_agent = replicas_set_by_idle_agent(sts)
            stopped = record.get("stoppedAt")
            if by_agent is None:
                state = "idle-stopped" if record else "suspended"
            else:
                state = f"idle-stopped {stopped}" if by_agent and stopped else ("idle-stopped" if by_agent else "suspended")
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


def charged_until_text(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


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
        try:  # the pods (their templates carry part-of, not the cluster label): why a running environment holds no GPUs
            part_of = urllib.parse.quote(f"{contract.PART_OF_LABEL}={contract.PART_OF}")
            pods = api.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={part_of}")
        except (OSError, ValueError):
            continue
        items += [{**item, "kind": "Pod"} for item in pods.get("items") or []]
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
        p.add_argument("--selector", default="", help="label selector of the StatefulSet's pods (k=v,k=v)")
    st = sub.add_parser("status", help="every environment of a cluster")
    st.add_argument("--from-json", help=f"a List as `oc get statefulsets,configmaps -A -l {CLUSTER_LABEL}=<c> -o json` prints (- = stdin)")
    st.add_argument("--cluster", help="with the API: only this cluster's objects (default: every ml-dev-env object of --namespace)")
    st.add_argument("--namespace", action="append", default=[], help="namespaces to read with the API (repeatable)")
    st.add_argument("--json", action="store_true", help="rows as JSON")
    args = parser.parse_args(argv)
    if args.cmd == "loop":
        return run_loop(Api(), args.namespace, args.statefulset, args.configmap, args.gpus_per_pod, args.period, selector=args.selector)
    try:
        if args.cmd == "record":
            print(
                record(Api(), args.namespace, args.statefulset, args.configmap, args.gpus_per_pod, args.period, selector=args.selector),
                flush=True,
            )
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
    sys.stdout.write(json.dumps(rows, indent=2) + "\n" if args.json else table(rows) + NOTE + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
