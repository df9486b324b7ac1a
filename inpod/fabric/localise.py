"""Localisation after a failed gate: pairwise all-reduce rounds (log2 n), then per-HCA ib_write_bw from each
suspect pod to a cleared partner.

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from .allreduce import all_reduce, corruption, plateau
from .parse import parse_ib_write_bw
from .util import PROGRAM, env, remote, run


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Hypercube pairing: round k pairs pod i with pod i XOR 2^k, so ceil(log2 n) rounds give every pod
    log2 n different partners. When n is not a power of two the missing partner is replaced by
    (i + 2^k) mod n, then by the next pod not yet paired with i; no pair is tested twice."""
    rounds: list[list[tuple[int, int]]] = []
    seen: set[tuple[int, int]] = set()
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        pairs = []
        for i in range(n):
            j = i ^ (1 << k)
            if j >= n:
                j = (i + (1 << k)) % n
            for step in range(n):
                candidate = (j + step) % n
                pair = (min(i, candidate), max(i, candidate))
                if candidate != i and pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
                    break
                if candidate == j and candidate != i and step == 0 and j == i ^ (1 << k):
                    break  # the hypercube partner was already tested from the other side
        if pairs:
            rounds.append(pairs)
    return rounds


def suspects_from_pairs(n: int, pairs: list[dict]) -> tuple[list[int], list[int]]:
    """(suspects, cleared): a pod with at least one passing pair is cleared; a pod all of whose pairs
    failed while it had a cleared partner is suspect."""
    cleared = {i for p in pairs if p["pass"] for i in p["index"]}
    suspects = []
    for i in range(n):
        mine = [p for p in pairs if i in p["index"]]
        if mine and i not in cleared and all(not p["pass"] for p in mine):
            partners = {j for p in mine for j in p["index"] if j != i}
            if partners & cleared:
                suspects.append(i)
    return suspects, sorted(cleared)


def hca_addresses(host: str, hcas: list[str]) -> dict[str, tuple[str | None, str | None, str]]:
    """{hca: (netdev, IPv4, error)} of the interface behind each HCA on `host`, as that pod's sysfs says
    (`fabric_check.py netdev`, one SSH command for all of them): SR-IOV pods number their VF interfaces netN per
    pod, so the same index in network.rdma.hcas and network.rdma.interfaces need not be the same NIC."""
    res = run(remote(host, [env("ML_DEV_PYTHON", "python3"), str(PROGRAM), "netdev", *hcas]), timeout=60)
    try:
        listed = json.loads(res.stdout.strip().splitlines()[-1])
        answers = {str(item["hca"]): item for item in listed}
    except (ValueError, IndexError, KeyError, TypeError):
        answers = {}
    out: dict[str, tuple[str | None, str | None, str]] = {}
    for hca in hcas:
        found = answers.get(hca)
        if found is None:
            out[hca] = (None, None, (res.stderr.strip() or f"`fabric_check.py netdev {hca}` on {host} gave no answer")[-300:])
            continue
        inet = found.get("inet") or []
        if not found.get("netdev"):
            out[hca] = (None, None, f"{hca} on {host} has no network interface in sysfs (/sys/class/infiniband/{hca}/device/net/)")
        elif not inet:
            out[hca] = (found["netdev"], None, f"{host} has no IPv4 address on {found['netdev']} (the interface of {hca})")
        else:
            out[hca] = (found["netdev"], inet[0].split("/")[0], "")
    return out


SERVER_RETRY_SECONDS = 0.5


def client_of(server: subprocess.Popen, client: list[str]) -> subprocess.CompletedProcess:
    """Run the ib_write_bw client as soon as the server listens. perftest's client tries the server's TCP port once
    and exits with "Couldn't connect to <host>:<port>" (perftest src/perftest_communication.c
    ethernet_client_connect); the server listens only after opening its device (ib_write_bw.c: establish_connection
    after ctx_open_device and create_comm_struct) and prints its banner before it, block-buffered. So the client is
    tried again every SERVER_RETRY_SECONDS while the server runs, for up to $ML_DEV_FABRIC_SERVER_WAIT s (30): no
    fixed wait that a slow device open outlasts."""
    deadline = time.monotonic() + float(env("ML_DEV_FABRIC_SERVER_WAIT", "30"))
    while True:
        res = run(client, timeout=120)
        if res.returncode == 0 or "Couldn't connect to" not in res.stderr:
            return res
        if server.poll() is not None or time.monotonic() >= deadline:
            return res
        time.sleep(SERVER_RETRY_SECONDS)


def nic_bandwidth(cfg: dict, suspect: str, partner: str) -> list[dict]:
    """Per-HCA ib_write_bw from the suspect to a cleared partner: each HCA against the partner's HCA of the
    same name, at the address of the partner's own interface for that HCA."""
    results = []
    gid = cfg.get("gidIndex")
    link = cfg.get("linkGbps")
    exp = cfg.get("expectation") or {}
    need = link * exp.get("efficiency", 1.0) * exp.get("threshold_fraction", 0.9) if link else None
    hcas = cfg.get("hcas") or [h for h in env("NCCL_IB_HCA").split(",") if h]  # hcaMode auto: what startup detected
    names = [hca.partition(":")[0] for hca in hcas]
    here, there = (hca_addresses(suspect, names), hca_addresses(partner, names)) if names else ({}, {})
    for i, hca in enumerate(hcas):
        name, _, ib_port = hca.partition(":")
        local_if = here[name][0]
        iface, address, error = there[name]
        entry = {"pod": suspect, "partner": partner, "hca": name, "interface": local_if, "partnerInterface": iface, "gbps": None}
        entry["pass"] = False
        if not address:
            entry["error"] = error
            results.append(entry)
            continue
        port = str(18515 + i)
        base = ["ib_write_bw", "-d", name, "-i", ib_port or "1", "-F", "--report_gbits", "-D", "5", "-p", port]
        if gid is not None:
            base += ["-x", str(gid)]
        server = subprocess.Popen(remote(partner, base), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        client = client_of(server, remote(suspect, [*base, address]))
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
        parsed = parse_ib_write_bw(client.stdout)
        if parsed is None:
            entry["error"] = (client.stderr.strip() or "no bandwidth report")[-500:]
        else:
            entry["gbps"] = parsed["gbps"]
            entry["pass"] = need is None or parsed["gbps"] >= need
        entry["need_gbps"] = round(need, 2) if need else None
        results.append(entry)
    return results


def localise_pods(cfg: dict, result: dict, hosts: list[str], pods: list[str], gpus: int, max_bytes: int, workdir: Path) -> None:
    """After a failed full run: pairwise rounds (a pair fails when slow or corrupt), then per-HCA ib_write_bw
    from each suspect to a cleared partner. Adds pairs, suspects, nics and diagnosis lines to `result`."""
    exp = result.get("expectation")
    min_plateau = result["plateauMinBytes"]
    for k, pairs in enumerate(pair_rounds(len(hosts)), start=1):
        for a, b in pairs:
            run2 = all_reduce([hosts[a], hosts[b]], gpus, min_plateau, max_bytes, workdir, f"{a}-{b}")
            bw = plateau(run2["rows"], min_plateau)
            corrupt = corruption(run2)
            ok = not corrupt and run2["rc"] == 0 and bw is not None and (not exp or bw >= exp["pass_busbw_gbs"])
            pair = {"round": k, "index": [a, b], "pods": [pods[a], pods[b]], "busbw": bw, "pass": ok}
            if corrupt:
                pair["corrupt"] = corrupt
            result["pairs"].append(pair)
    suspects, cleared = suspects_from_pairs(len(hosts), result["pairs"])
    result["suspects"] = [pods[i] for i in suspects]
    corrupt_pairs = [p for p in result["pairs"] if p.get("corrupt")]
    for p in corrupt_pairs:
        result["diagnosis"].append(f"data corruption between {p['pods'][0]} and {p['pods'][1]}: {p['corrupt']}")
    if result["pairs"] and all(not p["pass"] for p in result["pairs"]):
        result["diagnosis"].append(
            "every pair fails: a fabric-wide cause (NCCL settings, MTU, switch QoS, IOMMU on every node); run `preflight --all`"
        )
    elif result["pairs"] and not suspects and all(p["pass"] for p in result["pairs"]):
        result["diagnosis"].append(
            "every pair reaches the expectation but the full ring does not: placement across racks or "
            "switch oversubscription; set fabricCheck.nodeRacks so consecutive ranks share a rack"
        )
    elif result["pairs"] and not suspects:
        result["diagnosis"].append("failing pairs do not single out a pod: see the pair table")
    for i in suspects:
        partner = next((hosts[j] for j in cleared if j != i), None)
        if partner is None:
            continue
        if cfg.get("mode") == "rdma":
            nics = nic_bandwidth(cfg, hosts[i], partner)
            for n in nics:
                n["pod"] = pods[i]
            result["nics"].extend(nics)
            bad = [n for n in nics if not n["pass"]]
            for n in bad:
                got = f"{n['gbps']:g} Gb/s" if n["gbps"] is not None else n.get("error", "no result")
                result["diagnosis"].append(f"{pods[i]} {n['hca']} ({n['interface']}): ib_write_bw {got}, need {n.get('need_gbps')} Gb/s")
            if not bad:
                result["diagnosis"].append(f"{pods[i]}: every HCA reaches line rate alone; check its GPUs/PCIe (nvidia-smi topo -m)")
        else:
            result["diagnosis"].append(f"{pods[i]}: every pair with it {'corrupts data' if corrupt_pairs else 'is slow'}")
