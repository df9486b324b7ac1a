"""`oc` for the laptop tools (`make status`, `make racks`): one call, its outcome as a CompletedProcess.

A missing `oc` or one that does not answer becomes a failed outcome with one line to show (exit 127 / 124),
never an exception, so each tool reports it like any other refusal. Tests hand the tools a stub instead.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

Oc = Callable[[list[str]], subprocess.CompletedProcess[str]]
TIMEOUT = 120


def run_oc(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["oc", *args], capture_output=True, text=True, timeout=TIMEOUT)
    except FileNotFoundError:
        return subprocess.CompletedProcess(
            ["oc", *args], 127, "", "oc is not installed (https://mirror.openshift.com/pub/openshift-v4/clients/ocp/)"
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["oc", *args], 124, "", f"oc did not answer within {TIMEOUT} s")
