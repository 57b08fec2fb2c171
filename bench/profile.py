"""Where a compiled train step spends its time, per IREE dispatch.

The step runs as the Trainer runs it (train_step_into, writing its new state into buffers it is
given; see passes/pock_step_into.py) under iree-benchmark-module with HAL host-execution
profiling (the local-task driver records every dispatch's wall time); `iree-profile statistics`
aggregates the bundle per executable function. Dispatch names say what each one is (e.g.
`train_step$async_dispatch_25_matmul_512x512x64_f32`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pock_mlir.abi import TRAIN_STEP_INTO, layout
from pock_mlir.runtime.artifact import trainer_module
from pock_mlir.runtime.trainer import to_numpy
from pock_mlir.runtime.workspace import module_transient_bytes

BIN = Path(sys.executable).parent
STEP = TRAIN_STEP_INTO  # the function a Trainer steps with


def step_arguments(program, inputs, target) -> list[np.ndarray]:
    """train_step_into's arguments as pock_mlir.abi lays them out: the initial parameters and
    buffers, zero optimizer state and step, the batch (with the dropout seed of a model with
    dropout; torch tensors or arrays, in the dtypes the step takes, as a Trainer converts them:
    int64 as int32), then the buffers the step's results are written into (initial values or zeros)."""
    sig = program.signature
    initial = {**program.initial_params, **program.initial_buffers}
    batch = iter([*inputs, *([np.zeros((), np.int32)] if sig.seeded else []), target])
    arguments, _ = layout(sig, STEP)
    return [
        to_numpy(next(batch)).astype(slot.spec.dtype, copy=False)
        if slot.role == "batch"
        else initial[slot.spec.name]
        if slot.role in ("params", "buffers", "into") and slot.spec.name in initial
        else np.zeros(slot.spec.shape, np.float32)
        for slot in arguments
    ]


def dispatch_kind(function_name: str) -> str:
    """What IREE names a dispatch after, its root op (`elementwise`, `matvec_like`, `mmt4d`,
    `slow_memcpy`, ...): the words of its name between the dispatch number and the first shape,
    e.g. `train_step$async_dispatch_939_matvec_like_96x8x2304_f32` -> `matvec_like`."""
    words = function_name.rpartition("$")[2].split("_")
    if words[:2] == ["async", "dispatch"]:
        words = words[3:]  # async_dispatch_<number>_
    kind = []
    for word in words:
        if not word or word[0].isdigit():
            break
        kind.append(word)
    return "_".join(kind) or "unnamed"


def profile_step(program, inputs, target, iterations: int = 20, top: int = 10) -> dict:
    with tempfile.TemporaryDirectory(prefix="pock-profile-") as tmp:
        tmp = Path(tmp)
        vmfb = program.module(trainer_module(STEP)).vmfb  # the module a Trainer steps with
        (tmp / "step.vmfb").write_bytes(vmfb)
        flags = []
        for i, array in enumerate(step_arguments(program, inputs, target)):
            np.save(tmp / f"arg{i}.npy", np.require(array, requirements="C"))
            flags.append(f"--input=@{tmp / f'arg{i}.npy'}")
        flags.append(f"--input=&{module_transient_bytes(vmfb, STEP)}xi8")  # the step's workspace
        bundle = tmp / "step.ireeprof"
        subprocess.run(
            [
                str(BIN / "iree-benchmark-module"),
                f"--module={tmp / 'step.vmfb'}",
                f"--function={STEP}",
                f"--device={program.target.device}",
                *flags,
                f"--benchmark_min_time={iterations}x",
                "--device_profiling_mode=host-execution",
                f"--device_profiling_output={bundle}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        stats = subprocess.run(
            [str(BIN / "iree-profile"), "statistics", "--format=jsonl", str(bundle)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    rows = [json.loads(line) for line in stats.splitlines()]
    # only the step ran; its dispatches may carry another function's name (IREE shares executables)
    functions = [r for r in rows if r.get("row_type") == "host_execution_function" and r.get("function_name")]
    total = sum(r["total_duration_ns"] for r in functions)
    functions.sort(key=lambda r: r["total_duration_ns"], reverse=True)
    per_step = lambda ns: ns / iterations / 1e6  # noqa: E731
    kinds = {}
    for r in functions:
        kind = dispatch_kind(r["function_name"])
        ns, count = kinds.get(kind, (0, 0))
        kinds[kind] = (ns + r["total_duration_ns"], count + 1)
    return {
        "dispatch_ms_per_step": per_step(total),
        "dispatches": len(functions),
        "dispatch_runs_per_step": sum(r["sample_count"] for r in functions) / iterations,
        "by_kind": [
            {"kind": kind, "ms_per_step": per_step(ns), "dispatches": count, "share": ns / total if total else 0.0}
            for kind, (ns, count) in sorted(kinds.items(), key=lambda item: item[1][0], reverse=True)
        ],
        "top": [
            {
                "name": r["function_name"].split("$", 1)[1],
                "ms_per_step": per_step(r["total_duration_ns"]),
                "min_ms": r["minimum_duration_ns"] / 1e6,
                "share": r["total_duration_ns"] / total if total else 0.0,
            }
            for r in functions[:top]
        ],
    }
