"""What every bench child shares, without importing torch (bench/ort_child.py must not): the timed
rounds it answers the parent with and the RESULT line it ends with (protocol: bench/child.py)."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable

from bench.memory import reset_peak, rss_kb


class Unsupported(Exception):
    """What a peer cannot run: its row says "not supported yet: <the message>"."""


def block_torch() -> None:
    """Make `import torch` raise ImportError in this process (a child that must run without it)."""
    sys.modules["torch"] = None


def torch_loaded() -> bool:
    """Whether any torch module was loaded (the None that blocks the import is not one)."""
    return any(module is not None for name, module in sys.modules.items() if name.split(".")[0] == "torch")


def first_line(error: Exception) -> str:
    """The informative head of an error: its first line, joined with the next when it ends in ':'."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    head = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return head[:300]


def timed_rounds(step, spec) -> dict:
    """Warm up, reset the memory high-water mark, say READY, then time one round of steps for each
    `round` line on stdin until `done` (each step returns the loss as a Python float, which waits
    for the step to finish). The parent interleaves the rounds of every system of one model and
    scheme, so a burst of other jobs on the shared machine hits them alike; a round starts with one
    untimed step, which brings caches and idle worker threads back after another process ran. The
    round with the lowest median counts. With spec["warmup_losses"], the result lists the warm-up
    steps' losses too (the parent checks two systems' against each other)."""
    warmup_losses = [step() for _ in range(spec["warmup"])]
    reset_peak()
    print("READY", flush=True)
    rounds, loss = [], None
    for command in sys.stdin:
        if command.strip() != "round":
            break
        step()
        times = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - start)
        rounds.append(times)
        print(f"ROUND {1000 * statistics.median(times):.3f}", flush=True)
    if not rounds:
        raise RuntimeError("the parent asked for no round of timed steps")
    best = min(rounds, key=statistics.median)
    result = {
        "step_ms": 1000 * statistics.median(best),
        "step_ms_min": 1000 * min(best),
        "step_ms_max": 1000 * max(best),
        "steps": spec["steps"],
        "rounds": len(rounds),
        "loss": float(loss),
        "peak_kb": rss_kb("VmHWM"),
    }
    return {**result, "warmup_losses": warmup_losses} if spec.get("warmup_losses") else result


def print_result(
    run: Callable[[], dict], baseline_kb: int, unsupported: Callable[[Exception], str | None] = lambda error: None
) -> None:
    """Print `RESULT <json>` of `run()`, its peak memory as MB above `baseline_kb`. An error becomes
    the row's status: "not supported yet: <why>" where `unsupported` says why (it may re-raise),
    else "failed: <its first line>"."""
    try:
        result = {"status": "ok", **run()}
        if "peak_kb" in result:
            result["peak_mb"] = (result.pop("peak_kb") - baseline_kb) / 1024
    except Exception as e:  # any failure becomes a row in the results, not a crashed run
        reason = unsupported(e)
        result = (
            {"status": f"not supported yet: {reason}"}
            if reason
            else {"status": f"failed: {type(e).__name__}: {first_line(e)}", "traceback": traceback.format_exc()[-3000:]}
        )
    print("RESULT " + json.dumps(result), flush=True)


def memory_facts(trainer) -> dict:
    """What a pock-mlir Trainer's step writes, by role, which of those it writes where it reads them
    (Trainer.in_place), and the MB of optimizer state it holds."""
    sig = trainer.signature
    state_bytes = sum(4 * math.prod(s.shape) for s in sig.state)  # float32
    return {
        "written": sorted(role for role, specs in sig.written().items() if specs),
        "in_place": sorted(trainer.in_place),
        "optimizer_state_mb": state_bytes / 2**20,
    }
