"""Runtime of every step program: exit codes, the one-line error, logging, sizes, progress, results.

`embed.step_script()` inlines the `steps/lib` modules a step imports into its deployable script, so
they stay stdlib-only and free of module-level side effects.
"""

from __future__ import annotations

import errno
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

# Exit codes shared by all steps (argparse itself exits with 2 on usage errors).
EXIT_FAILED = 1
EXIT_INTEGRITY = 3
EXIT_AUTH = 4
EXIT_NOT_FOUND = 5
EXIT_REMOTE = 6
EXIT_REFUSED = 7


def http_exit(status: int) -> int:
    """The exit code of a final HTTP answer `status`: whether running the Task again may succeed. 401/403: the
    credentials (EXIT_AUTH); 404: absent (EXIT_NOT_FOUND); 408, 429, 5xx: the service, for now (EXIT_REMOTE: may
    succeed); any other 4xx: the service refuses this request as sent, and the same request gets the same answer (EXIT_REFUSED)."""
    if status in (401, 403):
        return EXIT_AUTH
    if status == 404:
        return EXIT_NOT_FOUND
    if status in (408, 429) or status >= 500:
        return EXIT_REMOTE
    return EXIT_REFUSED if 400 <= status < 500 else EXIT_REMOTE


MiB = 1 << 20
READ_SIZE = 8 * MiB


class StepError(Exception):
    """An expected failure: reported as a single `ERROR:` line and exit code `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def run_step(main: Callable[[Sequence[str] | None], None]) -> NoReturn:
    """Run a step's `main`, turning expected failures into one line on stderr and an exit code."""
    try:
        main(None)
    except StepError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        print("ERROR: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        # A write no `writing()` block names: still one line, with whatever path the error carries.
        print(f"ERROR: {exc.strerror}: {exc.filename or 'a local file'}", file=sys.stderr, flush=True)
        sys.exit(EXIT_FAILED)
    sys.exit(0)


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def writing(path: Path | str, what: str) -> Iterator[None]:
    """Turn a failed local write (disk full, quota, read-only, permissions) into one `ERROR:` line
    that names `what` and `path` (OSError from a write on an open file carries no file name)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        raise StepError(f"cannot write {what} {path}: {exc.strerror or exc}", EXIT_FAILED) from exc


def backoff(attempt: int, first: float) -> float:
    """Exponential backoff with jitter: the n-th retry waits 50-100 % of first * 2**(n-1), at most 60 s."""
    return min(first * 2 ** max(attempt - 1, 0), 60.0) * (0.5 + random.random() / 2)


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """Parse `20GB` (decimal), `2GiB` (binary), `512MiB` or a plain byte count."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 20GB, 2GiB, 1048576)")
    number, unit = match.group(1), (match.group(2) or "").upper()
    binary = "I" in unit
    unit = unit.replace("I", "").replace("B", "") or ""
    factor = 1024 ** ("KMGT".index(unit) + 1) if binary and unit else _UNITS[unit]
    return int(float(number) * factor)


def human(num: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024:
            return f"{num:.1f} {unit}" if unit != "B" else f"{int(num)} B"
        num /= 1024
    return f"{num:.2f} TiB"


class Progress:
    """Thread-safe byte counter that prints done/total, MB/s and ETA at most every `interval` s."""

    def __init__(self, label: str, total: int, interval: float = 5.0) -> None:
        self.label, self.total, self.interval = label, total, interval
        self.done = 0
        self.start = self._last = time.monotonic()
        self._lock = threading.Lock()

    def advance(self, num: int) -> None:
        """Count `num` bytes (negative when an upload restarts and bytes are sent again)."""
        with self._lock:
            self.done += num
            now = time.monotonic()
            if now - self._last >= self.interval:
                self._last = now
                self._print(now)

    def finish(self) -> None:
        with self._lock:
            self._print(time.monotonic(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.start, 1e-6)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        line = f"{self.label}: {human(self.done)} / {human(self.total)} ({pct:.1f}%) {rate / 1e6:.1f} MB/s"
        if final:
            line += f" in {elapsed:.1f}s"
        elif rate > 0:
            line += f" ETA {max(self.total - self.done, 0) / rate:.0f}s"
        log(line)


def write_result(path: str | None, value: str) -> None:
    """Write a Tekton result (no trailing newline) when a result path was given."""
    if path:
        with writing(path, "result file"):
            Path(path).write_text(value, encoding="utf-8")


def env_secret(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None
