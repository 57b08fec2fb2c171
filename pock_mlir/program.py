"""TrainingProgram: what compile_training returns, with small documented methods."""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from pock_mlir.abi import EVALUATE, FUNCTIONS, GRADIENTS, LOSS, TRAIN_STEP, TRAIN_STEP_INTO, StepSignature
from pock_mlir.iree_flags import (
    AGGRESSIVE_FUSION,
    CHOSEN_DATA_TILING,
    CHOSEN_FUSION,
    CHOSEN_VECTOR_TAILS,
    FROM_STREAM,
    FUSE_MATMUL_PRODUCERS,
    INPUT_TORCH,
    TO_STREAM,
)
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.artifact import CompiledModule, Schedule, TrainingArtifact, trainer_module
from pock_mlir.targets import Target
from pock_mlir.tuning import NOT_CHOSEN, UNCHOSEN, BackendChoices, Choice

METHODS = {"step": TRAIN_STEP_INTO, "gradients": GRADIENTS, "loss": LOSS, "evaluate": EVALUATE}  # Trainer's


# In the stream-phase IR, each public function's reflection records the workspace it takes.
STREAM_WORKSPACE = re.compile(r"iree\.abi\.transients\.size\.constant = (\d+)")


class _IreeFailed(Exception):
    """IREE failed to compile a module: its error output, or the one line the compile cache kept."""


def _first_error(error: str) -> str:
    """The first error line of IREE's output, without its location."""
    line = next((line for line in error.splitlines() if " error: " in line), error.strip().split("\n")[0])
    return line.split(" error: ", 1)[-1].strip()


def _phase(what: str, functions: tuple[str, ...]) -> str:
    """A compile_report line: IREE's phase, and which module unless it holds every function."""
    return f"iree: {what}" if set(functions) >= set(FUNCTIONS) else f"iree ({', '.join(functions)}): {what}"


@dataclass
class TrainingProgram:
    stages: dict[str, str]
    signature: StepSignature
    target: Target
    optimizer: object
    scheme: object
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    extra_flags: tuple[str, ...] = ()
    backend: BackendChoices = UNCHOSEN  # what pock-backend-switch chose, as it returned it
    timings: dict[str, float] = field(default_factory=dict)
    cache: bool = True  # look up and store IREE's output in the compile cache (pock_mlir/cache.py)
    modules: dict[tuple[str, ...], CompiledModule] = field(default_factory=dict)  # compiled, by functions (module())
    # IREE's stream-phase IR and schedule of modules scheduled but not compiled yet (schedule()), by
    # functions: their compilation resumes from them
    streams: dict[tuple[str, ...], tuple[str, Schedule]] = field(default_factory=dict)
    # pock-backend-switch's choices for the whole program that compiling replaced, by name:
    # "fusion" where IREE failed under the aggressive fusion chosen (see module())
    replaced: dict[str, Choice] = field(default_factory=dict)
    # the model's Hugging Face files (config.json, generation_config.json) by name, as JSON objects:
    # what a bundle (hf/) and Trainer.export_pretrained write; empty for a model not from transformers
    hf_files: dict[str, dict] = field(default_factory=dict)

    def ir(self, stage: str = "lowered") -> str:
        """The IR text after a stage: imported, training, autodiff, sparse or lowered."""
        if stage not in self.stages:
            raise KeyError(f"unknown stage '{stage}'; stages are {', '.join(self.stages)}")
        return self.stages[stage]

    def iree_flags(self) -> list[str]:
        """The target's flags, then the data tiling, vector tails and fusion pock-backend-switch
        chose, matmul-producer fusion for int8 weights (see iree_flags.FUSE_MATMUL_PRODUCERS), then
        extra_flags (which win: `--iree-global-opt-data-tiling=false` turns data tiling off)."""
        tiling = CHOSEN_DATA_TILING[self.data_tiling.form]
        tails = CHOSEN_VECTOR_TAILS[self.vector_tails.form] if self.target.backend == "llvm-cpu" else ()
        fusion = CHOSEN_FUSION[self.fusion.form]
        dequantization = [FUSE_MATMUL_PRODUCERS] if self.signature.quantized else []
        return [INPUT_TORCH, *self.target.compile_flags(), *tiling, *tails, *fusion, *dequantization, *self.extra_flags]

    @property
    def data_tiling(self) -> Choice:
        """pock-backend-switch's choice for the whole program, "data-tiled" or "plain", why, and
        the measurements it compared."""
        return self.backend.data_tiling

    @property
    def vector_tails(self) -> Choice:
        """pock-backend-switch's choice of how IREE vectorizes loop remainders on a CPU, "masked",
        "peeled" or "target default", why, and the measurements it compared."""
        return self.backend.vector_tails

    @property
    def fusion(self) -> Choice:
        """pock-backend-switch's choice of how IREE forms dispatches, "aggressive" or "default",
        why, and the measurements it compared; "default" where IREE failed to compile a module of
        the program with the aggressive fusion chosen (see module())."""
        return self.replaced.get("fusion", self.backend.fusion)

    @property
    def driver(self) -> Choice:
        """pock-backend-switch's choice of the IREE driver a Trainer runs the program on unless
        told otherwise (on a CPU target: local-task or local-sync), why, and what it compared; the
        target's default driver where the pass did not run."""
        return self.backend.driver or Choice(self.target.device, NOT_CHOSEN)

    @property
    def vmfb(self) -> bytes:
        """The IREE module of every function pock_mlir.abi lays out, as a bundle holds it
        (compiled on first use)."""
        return self.module(FUNCTIONS).vmfb

    @property
    def in_place(self) -> frozenset[str]:
        """What that module's train_step_into may write into the buffers it reads it from, as IREE
        scheduled it, by role: params, optimizer (its state), buffers (see pock_mlir/in_place.py)."""
        return self.module(FUNCTIONS).in_place

    def module(self, functions) -> CompiledModule:
        """IREE's module of `functions` alone (the others are made private, and IREE drops them),
        compiled on first use, from the compile cache when it holds it. A Trainer compiles its
        functions in the groups of TRAINER_MODULES.

        IREE 3.13 fails to compile some programs under its aggressive fusion that it compiles
        without (a dispatch over its stack limit, for one). Where pock-backend-switch chose it and
        IREE fails, the program compiles this and later modules with the default fusion instead,
        with a warning; `fusion` says so and why, and the compile cache remembers the failure.
        Where IREE fails with the default fusion too (an op it cannot lower), that is the error."""
        functions = tuple(functions)
        if functions not in self.modules:
            self.modules[functions] = self._falling_back(functions, self._cached)
        return self.modules[functions]

    def schedule(self, functions) -> Schedule:
        """IREE's schedule of the module of `functions` (see module()): from the module when it is
        compiled or in the compile cache, else from IREE's stream phase alone, without generating
        code (about half of a compilation; compiling the module later resumes from there)."""
        functions = tuple(functions)
        if functions in self.streams:
            return self.streams[functions][1]
        if functions not in self.modules:
            cached = self._falling_back(functions, self._from_cache)
            if cached is None:
                self.streams[functions] = self._falling_back(
                    functions, lambda group: self._to_stream(self._source(group), group)
                )
                return self.streams[functions][1]
            self.modules[functions] = cached
        return self.modules[functions].schedule

    @property
    def device_bytes(self) -> int:
        """The device memory a Trainer of this program holds once it steps (Trainer.device_bytes,
        before it loads the gradients module), from the step module's schedule (see schedule())."""
        schedule = self.schedule(trainer_module(TRAIN_STEP_INTO))
        return self.signature.device_bytes(schedule.in_place, schedule.workspace_bytes)

    def compiler(self) -> TrainingProgram:
        """What compiling more of this program's modules needs, sharing its compiled modules and
        timings: the lowered IR, without the other stages' IR and without the initial parameters
        and buffers, a host copy of the model (what a Trainer keeps for the modules it compiles on
        first call, so that dropping the program frees them)."""
        return replace(
            self, stages={k: v for k, v in self.stages.items() if k == "lowered"}, initial_params={}, initial_buffers={}
        )

    def _falling_back(self, functions: tuple[str, ...], attempt):
        """attempt(functions), IREE's work on a module; again with the default fusion where IREE
        failed under the aggressive fusion pock-backend-switch chose (see module()). RuntimeError
        with IREE's error otherwise."""
        start = time.perf_counter()
        try:
            return attempt(functions)
        except _IreeFailed as failed:
            error = str(failed)
            if self.fusion.form != "aggressive" or any(f.startswith(AGGRESSIVE_FUSION) for f in self.extra_flags):
                raise RuntimeError(iree_failure(error, self.target.name, self._source(functions))) from None
        from pock_mlir import cache

        self.timings[_phase("failed with aggressive fusion", functions)] = time.perf_counter() - start
        reason = _first_error(error)
        failed_flags = self.iree_flags()  # under the aggressive fusion, which the cache remembers failing
        self.replaced["fusion"] = replace(
            self.fusion,
            form="default",
            reason=f"{self.fusion.reason}, but IREE failed to compile {', '.join(functions)} with it: {reason}",
        )
        self.streams.clear()  # IREE's stream phase under the aggressive fusion
        try:
            result = attempt(functions)
        except _IreeFailed as failed:
            # not the fusion's failure (an op IREE cannot lower fails either way): IREE's error alone
            del self.replaced["fusion"]
            raise RuntimeError(iree_failure(str(failed), self.target.name, self._source(functions))) from None
        if self.cache and (root := cache.directory()) is not None:
            cache.store_failure(root, cache.key(self._source(functions), failed_flags), reason)
        warnings.warn(
            f"IREE failed to compile {', '.join(functions)} with the aggressive fusion "
            f"pock-backend-switch chose ({reason}); compiled with IREE's default fusion "
            "instead (program.fusion)",
            stacklevel=3,
        )
        return result

    def _source(self, functions: tuple[str, ...]) -> str:
        lowered = self.stages["lowered"]
        if set(functions) >= set(FUNCTIONS):
            return lowered
        return re.sub(
            r"^(\s*func\.func )@(\w+)\(",
            lambda m: m.group(0) if m.group(2) in functions else f"{m.group(1)}private @{m.group(2)}(",
            lowered,
            flags=re.M,
        )

    def _cached(self, functions: tuple[str, ...]) -> CompiledModule:
        from pock_mlir import cache

        compiled = self._from_cache(functions)
        if compiled is None:
            source = self._source(functions)
            compiled = self._compile(source, functions)
            if self.cache and (root := cache.directory()) is not None:
                cache.store(
                    root, cache.key(source, self.iree_flags()), compiled.vmfb, {"in_place": sorted(compiled.in_place)}
                )
        return compiled

    def _from_cache(self, functions: tuple[str, ...]) -> CompiledModule | None:
        from pock_mlir import cache

        root = cache.directory() if self.cache else None
        if root is None:
            return None
        start = time.perf_counter()
        entry = cache.key(self._source(functions), self.iree_flags())
        if (error := cache.failure(root, entry)) is not None:
            raise _IreeFailed(error)
        hit = cache.load(root, entry)
        if hit is None:
            return None
        self.timings[_phase("from the compile cache", functions)] = time.perf_counter() - start
        return CompiledModule(hit[0], functions, frozenset(hit[1]["in_place"]))

    def _to_stream(self, source: str, functions: tuple[str, ...]) -> tuple[str, Schedule]:
        """The first half of a compilation: IREE's stream-phase IR, and the schedule it holds."""
        from iree.compiler import compile_str
        from iree.compiler.tools import CompilerToolError

        from pock_mlir.in_place import roles_in_place

        try:
            start = time.perf_counter()
            stream = compile_str(source, extra_args=[*self.iree_flags(), TO_STREAM]).decode()
            self.timings[_phase("to the stream phase", functions)] = time.perf_counter() - start
        except CompilerToolError as e:
            raise _IreeFailed(str(e)) from None
        in_place = frozenset()
        if TRAIN_STEP_INTO in functions:
            start = time.perf_counter()
            in_place = roles_in_place(stream, TRAIN_STEP_INTO, self.signature.written_argument_pairs())
            self.timings[_phase("in-place check of the schedule", functions)] = time.perf_counter() - start
        sizes = [int(size) for size in STREAM_WORKSPACE.findall(stream)]
        return stream, Schedule(in_place, max(sizes, default=None))

    def _compile(self, source: str, functions: tuple[str, ...]) -> CompiledModule:
        # Two halves of one compilation, the first perhaps done by schedule(): the stream-phase IR
        # between them holds IREE's schedule.
        from iree.compiler import compile_str
        from iree.compiler.tools import CompilerToolError

        stream, schedule = self.streams.pop(functions, None) or self._to_stream(source, functions)
        try:
            start = time.perf_counter()
            vmfb = compile_str(stream, extra_args=[*self.iree_flags(), FROM_STREAM])
            self.timings[_phase("code generation", functions)] = time.perf_counter() - start
        except CompilerToolError as e:
            raise _IreeFailed(str(e)) from None
        return CompiledModule(vmfb, functions, schedule.in_place)

    def compile_report(self) -> str:
        """Where compilation time went: each import step, each pass of each stage, IREE's halves."""
        total = sum(self.timings.values())
        width = max(len(k) for k in self.timings)
        lines = [f"compile time: {total:.1f}s"]
        for step, seconds in self.timings.items():
            lines.append(f"  {step:<{width}}  {seconds:7.2f}s  {100 * seconds / total:5.1f}%")
        return "\n".join(lines)

    def report(self):
        """Each parameter's update policy and the backward's cost, full BP next to this program's
        sparse BP: ops, FLOPs, saved activations, gradients (see pock_mlir.report)."""
        from pock_mlir.report import report

        return report(
            self.stages["training"],
            TRAIN_STEP,
            self.scheme.source,
            self.scheme.unmatched,
            self.scheme.not_requiring_grad,
        )

    def backend_report(self, function: str = TRAIN_STEP) -> str:
        """What pock-backend-switch chose for each convolution of `function` and why (the
        measurements that decided it: a pock-tune table, or pock_mlir/tuning/<target>.json, as
        the last line says)."""
        chosen = self.backend.ops.get(function, ())
        tuning = f"tuning: {self.backend.tuning}"
        program = [
            f"{what}: {choice.form} ({choice.reason})"
            for what, choice in (
                ("matmuls", self.data_tiling),
                ("vector tails", self.vector_tails),
                ("fusion", self.fusion),
                ("driver", self.driver),
            )
        ]
        if not chosen:
            header = f"{function}: no convolutions, nothing for pock-backend-switch to choose per op"
            return "\n".join([header, *program, tuning])
        lines = [f"{function}: {len(chosen)} convolution op(s), implementation chosen per op for {self.target.name}"]
        lines += [f"  {c.choice.form:9s} {c.op}: {c.choice.reason}" for c in chosen]
        return "\n".join([*lines, *program, tuning])

    def artifact(self) -> TrainingArtifact:
        """What a Trainer runs: the modules compiled so far (those it compiles later, from
        compiler(), join them) and the initial parameters and buffers."""
        return TrainingArtifact(
            self.signature,
            self.target,
            self.modules,
            self.initial_params,
            self.initial_buffers,
            self.driver.form,
            compile=self.compiler().module,
            hf_files=self.hf_files,
        )

    def trainer(self, device: str | None = None, retain_memory: bool = True, on_nonfinite: str = "raise"):
        """Load the module on the IREE runtime; parameters start at the model's values. See
        Trainer for retain_memory and on_nonfinite."""
        return Trainer(self.artifact(), device=device, retain_memory=retain_memory, on_nonfinite=on_nonfinite)


def iree_failure(error: str, target: str, lowered: str = "") -> str:
    """What IREE's error output means, in one line where it is an op IREE cannot lower (an op
    torch-mlir has no lowering for, e.g. aten.fft_fft). IREE then often names a constant that op
    uses; `lowered` (the text IREE compiled) tells which op that is."""
    match = re.search(r"""<stdin>:(\d+):\d+: error: failed to legalize operation '([\w.]+)'""", error)
    if not match:
        return f"IREE failed to compile the training program for target {target}:\n{error[:4000]}"
    line, op = int(match.group(1)), match.group(2)
    lines = lowered.splitlines()
    if op.startswith("torch.constant.") and line <= len(lines):
        value = lines[line - 1].split("=")[0].strip()
        users = (
            re.search(r"= (torch\.\w+\.[\w.]+) ", text)
            for text in lines[line:]
            if re.search(rf"{re.escape(value)}\b", text)
        )
        op = next((m.group(1) for m in users if m), op)
    return (
        f"the model uses {op}, which torch-mlir and IREE cannot compile for {target}; pock-mlir cannot run "
        f"this model on the device (replace or remove that operation)"
    )
