# ruff: noqa: UP031  (printf-style on purpose: mirrors nccl-tests' C format strings)
"""all_reduce_perf's report as nccl-tests prints it (src/common.cu: the header, PrintRow, the summary lines).

The node-tool stubs print it and tests that need a gate input of a given shape build it here; the parsers are
also fed the real logs kept in tests/data/tool_output/ (PROVENANCE.md).
"""

from __future__ import annotations


def float_str(value: float, width: int) -> str:
    """nccl-tests getFloatStr: %.2f, else %.1f, else %.0f, whichever fits the width."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        text = fmt % (width, value)
        if len(text) <= width:
            return text
    return "%*.1e" % (width, value)


def nccl_report(hosts: list[str], gpus: int, min_bytes: int, max_bytes: int, plateau_busbw: float) -> str:
    nranks = len(hosts) * gpus
    out = [
        "# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703",
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) warmup iters: 1 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(nranks):
        host = hosts[r // gpus].split(".")[0]
        out.append(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
            % (r, 0, 4000 + r, host, r % gpus, 0, 0x19 + 0x20 * (r % gpus), 0, "NVIDIA H100 80GB HBM3")
        )
    out.append("#")
    out.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % ("", "", "", "", ""))
    out.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %20s"
        % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "")
    )
    out.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %20s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "")
    )
    size = min_bytes
    total = 0.0
    rows = 0
    factor = 2 * (nranks - 1) / nranks
    while size <= max_bytes:
        busbw = plateau_busbw * size / (size + 64 * (1 << 20))
        algbw = busbw / factor
        time_us = size / (algbw * 1e3)
        line = "%12li  %12li  %8s  %6s  %6s" % (size, size // 4, "float", "sum", "-1")
        for bw_scale in (1.0, 0.998):
            line += "  %7s  %6s  %6s  %6g" % (
                float_str(time_us / bw_scale, 7),
                float_str(algbw * bw_scale, 6),
                float_str(busbw * bw_scale, 6),
                0,
            )
        out.append(line)
        total += busbw
        rows += 1
        size *= 2
    out.append("# Out of bounds values : %d %s" % (0, "OK"))
    out.append("# Avg bus bandwidth    : %g " % (total / rows if rows else 0))
    out.append("#")
    out.append("# Collective test concluded: all_reduce_perf")
    return "\n".join(out) + "\n"
