"""A stand-in for a torch rank's Flight Recorder side, for tests/inpod/ml_dev/test_why_fr.py (written for it; no torch).

What `ml-dev why`'s sampler looks for, as PyTorch has it (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp DumpPipe;
FlightRecorder.cpp DebugInfoWriter):
* a mapped file whose path holds "libtorch" (sampler.torch_loaded reads /proc/<pid>/maps);
* the FIFO `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><RANK>.pipe`, opened O_RDONLY | O_NONBLOCK and polled with read(), as
  DumpPipe does; anything read from it asks for a dump;
* the dump at `<TORCH_FR_DUMP_TEMP_FILE><RANK>`, written whole and renamed into place.

Unlike torch, a rank here writes its dump only once every rank's pipe of the same round was written (a barrier on
`asked-<rank>-<round>` files in its directory): a sampler that asked one rank after another, waiting for each dump in
turn, gets none from the first. Real ranks take seconds to dump (4.3 s on the H200 run, data/SOURCES.md), so a
sequential sampler costs the sum of them; the barrier makes that cost a failure a test can see without timing anything.

argv: directory, world size, library path, dump source (bytes copied as the dump). Standard library only.
"""

from __future__ import annotations

import mmap
import os
import shutil
import sys
import time

LIFETIME = 180.0
"""Seconds before the stand-in ends by itself (the test kills it sooner)."""


def main() -> None:
    directory, world, library, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rank = os.environ["RANK"]
    with open(library, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # kept mapped for the process's life
    pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + rank + ".pipe"
    out = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + rank
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    with open(os.path.join(directory, f"ready-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + LIFETIME
    round_no = 0
    while time.monotonic() < end:
        try:
            data = os.read(fd, 128)
        except BlockingIOError:  # a writer holds the pipe open, nothing written yet
            data = b""
        if not data:
            time.sleep(0.05)
            continue
        round_no += 1
        with open(os.path.join(directory, f"asked-{rank}-{round_no}"), "w"):
            pass
        everyone = [os.path.join(directory, f"asked-{r}-{round_no}") for r in range(world)]
        while not all(os.path.exists(p) for p in everyone):
            if time.monotonic() >= end:
                return
            time.sleep(0.05)
        shutil.copyfile(source, out + ".part")
        os.replace(out + ".part", out)
    mapped.close()


if __name__ == "__main__":
    main()
