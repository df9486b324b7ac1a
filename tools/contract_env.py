"""Writes inpod/sh/contract.env from inpod/contract.py (`shell_env()`): the facts the shell files read.

`python -m tools.contract_env --write` (part of `make docs-generate`) rewrites it; without `--write` it prints the
text and exits 1 when the file is stale (tests/core/test_pod_contract.py fails on a stale copy as well).
"""

from __future__ import annotations

import argparse
import sys

import inpod
from inpod import contract

TARGET = inpod.HERE / "sh" / contract.CONTRACT_ENV_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {TARGET.relative_to(inpod.HERE.parent)}")
    args = parser.parse_args(argv)
    text = contract.shell_env()
    if args.write:
        TARGET.write_text(text)
        return 0
    sys.stdout.write(text)
    return 0 if TARGET.exists() and TARGET.read_text() == text else 1


if __name__ == "__main__":
    raise SystemExit(main())
