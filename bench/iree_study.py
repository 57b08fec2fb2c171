"""Measures what runs fastest under IREE on this machine; writes pock_mlir/tuning/<target>.json
(the host target's: host-<this CPU>.json, see pock_mlir.tuning.own_table_path).

    python -m bench.iree_study convs        # convolution forms, forward and backward
    python -m bench.iree_study convs --forms flipped   # only the cases a (new) form applies to
    python -m bench.iree_study flags        # IREE flag sets on whole training steps

convs: each conv shape class of the bench CNNs (batch 8) in each form pock-backend-switch can
emit (pock_mlir/conv_forms.py), forward, weight and input gradient, and both gradients together
from one elementwise producer of g in each pair of forms: the IR the pass emits, built by the same
function, as a standalone function compiled, checked against torch and timed alone; the direct
forms also without IREE's global im2col flag. The measured table is what the pass reads.

flags: whole compiled training steps under candidate flag sets, each step's time and its Trainer's
device memory (the sets: pock_mlir/iree_flags.py's FLAG_SETS); the winners for every program go
into its CPU_COMMON, every CPU target's flags, and pock-backend-switch reads the data-tiling,
vector-tails and aggressive-fusion sets' steps to choose those three per program (pock_mlir.tuning).

Timings are the fastest of many calls: on a machine shared with other jobs the minimum is the
least disturbed estimate of what a form or flag set costs (pock_mlir/runtime/timing.py, which
pock-tune shares: it measures one model's own shapes and step on its device instead,
docs/tuning-for-your-device.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from pock_mlir.conv_forms import CONV_OPS, FORM_NAMES, GRADIENTS, ConvShape, Window
from pock_mlir.files import atomic_write
from pock_mlir.iree_flags import CPU_NAME, FLAG_SETS, IM2COL, INPUT_TORCH, flag
from pock_mlir.runtime.timing import step_statistics, time_in_turns, time_interleaved
from pock_mlir.runtime.workspace import ModuleFunctions
from pock_mlir.targets import resolve_target
from pock_mlir.tune import form_function, program_matmul_flops
from pock_mlir.tuning import own_table_path


def target_flags(target: str = "host") -> list[str]:
    """The target's flags, which name its device: what the conv study compiles each form with."""
    return resolve_target(target).compile_flags()


def square(n, c, h, o, k, stride, pad, groups) -> ConvShape:
    return ConvShape(n, c, o, groups, Window.of((k, k), (stride, stride), (pad, pad), (1, 1), (h, h)))


def line(n, c, w, o, k, stride, pad) -> ConvShape:
    """A 1-D convolution as pock-backend-switch sees it: 2-D, of height 1."""
    return ConvShape(n, c, o, 1, Window.of((1, k), (1, stride), (0, pad), (1, 1), (1, w)))


# The conv shape classes of the bench CNNs at batch 8 (MobileNetV2 x0.5 and torchvision's at 96 px,
# ResNet-18-like at 64 px, the keyword spotter's Conv1d layers).
CONV_CASES = [
    square(8, 3, 96, 16, 3, 2, 1, 1),  # stem
    square(8, 16, 48, 48, 1, 1, 0, 1),  # pointwise expand, early
    square(8, 48, 48, 48, 3, 2, 1, 48),  # depthwise, stride 2
    square(8, 96, 12, 96, 3, 1, 1, 96),  # depthwise, late
    square(8, 96, 12, 32, 1, 1, 0, 1),  # pointwise project, late
    square(8, 24, 24, 144, 1, 1, 0, 1),  # pointwise expand, middle
    square(8, 320, 3, 1280, 1, 1, 0, 1),  # pointwise, last (a large weight)
    square(8, 3, 64, 64, 7, 2, 3, 1),  # ResNet stem
    square(8, 64, 16, 64, 3, 1, 1, 1),  # ResNet stage 1
    square(8, 64, 16, 128, 3, 2, 1, 1),  # ResNet stage 2 entry
    square(8, 128, 8, 128, 3, 1, 1, 1),  # ResNet stage 2
    square(8, 128, 8, 256, 3, 2, 1, 1),  # ResNet stage 3 entry
    square(8, 256, 4, 256, 3, 1, 1, 1),  # ResNet stage 3
    square(8, 256, 4, 512, 3, 2, 1, 1),  # ResNet stage 4 entry
    square(8, 512, 2, 512, 3, 1, 1, 1),  # ResNet stage 4
    square(8, 256, 4, 512, 1, 2, 0, 1),  # ResNet strided 1x1 shortcut
    line(8, 40, 98, 64, 3, 1, 1),  # keyword spotter, first layer
    line(8, 64, 98, 64, 3, 2, 1),  # keyword spotter, strided
]


@functools.cache  # the study checks a form's values, then times it
def load_function(text: str, flags: tuple[str, ...], function="main"):
    config, functions = load_functions(text, flags, (function,))
    return config, functions[function]


def load_functions(text: str, flags: tuple[str, ...], names: tuple[str, ...]):
    """The module `text` compiled with `flags`: its device config and {name: call returning numpy arrays}."""
    import iree.compiler as ic
    import iree.runtime as rt

    vmfb = ic.compile_str(text, extra_args=[INPUT_TORCH, *flags])
    config = rt.Config("local-task")
    context = rt.SystemContext(config=config)
    context.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb))
    functions = ModuleFunctions(context, config.device, names)  # with the workspace the target's flags ask for

    def call(name):
        return lambda *args: [np.asarray(r.to_host()) for r in functions(name, *args)]

    return config, {name: call(name) for name in names}


def time_variants(variants: dict) -> dict[str, float]:
    """{name: (mlir text, flags, torch args)} -> {name: ms of the fastest call}, timed interleaved
    (pock_mlir.runtime.timing.time_interleaved)."""
    import iree.runtime as rt

    calls = {}
    for name, (text, flags, args) in variants.items():
        config, fn = load_function(text, tuple(flags))
        device_args = [rt.asdevicearray(config.device, np.require(a.numpy(), requirements="C")) for a in args]
        calls[name] = functools.partial(fn, *device_args)
    return time_interleaved(calls)


def study_convs(flags: list[str], cases=CONV_CASES) -> list[dict]:
    """Every form of every case, compiled with the target's flags and checked against torch."""
    import iree.runtime as rt

    rows = []
    for shape in cases:
        x, w, g = (torch.randn(dims) for dims in (shape.input_shape(), shape.weight_shape(), shape.output_shape()))
        row, variants = {"shape": shape.to_json(), "class": shape.kind()}, {}
        for op in (*CONV_OPS, GRADIENTS):
            args = (x, w) if op == "forward" else (g, x, w)
            wants = _reference(shape, op, g, x, w)
            for form in shape.forms(op):
                text = form_function(shape, op, form)
                config, fn = load_function(text, tuple(flags))
                gots = fn(*(rt.asdevicearray(config.device, a.numpy()) for a in args))
                for got, want in zip(gots, wants, strict=True):
                    scale = float(want.abs().max())
                    assert np.abs(got - want.numpy()).max() <= 1e-4 * scale, (
                        f"{shape.kind()} {op} {form} disagrees with torch"
                    )
                variants[f"{op}/{form}"] = (text, flags, args)
                if form == "direct" and IM2COL in flags:  # what IREE's global im2col flag is worth here
                    variants[f"{op}/direct-without-im2col-flag"] = (text, [f for f in flags if f != IM2COL], args)
        row["ms"] = time_variants(variants)
        for key, ms in row["ms"].items():
            print(f"{shape.kind():34s} {key:40s} {ms:8.3f} ms", flush=True)
        rows.append(row)
    return rows


def _reference(shape: ConvShape, op: str, g, x, w) -> list:
    """torch's results of `op` (GRADIENTS: of g * g, as form_function's)."""
    window = shape.window
    if op == "forward":
        return [
            F.conv2d(x, w, stride=window.stride, padding=window.padding, dilation=window.dilation, groups=shape.groups)
        ]
    mask = [op in ("input_grad", GRADIENTS), op in ("weight_grad", GRADIENTS), False]
    grads = torch.ops.aten.convolution_backward(
        g * g if op == GRADIENTS else g,
        x,
        w,
        None,
        list(window.stride),
        list(window.padding),
        list(window.dilation),
        False,
        [0, 0],
        shape.groups,
        mask,
    )
    return [grad for grad, wanted in zip(grads, mask) if wanted]


def study_flags(models: list[str], flag_sets=FLAG_SETS, steps=20) -> tuple[dict, dict]:
    """Train-step ms (fastest and median of `steps`, timed in turns, see time_in_turns) and a
    Trainer's device memory of whole compiled training programs under each flag set, and each
    program's matmul FLOPs as the per-program choices weigh them."""
    import pock_mlir as pock
    from bench.models import MODELS

    results, programs = {}, {}
    for name in models:
        spec = MODELS[name]
        module = spec.build()
        inputs, target = spec.batch()
        program = pock.compile_training(module, inputs, target, loss=spec.loss, optimizer=spec.optimizer)
        programs[name] = program_matmul_flops(program)
        # the target's device and CPU alone: each set says the rest
        base_target = dataclasses.replace(program.target, flags=(flag(CPU_NAME, "host"),))
        results[name], trainers = {}, {}
        for label, flags in flag_sets.items():
            # compiled afresh with these flags: no modules of the program's own, no cached ones
            variant = dataclasses.replace(
                program, target=base_target, extra_flags=tuple(flags), modules={}, cache=False
            )
            try:
                start = time.perf_counter()
                trainer = variant.trainer()
                trainer.step(inputs, target)  # the first step compiles the step's module
                results[name][label] = {
                    "compile_s": time.perf_counter() - start,
                    "device_mb": variant.device_bytes / 2**20,
                }
                for _ in range(2):
                    trainer.step(inputs, target)
                trainers[label] = trainer  # timed below only once it compiled and ran
            except Exception as e:  # a flag set this IREE cannot compile is a result too
                results[name][label] = {"error": str(e).strip().splitlines()[-1][:300]}
        times = time_in_turns(
            {label: functools.partial(trainer.step, inputs, target) for label, trainer in trainers.items()}, steps
        )
        for label, measured in times.items():
            results[name][label].update(step_statistics(measured))
        for label, result in results[name].items():
            print(name, label, result, flush=True)
    return results, programs


def _convs_with(parser, study: dict | None, forms: list[str], flags: list[str]) -> list[dict]:
    """`study`'s cases with those of CONV_CASES where one of `forms` is implemented measured
    again (in place, or added); the arguments are checked before anything is measured."""
    unknown = sorted(set(forms) - set(FORM_NAMES))
    if unknown:
        parser.error(f"--forms: no form {', '.join(unknown)}; the forms are {', '.join(FORM_NAMES)}")
    if not study or study.get("iree_flags") != flags:
        parser.error("--forms adds to a convs study made with this target's flags; run the whole study")
    cases = [s for s in CONV_CASES if any(f in s.forms(op) for op in CONV_OPS for f in forms)]
    measured = {ConvShape.from_json(row["shape"]): row for row in study_convs(flags, cases)}
    rows = [measured.pop(ConvShape.from_json(row["shape"]), row) for row in study["cases"]]
    return rows + list(measured.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.iree_study", description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=("convs", "flags"))
    parser.add_argument(
        "--models",
        default="mlp,bert,llama,resnet18,mobilenetv2,tiny-vit,tiny-llama,kws",
        help="for flags: bench models to compile",
    )
    parser.add_argument("--sets", default=",".join(FLAG_SETS), help="for flags: which flag sets to compare")
    parser.add_argument(
        "--forms",
        help="for convs: only the cases where one of these forms (comma-separated) is "
        "implemented, each measured whole; the table keeps its other cases",
    )
    parser.add_argument("--target", default="host")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    path = own_table_path(args.target)  # for the host, this CPU's table, never another's
    table = json.loads(path.read_text()) if path.exists() else {}
    load = os.getloadavg()[0]
    if args.study == "convs":
        flags = target_flags(args.target)
        cases = (
            _convs_with(parser, table.get("convs"), args.forms.split(","), flags) if args.forms else study_convs(flags)
        )
        table["convs"] = {"load_average": load, "iree_flags": flags, "cases": cases}
    else:
        unknown = [name for name in args.sets.split(",") if name not in FLAG_SETS]
        if unknown:
            parser.error(f"--sets: no flag set {', '.join(unknown)}; the sets are {', '.join(FLAG_SETS)}")
        sets = {name: FLAG_SETS[name] for name in args.sets.split(",")}
        step_ms, programs = study_flags(args.models.split(","), sets)
        # a study of some models replaces their rows and keeps the other models' (a row names its sets)
        study = table.get("flags", {})
        table["flags"] = {
            "load_average": load,
            "sets": {**study.get("sets", {}), **sets},
            "step_ms": {**study.get("step_ms", {}), **step_ms},
            "programs": {**study.get("programs", {}), **programs},
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
