"""pock-tune's device half: time every candidate of a tuning bundle (pock_mlir/tune.py writes them)
with the IREE runtime alone, no compiler and no PyTorch (as pock-train), and write the table
pock-backend-switch chooses by (pock_mlir.tuning, TABLE_FORMAT).

Each convolution shape's candidates (every op and form) run on the same random inputs: a form whose
results disagree with the op's baseline form is left out of the table (and named in it), as a
miscompiled form must never be chosen however fast. They are then timed in interleaved rounds,
each the fastest of its calls; the whole steps take turns of back-to-back steps, each recorded as
its fastest and median step and its Trainer's device memory (pock_mlir/runtime/timing.py, as the
bench's flag study times them).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np

from pock_mlir.abi import TRAIN_STEP
from pock_mlir.files import atomic_write, check_writable
from pock_mlir.runtime.bundle import ARGS, load_bundle
from pock_mlir.runtime.timing import REPEATS, step_statistics, time_in_turns, time_interleaved
from pock_mlir.runtime.trainer import Trainer
from pock_mlir.runtime.workspace import ModuleFunctions, to_host
from pock_mlir.targets import CPU_DRIVERS, resolve_target
from pock_mlir.tuning import BUNDLE_FORMAT, TABLE_FORMAT, cpu_device, iree_version

MANIFEST = "tune.json"
STEPS = 20  # timed steps of each flag set, as the flag study's
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


def run(directory, output, *, device: str | None = None, repeats: int = REPEATS, steps: int = STEPS, log=None) -> dict:
    """Time the tuning bundle at `directory` on `device` (an IREE driver; the target's by default)
    and write the table to `output`; returns it. Everything is checked before anything is timed."""
    log = log or (lambda message: print(f"pock-tune: {message}", file=sys.stderr, flush=True))
    directory = Path(directory)
    manifest = read_manifest(directory)
    target = resolve_target(manifest["target"])
    driver = device or target.device
    target.check_runtime(driver)
    check_writable(output)
    if repeats < 1 or steps < 1:
        raise TuneError(f"--repeats and --steps must be at least 1, got {repeats} and {steps}")
    start = time.perf_counter()
    config = rt.Config(device=rt.get_device(driver, cache=False))
    rng = np.random.default_rng(0)
    count = len(manifest["convs"]) + bool(manifest["steps"])
    cases = []
    for i, case in enumerate(manifest["convs"]):
        log(f"[{i + 1}/{count}] timing {len(case['candidates'])} forms of {case['class']}, {repeats} rounds")
        row = _conv_case(directory, case, config, rng, repeats)
        log("  " + ", ".join(f"{key} {ms:.3f} ms" for key, ms in row["ms"].items()))
        for key in row.get("disagree_with_baseline", ()):
            log(f"  {key} left out: its results disagree with the baseline form's")
        cases.append(row)
    model = manifest["model"]
    results, trainers = {}, {}
    for step in manifest["steps"]:
        if "error" in step:
            results[step["set"]] = {"error": step["error"]}
            continue
        bundle = load_bundle(directory / step["bundle"])
        trainer = Trainer.from_bundle(bundle, device=driver)
        inputs, target_batch = _example_batch(bundle)
        for _ in range(3):  # the first steps warm up, as the flag study's
            trainer.step(inputs, target_batch)
        results[step["set"]] = {"device_mb": trainer.device_bytes / 2**20}
        trainers[step["set"]] = functools.partial(trainer.step, inputs, target_batch)
    if trainers:
        log(f"[{count}/{count}] timing the whole {TRAIN_STEP} under {len(trainers)} flag sets, {steps} steps each")
        for flag_set, seconds in time_in_turns(trainers, steps).items():
            results[flag_set].update(step_statistics(seconds))
            log(f"  {flag_set}: {results[flag_set]['step_ms_min']:.2f} ms")
    table = {
        "format": TABLE_FORMAT,
        "target": manifest["target"],
        "device": device_name(driver),
        "driver": driver,
        "iree": {"compiler": manifest["iree"]["compiler"], "runtime": iree_version("iree-base-runtime")},
        "model": model,
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
