"""A process's resident memory from /proc/self/status, and resetting its high-water mark (Linux)."""

from __future__ import annotations

import gc


def rss_kb(field: str = "VmRSS") -> int:
    """VmRSS (resident now) or VmHWM (peak since start or the last reset_peak), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def reset_peak() -> int:
    """Collect garbage, reset the kernel's resident-set high-water mark; returns the resident set now."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kb()
