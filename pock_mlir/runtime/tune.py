"""pock-tune's device half: time every candidate of a tuning bundle (pock_mlir/tune.py writes them)
with the IREE runtime alone, no compiler and no PyTorch (as pock-train), and write the table
pock-backend-switch chooses by (pock_mlir.tuning, TABLE_FORMAT).

Each convolution shape's candidates (every op and form) run on the same random inputs: a form whose
results disagree with the op's baseline form is left out of the table (and named in it), as a
miscompiled form must never be chosen however fast. They are then timed in interleaved rounds,
each the fastest of its calls; the whole steps take turns of back-to-back steps, each recorded as
its fastest and median step and its Trainer's device memory (pock_mlir/runtime/timing.py, as the
bench's flag study times them).

On a device without Python (or an aarch64 one under qemu here), `benchmark` times them with IREE's
stock iree-benchmark-module instead, a command such as "qemu-aarch64 -L /usr/aarch64-linux-gnu
.../iree-benchmark-module" of this IREE runtime's version: in the same interleaved rounds, each
form its fastest of `repeats` rounds of one call per round (inputs all ones), each step's turn the
mean of STEPS_PER_TURN steps back to back, each after WARMUP_S of untimed calls. It returns no results, so the forms go unchecked
(the table says so), and the device is named as given.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np

from pock_mlir.abi import TRAIN_STEP
from pock_mlir.files import atomic_write, check_writable
from pock_mlir.runtime.bundle import ARGS, load_bundle
from pock_mlir.runtime.memory import new_device
from pock_mlir.runtime.timing import (
    REPEATS,
    STEPS_PER_TURN,
    busy_share,
    step_statistics,
    time_in_turns,
    time_interleaved,
)
from pock_mlir.runtime.trainer import CALLED, Trainer
from pock_mlir.runtime.workspace import ModuleFunctions, module_transient_bytes, to_host
from pock_mlir.targets import CPU_DRIVERS, resolve_target
from pock_mlir.tuning import BUNDLE_FORMAT, TABLE_FORMAT, cpu_device, iree_version

MANIFEST = "tune.json"
# Timed steps of each flag set: whole steps vary more than single forms, and twenty let a disturbed
# turn decide a 5% margin (a resnet18 table at load 11 chose data tiling, 1.22x slower after).
STEPS = 60
# Where other jobs keep more than this share of the CPUs busy, they take turns with the candidates
# and the timings say more about them than about the candidates.
BUSY_SHARE = 0.25


# Two forms of one op sum in different orders; each is within 1e-4 of the largest value of
# PyTorch's result (the conv study's check), so within twice that of each other.
AGREEMENT = 2e-4


class TuneError(ValueError):
    pass


def device_name(driver: str) -> str:
    """The device a driver runs on, as a table names it: this CPU, or the GPU's name."""
    if driver in CPU_DRIVERS:
        return cpu_device()
    devices = rt.get_driver(driver).query_available_devices()
    if not devices:
        raise TuneError(f"the IREE driver '{driver}' finds no device here")
    return f"GPU {devices[0]['name']}"


def read_manifest(directory) -> dict:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TuneError(
            f"{directory} is not a pock-tune bundle ({MANIFEST}: {e}); pock-tune prepare writes one"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise TuneError(f"{directory} is not a pock-tune bundle ({MANIFEST} names no format '{BUNDLE_FORMAT}')")
    return manifest


def _example_batch(bundle):
    """The batch a step bundle was compiled for (its args/batch/), as Trainer.step takes it."""
    sig = bundle.signature

    def load(spec):
        return np.load(bundle.path / ARGS / "batch" / f"{spec.name}.npy")

    positional = tuple(load(spec) for spec in sig.positional_inputs)
    keywords = {spec.name: load(spec) for spec in sig.keyword_inputs}
    return (*positional, keywords) if keywords else positional, load(sig.target)


def _conv_case(directory: Path, case: dict, config, rng, repeats: int) -> dict:
    """One shape's row of the table: each candidate's ms, and the forms left out as disagreeing."""
    calls, inputs, wanted, disagree = {}, {}, {}, []
    for candidate in case["candidates"]:
        context = rt.SystemContext(config=config)
        context.add_vm_module(
            rt.VmModule.copy_buffer(config.vm_instance, (directory / candidate["module"]).read_bytes())
        )
        functions = ModuleFunctions(context, config.device, ("main",))
        op = candidate["op"]
        args = inputs.setdefault(
            op,
            [
                rt.asdevicearray(config.device, rng.standard_normal(dims, dtype=np.float32))
                for dims in candidate["arguments"]
            ],
        )
        call = functools.partial(functions, "main", *args)
        got = [to_host(config.device, r) for r in call()]
        want = wanted.setdefault(op, got)  # the op's first form, its baseline, sets what the others must give
        scale = max(float(np.abs(w).max()) for w in want)
        if any(np.abs(g - w).max() > AGREEMENT * scale for g, w in zip(got, want, strict=True)):
            disagree.append(candidate["key"])
            continue
        calls[candidate["key"]] = call
    row = {"shape": case["shape"], "class": case["class"], "ms": time_interleaved(calls, repeats)}
    if disagree:
        row["disagree_with_baseline"] = disagree
    return row


def _steps(directory: Path, compiled: dict, driver: str, steps: int) -> dict:
    """{flag set: its row} of the step bundles `compiled` (by flag set), each run by a Trainer."""
    results, trainers = {}, {}
    for flag_set, path in compiled.items():
        bundle = load_bundle(directory / path)
        trainer = Trainer.from_bundle(bundle, device=driver)
        inputs, target = _example_batch(bundle)
        for _ in range(3):  # the first steps warm up, as the flag study's
            trainer.step(inputs, target)
        results[flag_set] = {"device_mb": trainer.device_bytes / 2**20}
        trainers[flag_set] = functools.partial(trainer.step, inputs, target)
    for flag_set, seconds in time_in_turns(trainers, steps).items():
        results[flag_set].update(step_statistics(seconds))
    return results


# iree-benchmark-module's first calls of a function are many times slower than the next ones
# (3.2 ms against 0.012 ms for a tiny convolution here): each timed call follows this much of untimed ones.
WARMUP_S = 0.05


class Benchmark:
    """Calls of IREE's stock iree-benchmark-module (see the module docstring)."""

    UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}

    def __init__(self, command: str, driver: str):
        self.command, self.driver = shlex.split(command), driver
        if not self.command:
            raise TuneError("--benchmark-module: give the iree-benchmark-module command")

    def ms(self, module: Path, function: str, inputs: list[str], calls: int) -> float:
        """The mean ms of `calls` calls back to back of `function`."""
        argv = [
            *self.command,
            f"--device={self.driver}",
            f"--module={module}",
            f"--function={function}",
            *(f"--input={i}" for i in inputs),
            f"--benchmark_min_time={calls}x",
            f"--benchmark_min_warmup_time={WARMUP_S}",
            "--benchmark_format=json",
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True)
        except OSError as e:
            raise TuneError(f"--benchmark-module: cannot run {argv[0]}: {e.strerror or e}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise TuneError(f"--benchmark-module failed on {module.name} {function} ({last[:200]})")
        runs = [b for b in json.loads(done.stdout)["benchmarks"] if b.get("run_type") == "iteration"]
        return min(b["real_time"] * self.UNITS[b["time_unit"]] for b in runs)


def _benchmarked_case(directory: Path, case: dict, benchmark: Benchmark, repeats: int) -> dict:
    calls = {}
    for candidate in case["candidates"]:
        module = directory / candidate["module"]
        workspace = module_transient_bytes(module.read_bytes(), "main")
        inputs = ["x".join(map(str, dims)) + "xf32=1" for dims in candidate["arguments"]]
        inputs += [f"&{workspace}xi8"] if workspace is not None else []
        calls[candidate["key"]] = functools.partial(benchmark.ms, module, "main", inputs, 1)
    best = {key: float("inf") for key in calls}
    for _ in range(repeats):  # interleaved rounds, one call of each form a round
        for key, call in calls.items():
            best[key] = min(best[key], call())
    return {"shape": case["shape"], "class": case["class"], "ms": best, "results_checked": False}


def _step_device_mb(bundle) -> float:
    """A Trainer's device memory for a step bundle, as Trainer.device_bytes counts it, without one."""
    sig = bundle.signature
    sizes = [size for f in CALLED if (size := module_transient_bytes(bundle.vmfb, f)) is not None]
    return sig.device_bytes(bundle.in_place & set(sig.written()), max(sizes, default=None)) / 2**20


def _benchmarked_steps(directory: Path, steps_of: dict, benchmark: Benchmark, steps: int) -> dict:
    """{flag set: its row} of the steps, in turns of STEPS_PER_TURN steps back to back."""
    calls, results = {}, {}
    for flag_set, path in steps_of.items():
        bundle = load_bundle(directory / path)
        inputs = [f"@{bundle.path / ARGS / file}" for file in bundle.step_argument_files]
        inputs.append(f"&{bundle.manifest['module']['workspace_bytes'][TRAIN_STEP]}xi8")
        calls[flag_set] = functools.partial(
            benchmark.ms, bundle.path / "module.vmfb", TRAIN_STEP, inputs, STEPS_PER_TURN
        )
        results[flag_set] = {"device_mb": _step_device_mb(bundle)}
    turns = {flag_set: [] for flag_set in calls}
    for _ in range(max(1, steps // STEPS_PER_TURN)):
        for flag_set, call in calls.items():
            turns[flag_set].append(call())
    for flag_set, ms in turns.items():
        results[flag_set].update(step_ms_min=min(ms), step_ms_median=statistics.median(ms))
    return results


def run(
    directory,
    output,
    *,
    device: str | None = None,
    repeats: int = REPEATS,
    steps: int = STEPS,
    benchmark_module: str | None = None,
    device_name_given: str | None = None,
    log=None,
) -> dict:
    """Time the tuning bundle at `directory` on `device` (an IREE driver; the target's by default)
    and write the table to `output`; returns it. Everything is checked before anything is timed.
    `benchmark_module`: time with that iree-benchmark-module command instead, on the device
    named `device_name_given` (see the module docstring)."""
    log = log or (lambda message: print(f"pock-tune: {message}", file=sys.stderr, flush=True))
    directory = Path(directory)
    manifest = read_manifest(directory)
    target = resolve_target(manifest["target"])
    driver = device or target.device
    if (benchmark_module is None) != (device_name_given is None):
        raise TuneError("--benchmark-module and --device-name go together: the command runs on the device named")
    # the command runs on the device named, whatever this machine is: only its driver is checked
    target.check_runtime(driver, target.arch if benchmark_module else None)
    check_writable(output)
    if repeats < 1 or steps < 1:
        raise TuneError(f"--repeats and --steps must be at least 1, got {repeats} and {steps}")
    busy = busy_share()
    if busy is not None and busy > BUSY_SHARE:
        log(
            f"warning: other jobs keep {100 * busy:.0f}% of this machine's CPU time busy: they disturb the timings "
            "and a choice made by them may be wrong; tune when nothing else runs"
        )
    start = time.perf_counter()
    benchmark = Benchmark(benchmark_module, driver) if benchmark_module else None
    config = None if benchmark else rt.Config(device=new_device(driver))
    rng = np.random.default_rng(0)
    count = len(manifest["convs"]) + bool(manifest["steps"])
    cases = []
    for i, case in enumerate(manifest["convs"]):
        log(f"[{i + 1}/{count}] timing {len(case['candidates'])} forms of {case['class']}, {repeats} rounds")
        if benchmark:
            row = _benchmarked_case(directory, case, benchmark, repeats)
        else:
            row = _conv_case(directory, case, config, rng, repeats)
        log("  " + ", ".join(f"{key} {ms:.3f} ms" for key, ms in row["ms"].items()))
        for key in row.get("disagree_with_baseline", ()):
            log(f"  {key} left out: its results disagree with the baseline form's")
        cases.append(row)
    model = manifest["model"]
    results = {step["set"]: {"error": step["error"]} for step in manifest["steps"] if "error" in step}
    compiled = {step["set"]: step["bundle"] for step in manifest["steps"] if "error" not in step}
    if compiled:
        log(f"[{count}/{count}] timing the whole {TRAIN_STEP} under {len(compiled)} flag sets, {steps} steps each")
        results.update(
            _benchmarked_steps(directory, compiled, benchmark, steps)
            if benchmark
            else _steps(directory, compiled, driver, steps)
        )
        for flag_set in compiled:
            log(f"  {flag_set}: {results[flag_set]['step_ms_min']:.2f} ms, {results[flag_set]['device_mb']:.1f} MB")
    table = {
        "format": TABLE_FORMAT,
        "target": manifest["target"],
        "device": device_name_given or device_name(driver),
        "driver": driver,
        "iree": {"compiler": manifest["iree"]["compiler"], "runtime": iree_version("iree-base-runtime")},
        "model": model,
        "busy_before": busy,  # the share of CPU time other jobs used just before the timing (busy_share)
        "load_average": os.getloadavg()[0],
        "convs": {"cases": cases},
        "flags": {
            "sets": {s["set"]: s["iree_flags"] for s in manifest["steps"] if "iree_flags" in s},
            "step_ms": {model: results},
            "programs": {model: manifest["program"]},
        },
        "run_s": time.perf_counter() - start,
    }
    atomic_write(output, json.dumps(table, indent=1) + "\n")
    log(f"wrote {output}: measured on {table['device']} with IREE runtime {table['iree']['runtime']}")
    return table
