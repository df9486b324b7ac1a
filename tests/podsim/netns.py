"""Code run inside a simulated pod's network namespace from this process (root only).

`in_netns(path, fn)` runs `fn()` on a thread of its own that first joins the network namespace at `path`
(`/run/netns/<pod.netns>`) with setns(2), CLONE_NEWNET: a network namespace is a property of the calling
thread (Linux kernel/nsproxy.c, SYSCALL_DEFINE2(setns) -> commit_nsset -> switch_task_namespaces(current)),
so every socket the thread opens and every process it starts (fork copies the calling thread's nsproxy:
kernel/fork.c copy_process -> copy_namespaces) lives in the pod's network, while the rest of this process
(pytest, other threads) stays where it was. The thread never returns to this machine's namespace; it ends
with `fn`. Used to drive a browser against a server on a pod's loopback (tests/inpod/home/test_browser.py).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000  # linux/sched.h


def in_netns(path: str, fn: Callable[[], T], timeout: float) -> T:
    """`fn()`'s result (or its exception), run on a new thread inside the network namespace `path`."""
    result: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), f"setns {path}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=work, name=f"netns:{os.path.basename(path)}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"code in network namespace {path} still running after {timeout} s")
    if error:
        raise error[0]
    return result[0]
