"""Parsers of the tools' output, the one place that knows their formats (tests/inpod/fabric/data/SOURCES.md,
tests/data/tool_output/PROVENANCE.md: each format from the tool's source, checked on real output).

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import re


def parse_ibv_devinfo_list(text: str) -> list[str]:
    """`ibv_devinfo -l`: a "N HCAs found:" header, then one tab-indented device name per line."""
    return [line.strip() for line in text.splitlines() if line.strip() and not re.match(r"^\d+ HCAs? found:", line.strip())]


def parse_ibstat(text: str) -> dict[str, dict[int, dict[str, str]]]:
    """`ibstat [ca]`: "CA 'mlx5_6'" blocks with "Port N:" sub-blocks of "Key: value" lines."""
    cas: dict[str, dict[int, dict[str, str]]] = {}
    ca = None
    port = None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            ca, port = m.group(1), None
            cas[ca] = {}
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m and ca is not None:
            port = int(m.group(1))
            cas[ca][port] = {}
            continue
        m = re.match(r"^\s+([^:]+):\s*(.*)$", line)
        if m and ca is not None and port is not None:
            cas[ca][port][m.group(1).strip()] = m.group(2).strip()
    return cas


def parse_ip_addr(text: str) -> dict[str, dict]:
    """`ip addr show [dev X]`: "3: net1@if9: <...> mtu 9000 ... state UP" then "inet a.b.c.d/nn" lines."""
    links: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)(?:@[^:\s]+)?:\s+<([^>]*)>(.*)$", line)
        if m:
            current = m.group(1)
            mtu = re.search(r"\bmtu (\d+)", m.group(3))
            state = re.search(r"\bstate (\S+)", m.group(3))
            links[current] = {
                "flags": m.group(2).split(","),
                "mtu": int(mtu.group(1)) if mtu else None,
                "state": state.group(1) if state else None,
                "inet": [],
            }
            continue
        m = re.match(r"^\s+inet (\d+\.\d+\.\d+\.\d+)/(\d+)", line)
        if m and current is not None:
            links[current]["inet"].append(f"{m.group(1)}/{m.group(2)}")
    return links


def parse_nvidia_smi_list(text: str) -> list[str]:
    """`nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" per GPU (MIG lines are indented)."""
    return [line for line in text.splitlines() if re.match(r"^GPU \d+: ", line)]


def parse_proc_limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/<pid>/limits: "Limit  Soft Limit  Hard Limit  Units" columns separated by 2+ spaces."""
    limits = {}
    for line in text.splitlines()[1:]:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 3:
            limits[parts[0]] = (parts[1], parts[2])
    return limits


def parse_nccl_tests(text: str) -> dict:
    """nccl-tests performance output (src/common.cu writeBenchmarkLine*): one row per size,
    `size count type redop root` then out-of-place and in-place `time algbw busbw #wrong` (#wrong is printed
    with %g by older releases: `1.04858e+06`; `N/A` without validation), the "# Using devices" rank lines
    (src/util.cu: `#  Rank %2d Group %2d Pid %6d on %10s device %2d [...] %s`) and the footer
    `# Out of bounds values : N OK|FAILED` (src/util.cu)."""
    rows = []
    ranks = []
    avg = None
    out_of_bounds = 0
    wrong_total = 0.0
    for line in text.splitlines():
        m = re.match(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", line)
        if m:
            avg = float(m.group(1))
            continue
        m = re.match(r"^#\s*Out of bounds values\s*:\s*(\d+)", line)
        if m:
            out_of_bounds = int(m.group(1))
            continue
        m = re.match(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)", line)
        if m:
            ranks.append({"rank": int(m.group(1)), "host": m.group(2), "device": int(m.group(3))})
            continue
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        if len(parts) < 13 or not parts[0].isdigit():
            continue
        try:
            size, count = int(parts[0]), int(parts[1])
            oop = [float(parts[5]), float(parts[6]), float(parts[7])]
            ip = [float(parts[9]), float(parts[10]), float(parts[11])]
            wrong_n = sum(float(w) for w in (parts[8], parts[12]) if w != "N/A")
        except ValueError:
            continue
        wrong_total += wrong_n
        rows.append(
            {
                "bytes": size,
                "count": count,
                "type": parts[2],
                "redop": parts[3],
                "time_us": oop[0],
                "algbw": oop[1],
                "busbw": oop[2],
                "in_place_time_us": ip[0],
                "in_place_algbw": ip[1],
                "in_place_busbw": ip[2],
                "wrong": wrong_n,
            }
        )
    return {"rows": rows, "avg_busbw": avg, "wrong": wrong_total, "out_of_bounds": out_of_bounds, "ranks": ranks}


def parse_ompi_info_components(text: str, framework: str) -> list[str]:
    """`ompi_info`: the components of one MCA framework (`MCA pml: ob1 (MCA v2.1.0, ...)` lines)."""
    return re.findall(r"^\s*MCA " + re.escape(framework) + r": (\S+) \(", text, flags=re.M)


def parse_ompi_info_priority(text: str, component: str) -> int | None:
    """`ompi_info --param <framework> all --level 9`: `parameter "<component>_priority" (current value: "N"`."""
    m = re.search(r'parameter "' + re.escape(component) + r'_priority" \(current value: "(-?\d+)"', text)
    return int(m.group(1)) if m else None


def parse_ib_write_bw(text: str) -> dict | None:
    """perftest bandwidth report (src/perftest_parameters.h RESULT_FMT_G / REPORT_FMT): a header
    ` #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]` and one result line."""
    unit = None
    for line in text.splitlines():
        m = re.match(r"^\s*#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]", line)
        if m:
            unit = m.group(2)
            continue
        if unit:
            parts = line.split()
            if len(parts) >= 5 and parts[0].isdigit():
                avg = float(parts[3])
                gbps = avg if unit == "Gb/sec" else avg * 8 * (1 << 20) / 1e9 if unit == "MiB/sec" else avg * 8 / 1e3
                return {
                    "bytes": int(parts[0]),
                    "iterations": int(parts[1]),
                    "peak": float(parts[2]),
                    "average": avg,
                    "unit": unit,
                    "gbps": round(gbps, 2),
                }
    return None
