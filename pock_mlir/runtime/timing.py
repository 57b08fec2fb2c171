"""How pock-mlir times candidates against each other, on a machine that may be shared: in
interleaved rounds, so that load from other jobs hits every candidate alike, and reporting the
fastest (the least disturbed estimate) with the median beside it, and how busy other jobs keep
the machine (busy_share), which interleaving cannot even out. The flag study
(bench/iree_study.py) and pock-tune's device side (pock_mlir/runtime/tune.py) both time so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

WARMUP_CALLS = 3  # a function's first calls warm up its caches and the driver's
REPEATS = 30  # timed calls of each function (time_interleaved)
STEPS_PER_TURN = 5
PROC_STAT = Path("/proc/stat")


def time_interleaved(calls: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, float]:
    """{name: ms of the fastest of `repeats` calls}: the calls of the candidates alternate, one
    round calling each once, after WARMUP_CALLS untimed rounds."""
    best = {name: float("inf") for name in calls}
    for i in range(repeats + WARMUP_CALLS):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if i >= WARMUP_CALLS:
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: 1000 * t for name, t in best.items()}


def time_in_turns(steps_of: dict[str, Callable[[], object]], steps: int) -> dict[str, list[float]]:
    """Seconds of each of `steps` timed calls of each of `steps_of`'s functions (whole turns). They
    take turns, so that load from other jobs hits them alike, each turn STEPS_PER_TURN calls back to
    back after an untimed one, as training runs its steps: with the program's data in the caches
    (timed one call a turn, each found the caches filled with the others' data, which hid much of
    what data tiling gains a small program: docs/targets-and-deploying.md)."""
    times = {label: [] for label in steps_of}
    for _ in range(max(1, steps // STEPS_PER_TURN)):
        for label, step in steps_of.items():
            step()
            for _ in range(STEPS_PER_TURN):
                start = time.perf_counter()
                step()
                times[label].append(time.perf_counter() - start)
    return times


def step_statistics(seconds: list[float]) -> dict[str, float]:
    """What a table records of a step's timed calls: the fastest and the median, in ms."""
    return {"step_ms_min": 1000 * min(seconds), "step_ms_median": 1000 * statistics.median(seconds)}


def busy_share(seconds: float = 1.0) -> float | None:
    """The share of the CPUs' time other processes used over `seconds` while this one slept, from
    Linux's /proc/stat (None elsewhere). Not the load average: that still counts, for minutes, the
    compilations `pock-tune MODEL.py` ran just before."""

    def times():
        fields = [int(f) for f in PROC_STAT.read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, all but guest time (counted in user)

    try:
        idle0, total0 = times()
        time.sleep(seconds)
        idle1, total1 = times()
    except (OSError, ValueError, IndexError):
        return None
    return 1 - (idle1 - idle0) / (total1 - total0) if total1 > total0 else None
