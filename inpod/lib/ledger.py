"""The start ledger: where one start (or resume) of each pod spent its time, from what the namespace's API and the pod
itself can read — no node-level access.

A pod's start is a chain of boundaries (contract.START_PHASES), each read where it is recorded:

* admitted — Kueue: the pod's Workload's `Admitted` condition (`lastTransitionTime`); while it waits, the Workload's
  `QuotaReserved` message says what blocks it. No Kueue: the pod's creation (0 s).
* scheduled — the pod's `PodScheduled` condition (True), and the node.
* volumes — the pod's `PodReadyToStartContainers` condition: the kubelet mounts the volumes before it creates the
  sandbox (kubernetes pkg/kubelet/kubelet.go, Kubelet.SyncPod: "Wait for volumes to attach/mount",
  volumeManager.WaitForAttachAndMount, then "Call the container runtime's SyncPod callback"), so it marks volumes
  attached and mounted, sandbox and network up.
* image — the kubelet's `Pulled` events (pkg/kubelet/images/image_manager.go, EnsureImageExists: `Container image
  "<image>" already present on machine`, or `Successfully pulled image "<image>" in <d> (<d> including waiting). Image
  size: <n> bytes.`), all after the sandbox: pkg/kubelet/kuberuntime/kuberuntime_manager.go,
  kubeGenericRuntimeManager.SyncPod creates the sandbox (createPodSandbox), pulls the pod's image volumes
  (getImageVolumes: EnsureImageExists on the pod, so their events carry no fieldPath — models[].mountInEnv) and then
  starts the containers (startContainer in kuberuntime_container.go, whose "Step 1: pull the image" is
  EnsureImageExists, the event on `spec.containers{<name>}`). The phase ends at the last of them.
* started — the main container's `state.running.startedAt`.
* sshd, fabric-gate, first-rank — the pod's own programs, each once per container (`$ML_DEV_STATE_DIR/start-marks/
  <phase>`, `mark`): sshd.sh when sshd listens, the fabric gate when it passes, the first rank of `ml-dev run`.

Each phase lasts from the previous boundary to its own, so the phases of a pod add up to its wall time (creation to
the last boundary read) exactly; a boundary not (yet) recorded adds 0 s and its time goes to the next recorded one. The
API's timestamps have one-second resolution (RFC 3339 without fraction): each boundary is within a second of the event.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from .. import contract

MAIN_CONTAINER = "ml-dev"
"""The main container of every GPU pod (core/naming.py MAIN_CONTAINER)."""
KUEUE_WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads"

PULLED = re.compile(
    r'^Successfully pulled image "(?P<image>[^"]+)" in (?P<took>\S+)'
    r"(?: \((?P<waiting>\S+) including waiting\))?(?:\. Image size: (?P<size>\d+) bytes\.)?"
)
PRESENT = re.compile(r'^Container image "(?P<image>[^"]+)" already present on machine')
GO_DURATION = re.compile(r"(?P<value>[0-9.]+)(?P<unit>ns|us|µs|ms|s|m|h)")
GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def api_time(value: Any) -> float | None:
    """An API timestamp (RFC 3339, `Z`, with or without a fraction) as epoch seconds; None when absent."""
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    match = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", text)
    if not match:
        return None
    base = datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
    offset = match.group(3) or "+00:00"
    sign = -1 if offset.startswith("-") else 1
    hours, _, minutes = offset[1:].partition(":")
    delta = datetime.timedelta(hours=int(hours or 0), minutes=int(minutes or 0)) * sign
    epoch = (base - delta).replace(tzinfo=datetime.timezone.utc).timestamp()
    return epoch + (float(match.group(2)) if match.group(2) else 0.0)


def go_duration(text: str | None) -> float | None:
    """A Go `time.Duration` string (`313ms`, `7.264s`, `1m2.5s`, `2h0m3s`) in seconds."""
    if not text:
        return None
    parts = GO_DURATION.findall(text)
    if not parts or "".join(v + u for v, u in parts) != text:
        return None
    return sum(float(v) * GO_UNITS[u] for v, u in parts)


def event_time(event: dict[str, Any]) -> float | None:
    """When an event (core/v1 or events.k8s.io) happened last: lastTimestamp, eventTime, series, firstTimestamp."""
    series = (event.get("series") or {}).get("lastObservedTime")
    for value in (event.get("lastTimestamp"), series, event.get("eventTime"), event.get("firstTimestamp")):
        at = api_time(value)
        if at is not None:
            return at
    return api_time((event.get("metadata") or {}).get("creationTimestamp"))


def size_text(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def pull_detail(message: str) -> str | None:
    """What one Pulled event says: "image present", "pulled <size> in <s> s (<s> s with waiting)", or None."""
    pulled, present = PULLED.match(message), PRESENT.match(message)
    if present:
        return "image present"
    if not pulled:
        return None
    took, waiting, size = go_duration(pulled.group("took")), go_duration(pulled.group("waiting")), pulled.group("size")
    detail = "pulled" + (f" {size_text(int(size))}" if size else "") + (f" in {took:.0f} s" if took is not None else "")
    if waiting is not None and took is not None and waiting - took >= 1:
        detail += f" ({waiting:.0f} s with waiting)"
    return detail


def image_boundary(events: list[dict[str, Any]], uid: str, container: str = MAIN_CONTAINER) -> tuple:
    """(time, detail) of this pod's (uid) images: the main container's last Pulled event and its image volumes' (the
    kubelet pulls those first, their events on the pod without a fieldPath: models[].mountInEnv), the boundary the last
    of them; else (None, ""). Without an event on the container, one on the pod is the container's (older records)."""
    own: tuple = (None, "")
    volumes: dict[str, tuple] = {}
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if involved.get("uid") != uid or event.get("reason") != "Pulled":
            continue
        field = involved.get("fieldPath")
        if field not in (None, "", f"spec.containers{{{container}}}"):
            continue
        at = event_time(event)
        message = event.get("message") or event.get("note") or ""
        detail = pull_detail(message)
        if detail is None or at is None:
            continue
        if field:
            if own[0] is None or at >= own[0]:
                own = (at, detail)
        else:
            match = PULLED.match(message) or PRESENT.match(message)
            image = match.group("image") if match else "?"
            if image not in volumes or at >= volumes[image][0]:
                volumes[image] = (at, detail)
    if own[0] is None and volumes:  # no container-level event: the pod-level one is the container's
        image, own = max(volumes.items(), key=lambda kv: kv[1][0])
        del volumes[image]
    if own[0] is None:
        return (None, "")
    if not volumes:
        return own
    shown = "; ".join(f"{image.rpartition('/')[2][:40]} {detail}" for image, (_, detail) in sorted(volumes.items()))
    return (max([own[0], *(at for at, _ in volumes.values())]), f"{own[1]}; image volumes: {shown}")


def condition_time(pod: dict[str, Any], kind: str) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return api_time(condition.get("lastTransitionTime"))
    return None


def container_started(pod: dict[str, Any], container: str = MAIN_CONTAINER) -> float | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return api_time(((status.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


KUEUE_GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"


def workload_of(pod: dict[str, Any], workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Kueue Workload that admits this pod.

    Kueue's StatefulSet integration (kubernetes-sigs/kueue pkg/controller/jobs/statefulset) builds one Workload per
    StatefulSet (statefulset_reconciler.go constructWorkload: named GetWorkloadName(uid, name), jobframework
    GetWorkloadNameForOwnerWithGVK `statefulset-<name>-<hash>`, owned by the StatefulSet: SetOwnerReference(sts, wl)),
    and names it on each of its pods (statefulset_pod_reconciler.go setDefault: SetPodGroupName and
    SetPrebuiltWorkloadName, the `kueue.x-k8s.io/pod-group-name` and `…/prebuilt-workload-name` label, or annotation
    under the WorkloadIdentifierAnnotations gate). So: the Workload the pod names; else one owned by the pod (a plain
    pod group's) or by the pod's controller (the StatefulSet)."""
    meta = pod.get("metadata") or {}
    named = {
        str(found.get(key))
        for found in (meta.get("labels") or {}, meta.get("annotations") or {})
        for key in (KUEUE_GROUP_NAME, KUEUE_PREBUILT_WORKLOAD)
        if found.get(key)
    }
    for workload in workloads:
        if (workload.get("metadata") or {}).get("name") in named:
            return workload
    owners = {meta.get("uid")} | {ref.get("uid") for ref in meta.get("ownerReferences") or [] if ref.get("controller")}
    owners.discard(None)
    for workload in workloads:
        if any(ref.get("uid") in owners for ref in (workload.get("metadata") or {}).get("ownerReferences") or []):
            return workload
    return None


def admission(pod: dict[str, Any], workload: dict[str, Any] | None, namespace: str) -> tuple:
    """(time, detail) of the pod's admission: Kueue's Admitted condition, what blocks it while it waits, or no queue."""
    if workload is None:
        return api_time((pod.get("metadata") or {}).get("creationTimestamp")), "no queue"
    queue = (workload.get("spec") or {}).get("queueName", "?")
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted") or {}
    if admitted.get("status") == "True":
        return api_time(admitted.get("lastTransitionTime")), f"queue {queue}"
    waiting = (conditions.get("QuotaReserved") or {}).get("message") or "pending"
    where = f"/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
    return None, f"queue {queue}: {waiting} (position: oc get --raw {where})"


def pod_ledger(
    pod: dict[str, Any], events: list[dict[str, Any]], marks: dict[str, float], workload: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One pod's start: every phase with its boundary (`at`), its seconds and what was read, and the wall time."""
    meta = pod.get("metadata") or {}
    created = api_time(meta.get("creationTimestamp"))
    if created is None:
        raise ValueError(f"pod {meta.get('name')}: no creationTimestamp")
    ns = meta.get("namespace", "")
    admitted, admitted_detail = admission(pod, workload, ns)
    image_at, image_detail = image_boundary(events, meta.get("uid", ""))
    boundaries = {
        "admitted": (admitted, admitted_detail),
        "scheduled": (condition_time(pod, "PodScheduled"), (pod.get("spec") or {}).get("nodeName") or ""),
        "volumes": (condition_time(pod, "PodReadyToStartContainers"), ""),
        "image": (image_at, image_detail),
        "started": (container_started(pod), ""),
        **{phase: (marks.get(phase), "") for phase in contract.START_IN_POD},
    }
    phases: list[dict[str, Any]] = []
    previous = created
    for phase in contract.START_PHASES:
        at, detail = boundaries[phase]
        if at is None:
            phases.append({"phase": phase, "at": None, "seconds": 0.0, "detail": detail or "not recorded"})
            continue
        at = max(at, previous)  # one-second timestamps: never before the boundary it follows
        phases.append({"phase": phase, "at": at, "seconds": at - previous, "detail": detail})
        previous = at
    dominant = max(phases, key=lambda p: float(p["seconds"]))
    return {
        "pod": meta.get("name", "?"),
        "uid": meta.get("uid", ""),
        "node": (pod.get("spec") or {}).get("nodeName") or "",
        "created": created,
        "end": previous,
        "wall": previous - created,
        # the fabric gate runs only where fabricCheck.onDeploy holds pod 0: a start is done without it
        "done": all(p["at"] is not None for p in phases if p["phase"] != contract.START_FABRIC),
        "dominant": dominant["phase"] if dominant["seconds"] > 0 else "",
        "phases": phases,
    }


def start_ledger(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The environment's start: its pods' ledgers, the slowest pod and its dominant phase."""
    if not pods:
        return {"id": "", "pods": [], "wall": 0.0, "slowest": None}
    begin = min(p["created"] for p in pods)
    slowest = max(pods, key=lambda p: p["end"])
    return {
        "id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(begin)),
        "begin": begin,
        "wall": max(p["end"] for p in pods) - begin,
        "slowest": {"pod": slowest["pod"], "wall": slowest["wall"], "phase": slowest["dominant"]},
        "pods": pods,
    }


def phase_seconds(pod: dict[str, Any], phase: str) -> float:
    return next((p["seconds"] for p in pod["phases"] if p["phase"] == phase), 0.0)


def start_summary(start: dict[str, Any]) -> str:
    """One line: the start's wall time, the slowest pod and its dominant phase with what was read there."""
    if not start.get("pods"):
        return "start ledger: no pods"
    slow = start["slowest"]
    pod = next(p for p in start["pods"] if p["pod"] == slow["pod"])
    phase = slow["phase"]
    detail = next((p["detail"] for p in pod["phases"] if p["phase"] == phase), "")
    waiting = "" if all(p["done"] for p in start["pods"]) else " (still starting)"
    what = f"mostly {phase} ({phase_seconds(pod, phase):.0f} s{': ' + detail if detail else ''})" if phase else "no phase recorded"
    return (
        f"start {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(start['begin']))}: {len(start['pods'])} pods in "
        f"{start['wall']:.0f} s{waiting}; slowest {slow['pod']} ({slow['wall']:.0f} s), {what}"
    )


def compare(last: dict[str, Any], before: dict[str, Any]) -> str:
    """One line: this start against the previous one — both wall times, the difference, and the phases of each start's
    slowest pod that changed by a second or more, the largest change first (at most three)."""

    def slowest_phases(start: dict[str, Any]) -> dict[str, float]:
        name = (start.get("slowest") or {}).get("pod")
        pod = next((p for p in start.get("pods", []) if p.get("pod") == name), None)
        return {phase: phase_seconds(pod, phase) for phase in contract.START_PHASES} if pod else {}

    now, then = float(last.get("wall", 0)), float(before.get("wall", 0))
    ours, theirs = slowest_phases(last), slowest_phases(before)
    changed = [(ours[p] - theirs[p], p) for p in contract.START_PHASES if p in ours and p in theirs and abs(ours[p] - theirs[p]) >= 1]
    changed.sort(key=lambda c: -abs(c[0]))
    verdict = "same time" if abs(now - then) < 1 else f"{abs(now - then):.0f} s {'faster' if now < then else 'slower'}"
    phases = ", ".join(f"{phase} {delta:+.0f} s" for delta, phase in changed[:3])
    return f"against the previous start {before.get('id')} ({then:.0f} s): {now:.0f} s, {verdict}" + (f" ({phases})" if phases else "")


def start_table(start: dict[str, Any]) -> list[str]:
    """One row per pod: node, seconds per phase, wall; the summary line last."""
    head = f"  {'pod':<22} {'node':<20} " + " ".join(f"{p:>11}" for p in contract.START_PHASES) + f" {'wall':>7}"
    rows = [head]
    for pod in start.get("pods", []):
        cells = " ".join(f"{p['seconds']:>10.0f}s" if p["at"] is not None else f"{'-':>11}" for p in pod["phases"])
        rows.append(f"  {pod['pod']:<22} {pod['node'][:20]:<20} {cells} {pod['wall']:>6.0f}s")
    return [*rows, start_summary(start)]


# ------------------------------------------------------------------------------------------ the pod's own marks


def marks_dir(state: Path | None = None) -> Path:
    return (state or Path(os.environ.get(contract.STATE_DIR_ENV, contract.STATE_DIR))) / contract.START_MARKS_DIR


def mark(phase: str, state: Path | None = None, now: float | None = None) -> bool:
    """Record that this container reached `phase` (once: the first program to reach it writes it). Never raises."""
    path = marks_dir(state) / phase
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(f"{time.time() if now is None else now:.3f}\n")
    return True


MARKS_SCRIPT = (
    r"""
for f in "${@STATE_ENV@:-@STATE@}/@MARKS@/"*; do [ -f "$f" ] && printf '%s %s\n' "${f##*/}" "$(cat "$f")"; done; true
""".replace("@STATE_ENV@", contract.STATE_DIR_ENV)
    .replace("@STATE@", contract.STATE_DIR)
    .replace("@MARKS@", contract.START_MARKS_DIR)
)
"""Prints a pod's marks, `<phase> <time>` a line (`ml-dev status --start` runs it over SSH, `make status` by `oc exec`)."""


def parse_marks(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        phase, _, value = line.partition(" ")
        try:
            found[phase] = float(value)
        except ValueError:
            continue
    return {k: v for k, v in found.items() if k in contract.START_IN_POD}


def read_marks(state: Path | None = None) -> dict[str, float]:
    found = {}
    for phase in contract.START_IN_POD:
        try:
            found[phase] = float((marks_dir(state) / phase).read_text().strip())
        except (OSError, ValueError):
            continue
    return found


# ------------------------------------------------------------------------------------------ the API and the records


def read_api(call: Any, namespace: str, app: str) -> tuple:
    """(pods, events, workloads) of the environment from the namespace's API; `call(path)` returns the parsed JSON.
    Kueue's Workloads are optional (no Kueue, or no right to list them: none)."""
    selector = f"app.kubernetes.io/name%3Dml-dev-env%2Capp.kubernetes.io/instance%3D{app}"
    pods = call(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}").get("items") or []
    events = call(f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.kind%3DPod").get("items") or []
    try:
        workloads = call(KUEUE_WORKLOADS.format(ns=namespace)).get("items") or []
    except (OSError, ValueError):  # urllib's HTTPError (404: no Kueue; 403: no right) is an OSError
        workloads = []
    return pods, events, workloads


def build(
    pods: list[dict[str, Any]], events: list[dict[str, Any]], workloads: list[dict[str, Any]], marks: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The start ledger of the pods as they are now (marks: the in-pod marks per pod name)."""
    ordered = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", ""))
    ledgers = [pod_ledger(p, events, marks.get((p.get("metadata") or {}).get("name", ""), {}), workload_of(p, workloads)) for p in ordered]
    return start_ledger(ledgers)


def keep_start(records: Path, start: dict[str, Any], last: int = contract.START_LEDGER_KEEP) -> Path | None:
    """Write the start under `<records>/starts/<id>.json` (rewritten while the start goes on) and keep the last `last`."""
    if not start.get("id"):
        return None
    folder = records / contract.START_LEDGER_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{start['id']}.json"
        tmp = folder / f".{start['id']}.json.tmp"
        tmp.write_text(json.dumps(start, indent=1) + "\n")
        tmp.replace(path)
        for old in sorted(folder.glob("*.json"))[:-last]:
            old.unlink()
        return path
    except OSError:
        return None


def kept(records: Path) -> list[dict[str, Any]]:
    """The kept starts, oldest first."""
    out = []
    for path in sorted((records / contract.START_LEDGER_DIR).glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out
