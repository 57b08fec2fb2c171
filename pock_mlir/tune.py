"""pock-tune's build-machine half: a tuning bundle of every candidate pock-backend-switch can choose
for one program, compiled for its target, for pock_mlir/runtime/tune.py to time on the device.

    tune-bundle/
      tune.json          what it holds (BUNDLE_FORMAT): target, model, IREE compiler, the program's
                         FLOPs as the per-program choices weigh them, and the candidates
      convs/N.vmfb       one convolution or gradient in one form: @main(g, x, w) (forward: (x, w)),
                         the IR the pass emits for it (form_function), for each convolution shape
                         of the program and each op of it the program has (forward, each gradient
                         used, both gradients together where both are)
      steps/N/           the whole program as a device bundle (pock_mlir/bundle.py) under one of the
                         flag sets the switch chooses between (data tiling x vector tails x fusion)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pock_mlir.abi import FUNCTIONS
from pock_mlir.bundle import write_bundle
from pock_mlir.conv_forms import CONV_OPS, FORMS, GRADIENT_INDEX, GRADIENTS, ConvShape
from pock_mlir.files import TEMPORARY_PREFIX, atomic_write, staging_directory
from pock_mlir.iree_flags import AGGRESSIVE_FUSION, DATA_TILING, FLAG_SETS, INPUT_TORCH, MASKED_VECTOR_TAILS
from pock_mlir.targets import resolve_target
from pock_mlir.tuning import BUNDLE_FORMAT, DATA_TILED_SETS, PLAIN_SETS, Choice, iree_version

MANIFEST = "tune.json"
CANDIDATE = "a pock-tune candidate"


def form_function(shape: ConvShape, op: str, form: str) -> str:
    """One form of `op` as a torch-dialect function @main(g, x, w) (forward: (x, w)), emitted by
    the function pock-backend-switch emits it with. GRADIENTS, form "<input>+<weight>": both
    gradients of g * g, the elementwise producer a step's g always has."""
    return form_functions({"main": (shape, op, form)})


def form_functions(forms: dict[str, tuple[ConvShape, str, str]]) -> str:
    """Several forms as form_function emits each, one module with a function per name: one IREE
    compilation for them all."""
    from torch_mlir import ir
    from torch_mlir.dialects import func

    from pock_mlir.context import make_context
    from pock_mlir.torch_builder import TorchBuilder
    from pock_mlir.torch_types import TensorType

    def vtensor(dims):
        return ir.Type.parse(TensorType(tuple(dims), "f32").asm())

    with make_context(), ir.Location.unknown() as loc:
        module = ir.Module.create()
        for name, (shape, op, form) in forms.items():
            with ir.InsertionPoint(module.body):
                function = func.FuncOp(
                    name, ([vtensor(a) for a in arguments(shape, op)], [vtensor(r) for r in results(shape, op)])
                )
            entry = function.add_entry_block()
            args = list(entry.arguments)
            g, (x, w) = (None, args) if op == "forward" else (args[0], args[1:])
            b = TorchBuilder(ir.InsertionPoint(entry), loc)
            if op == GRADIENTS:
                g = b.mul(g, g)
                values = [
                    FORMS[part_op, part](b, shape, g, x, w)
                    for part_op, part in zip(("input_grad", "weight_grad"), form.split("+"))
                ]
            else:
                values = [FORMS[op, form](b, shape, g, x, w)]
            with ir.InsertionPoint(entry):
                func.ReturnOp(values)
        return str(module)


def arguments(shape: ConvShape, op: str) -> list[tuple[int, ...]]:
    """The shapes of form_function's arguments: (g,) x, w."""
    return ([] if op == "forward" else [shape.output_shape()]) + [shape.input_shape(), shape.weight_shape()]


def results(shape: ConvShape, op: str) -> list[tuple[int, ...]]:
    return {
        "forward": [shape.output_shape()],
        "weight_grad": [shape.weight_shape()],
        "input_grad": [shape.input_shape()],
        GRADIENTS: [shape.input_shape(), shape.weight_shape()],
    }[op]


def program_matmul_flops(program) -> dict:
    """What pock-backend-switch's per-program choices read of a program (its input: the sparse stage)."""
    from torch_mlir import ir

    from pock_mlir.context import make_context
    from pock_mlir.passes.pock_backend_switch import module_matmul_flops

    with make_context():
        return dataclasses.asdict(module_matmul_flops(ir.Module.parse(program.ir("sparse")).operation))


def conv_ops(program) -> dict[ConvShape, list[str]]:
    """Each convolution shape of the program's sparse stage (pock-backend-switch's input) and the ops
    of it there the switch chooses a form for: forward, each gradient used, and both together
    where both are; an op with one form only is left out (nothing to choose)."""
    from torch_mlir import ir

    from pock_mlir.context import make_context
    from pock_mlir.passes.base import functions
    from pock_mlir.passes.pock_backend_switch import conv_shape
    from pock_mlir.torch_builder import decode_operand

    found: dict[ConvShape, set[str]] = {}
    with make_context():
        module = ir.Module.parse(program.ir("sparse")).operation
        for function in functions(module):
            for op in (op.operation for op in function.regions[0].blocks[0].operations):
                if op.name == "torch.aten.convolution":
                    x, w, _, stride, padding, dilation, transposed, _, groups = map(decode_operand, op.operands)
                    shape = conv_shape(op, x, w, op.results[0], stride, padding, dilation, transposed, groups)
                    used = {"forward"}
                elif op.name == "torch.aten.convolution_backward":
                    g, x, w, _, stride, padding, dilation, transposed, _, groups, mask = map(
                        decode_operand, op.operands
                    )
                    shape = conv_shape(op, x, w, g, stride, padding, dilation, transposed, groups)
                    used = {name for name, i in GRADIENT_INDEX.items() if mask[i] and list(op.results[i].uses)}
                else:
                    continue
                if shape is not None:
                    found.setdefault(shape, set()).update(used)
    for ops in found.values():
        if set(GRADIENT_INDEX) <= ops:
            ops.add(GRADIENTS)
    return {
        shape: [op for op in (*CONV_OPS, GRADIENTS) if op in ops and len(shape.forms(op)) > 1]
        for shape, ops in found.items()
    }


def candidate_sets(target) -> tuple[str, ...]:
    """The flag sets pock-backend-switch chooses between for `target`: data tiling, vector tails
    (CPU targets only: the others take no tails flag, see TrainingProgram.iree_flags) and fusion."""
    sets = PLAIN_SETS + DATA_TILED_SETS
    return sets if target.backend == "llvm-cpu" else tuple(s for s in sets if MASKED_VECTOR_TAILS not in FLAG_SETS[s])


def _chosen(flag_set: str) -> dict[str, Choice]:
    """The backend choices under which a program compiles with `flag_set`'s data tiling, tails and fusion."""
    flags = FLAG_SETS[flag_set]
    return {
        "data_tiling": Choice("data-tiled" if DATA_TILING in flags else "plain", CANDIDATE),
        "vector_tails": Choice("masked" if MASKED_VECTOR_TAILS in flags else "peeled", CANDIDATE),
        "fusion": Choice("aggressive" if AGGRESSIVE_FUSION in flags else "default", CANDIDATE),
    }


def check_tune_destination(directory) -> Path:
    """The tuning bundle directory to write: new, empty, or an earlier tuning bundle (replaced)."""
    destination = Path(directory)
    if destination.is_symlink():
        raise ValueError(f"{destination} is a symbolic link; give the directory itself")
    if destination.exists() and not destination.is_dir():
        raise ValueError(f"{destination} exists and is not a directory; choose another output directory")
    if destination.is_dir() and any(destination.iterdir()) and not _is_tune_bundle(destination):
        raise ValueError(f"{destination} exists and is not a pock-tune bundle; choose another output directory")
    return destination


def _is_tune_bundle(directory: Path) -> bool:
    try:
        return json.loads((directory / MANIFEST).read_text()).get("format") == BUNDLE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def prepare(
    file, model_name: str, target: str, directory, *, optimizer=None, sparse=None, sets=None, jobs=None, log=None
) -> Path:
    """Compile every candidate for the model of `file` (pock-compile's ModelFile) into a tuning
    bundle at `directory` (see the module docstring); `sets` limits the flag sets (of
    candidate_sets). `jobs` compilations run at once (default: one per CPU; each is an
    iree-compile process), and a candidate whose text another's repeats is compiled once.
    Nothing appears at `directory` unless the whole bundle was written."""
    from pock_mlir.compiler import compile_training

    log = log or (lambda message: print(f"pock-tune: {message}", file=sys.stderr, flush=True))
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: give the number of compilations to run at once, 1 or more")
    resolved = resolve_target(target)
    destination = check_tune_destination(directory)
    chosen_sets = candidate_sets(resolved)
    unknown = [s for s in sets or () if s not in chosen_sets]
    if unknown:
        raise ValueError(
            f"--sets: {', '.join(unknown)} not among the sets chosen for {target}: {', '.join(chosen_sets)}"
        )
    chosen_sets = tuple(s for s in chosen_sets if s in sets) if sets else chosen_sets
    start = time.perf_counter()
    log(f"compiling {model_name} for {target} up to pock-backend-switch's input")
    program = compile_training(
        file.model,
        file.inputs,
        file.target,
        loss=file.loss,
        optimizer=optimizer,
        sparse=sparse,
        target=target,
        output=file.output,
        functions=(),
        weights=file.weights,
    )
    ops = conv_ops(program)
    count = sum(len(shape.forms(op)) for shape, shape_ops in ops.items() for op in shape_ops) + len(chosen_sets)
    progress = _Progress(count, log)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staged = staging_directory(destination)

    def step(i: int, flag_set: str) -> dict:
        progress.log(f"the whole step under {flag_set}")
        variant = dataclasses.replace(
            program,
            backend=dataclasses.replace(program.backend, **_chosen(flag_set)),
            modules={},
            streams={},
            replaced={},
            timings={},
        )
        try:
            variant.module(FUNCTIONS)
        except RuntimeError as e:
            return {"set": flag_set, "error": str(e).strip().splitlines()[0][:300]}
        if "fusion" in variant.replaced:
            return {"set": flag_set, "error": variant.replaced["fusion"].reason.rpartition(": ")[2][:300]}
        write_bundle(
            variant,
            staged / "steps" / str(i),
            example_inputs=file.inputs,
            example_target=file.target,
            loss=file.loss,
            model_file=model_name,
            sparse=sparse,
        )
        return {"set": flag_set, "bundle": f"steps/{i}", "iree_flags": variant.iree_flags()}

    def conv(text: str, what: str) -> bytes:
        from iree.compiler import compile_str

        progress.log(what)
        return compile_str(text, extra_args=[INPUT_TORCH, *resolved.compile_flags()])

    pool = ThreadPoolExecutor(jobs)
    try:
        (staged / "convs").mkdir()
        # Filters are process-wide, so set once for every thread: a failure under aggressive fusion
        # is that candidate's result, not a warning.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="IREE failed to compile .* with the aggressive fusion")
            # the whole steps first, the longest compilations; the convolutions' texts are emitted meanwhile
            stepping = [pool.submit(step, i, flag_set) for i, flag_set in enumerate(chosen_sets)]
            cases, modules, compiling = [], 0, {}  # compiling: each distinct candidate text, its module files
            for shape, shape_ops in ops.items():
                candidates = []
                for op in shape_ops:
                    for form in shape.forms(op):
                        module, modules = f"convs/{modules}.vmfb", modules + 1
                        text, what = form_function(shape, op, form), f"{shape.kind()} {op} {form}"
                        if text in compiling:
                            progress.log(f"{what}: the same text as an earlier candidate")
                        else:
                            compiling[text] = pool.submit(conv, text, what), []
                        compiling[text][1].append(module)
                        candidates.append(
                            {"key": f"{op}/{form}", "op": op, "module": module, "arguments": arguments(shape, op)}
                        )
                cases.append({"shape": shape.to_json(), "class": shape.kind(), "candidates": candidates})
            steps = [future.result() for future in stepping]
            for future, files in compiling.values():
                vmfb = future.result()
                for module in files:
                    (staged / module).write_bytes(vmfb)
        manifest = {
            "format": BUNDLE_FORMAT,
            "target": target,
            "model": model_name,
            "iree": {"compiler": iree_version("iree-base-compiler")},
            "program": program_matmul_flops(program),
            "convs": cases,
            "steps": steps,
            "prepare_s": time.perf_counter() - start,
        }
        atomic_write(staged / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        _replace(staged, destination)
    except BaseException:
        pool.shutdown(cancel_futures=True)  # what has not started does not; what has is waited for
        shutil.rmtree(staged, ignore_errors=True)
        raise
    finally:
        pool.shutdown()
    log(f"wrote {destination}/: {count} candidates in {time.perf_counter() - start:.0f}s")
    return destination


class _Progress:
    """prepare's progress lines, "[done/count] what", from the threads that compile."""

    def __init__(self, count: int, log):
        self.count, self.write, self.done, self.lock = count, log, 0, threading.Lock()

    def log(self, what: str) -> None:
        with self.lock:
            self.done += 1
            self.write(f"[{self.done}/{self.count}] {what}")


def _replace(staged: Path, destination: Path) -> None:
    """Put the staged bundle in place of an earlier one (or of nothing)."""
    if not destination.exists():
        os.replace(staged, destination)
        return
    retired = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{destination.name}.old.", dir=destination.parent))
    os.replace(destination, retired / destination.name)
    os.replace(staged, destination)
    shutil.rmtree(retired)
