"""Keeping the memory a training step frees mapped, so that the next step does not fault it back in.

A compiled step allocates its results (the new parameters and optimizer state) and its
transient buffers on every call, and frees the previous step's. glibc hands large freed
blocks back to the kernel (munmap, heap trimming), so each step then touches its whole working
set as fresh pages: on the LLaMA bench model that was 175,000 page faults and about a quarter
of the step time. Raising glibc's mmap and trim thresholds keeps freed blocks in the heap for
the next step to reuse; the process's peak memory is what it was, its resident set just does
not shrink between steps. Other C libraries are left alone.

Set-up is different: the host zeros the Trainer uploads as optimizer state and spare buffers are
freed once uploaded and no step reuses them, so the Trainer gives them back after set-up
(release_freed_memory; the bench's peak-memory column shows it, bench/results.md).
"""

from __future__ import annotations

import ctypes
import platform

import iree.runtime as rt

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_NEVER = 2**31 - 1  # bytes: larger than any block a step frees

_applied: bool | None = None

# IREE's task executor (the local-task driver) gives each worker thread local memory for dispatches
# that ask for workgroup memory, by default the size of its core's L2 cache, resident once touched:
# a local-task device held 2.46 MB on the 2-core EPYC 25-17 (1 MB of L2 a core), 0.05 MB with this.
# The tests and the bench's programs run with this much; a dispatch asking for more would fail
# with IREE's error rather than run short.
WORKER_LOCAL_MEMORY = 64 * 1024


def new_device(driver: str):
    """A device of its own on `driver` (iree.runtime's shared devices live as long as the process),
    its task workers' local memory WORKER_LOCAL_MEMORY (IREE reads it from its process-wide flags
    when it creates a device's executor)."""
    rt.flags.parse_flags(f"--task_worker_local_memory={WORKER_LOCAL_MEMORY}")
    return rt.get_device(driver, cache=False)


def _glibc():
    return ctypes.CDLL(None) if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" else None


def retain_freed_memory() -> bool:
    """Ask glibc to keep freed blocks mapped (process-wide, once); True when it is in effect."""
    global _applied
    if _applied is None:
        _applied = False
        if libc := _glibc():
            mallopt = libc.mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied = bool(mallopt(_M_MMAP_THRESHOLD, _NEVER)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER))
    return _applied


def release_freed_memory() -> bool:
    """Give every freed block back to the kernel now (glibc's malloc_trim), whatever the thresholds;
    True when glibc released memory."""
    libc = _glibc()
    return bool(libc and libc.malloc_trim(0))
