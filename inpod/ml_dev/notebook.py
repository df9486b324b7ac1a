"""The `%%ranks` cell magic: a notebook cell run on every warm rank (`ml-dev ranks`), from a Jupyter kernel on any pod
of the environment (on another pod than `ml-dev ranks start`'s, through the fabric's SSH: ranks.HubLink).

    %%ranks                 the cell on every rank
    %%ranks --ranks 0,3     on those ranks

Each rank's output is shown labelled `[rank] `, in order per rank; an exception on a rank is shown with its rank and
traceback (the others' cell interrupted) and fails the notebook cell; the stop button interrupts the cell on every
rank, and the ranks stay warm: Jupyter interrupts a kernel whose spec's interrupt_mode is "signal" (ipykernel's) with
SIGINT (jupyter_client manager.py KernelManager._async_interrupt_kernel), and ipykernel sets SIGINT to
default_int_handler while a cell runs (ipykernel kernelbase.py Kernel.pre_handler_hook), so it is a KeyboardInterrupt
in ranks.run_cell's wait, which sends the interrupt to the hub and waits for the ranks to end their cell. The same client as `ml-dev ranks
exec` (ranks.run_cell, ranks.Printer). The pod's startup script registers the magic in every IPython kernel
(`$IPYTHONDIR/profile_default/startup/00-ml-dev-env-rank.py`); this module is imported at the magic's first use.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only (IPython is the kernel's).
"""

from __future__ import annotations

import shlex
from typing import Any

from .ranks import Printer, chosen_ranks, comma_ranks, run_cell


class RanksError(Exception):
    """A cell that failed on warm ranks: IPython shows only this line (`_render_traceback_`), the ranks' own
    tracebacks are in the output above it."""

    def _render_traceback_(self) -> list[str]:
        return [f"ml-dev ranks: {self}"]


def ranks_magic(line: str, cell: str) -> None:
    words = shlex.split(line)
    chosen: list[int] | None = None
    if words[:1] == ["--ranks"] and len(words) == 2:
        try:
            chosen = chosen_ranks(words[1])
        except SystemExit:
            raise RanksError(f"--ranks {words[1]!r}: expected rank numbers separated by commas, e.g. 0,3") from None
    elif words:
        raise RanksError(f"%%ranks {line}: the only option is --ranks 0,3")
    printer = Printer(2)
    try:
        end = run_cell(cell, chosen, printer.show)
    except SystemExit:  # run_cell's words (no warm ranks here) are on stderr already
        raise RanksError("no warm ranks to run the cell on (ml-dev ranks start in a terminal)") from None
    state = end.get("state")
    if state in ("refused", "lost"):
        raise RanksError(str(end.get("why")))
    if state == "error":
        raise RanksError(f"the cell raised on rank {comma_ranks(sorted(printer.failed))}; every other rank's cell was interrupted")
    if state == "interrupted":
        raise RanksError("interrupted on every rank; the ranks stay warm")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext inpod.ml_dev.notebook` (the startup file registers the magic without importing this module)."""
    ipython.register_magic_function(ranks_magic, "cell", "ranks")
