"""compile_training: the one verb from a PyTorch model to a compiled training program."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from torch_mlir import ir

from pock_mlir.abi import FUNCTIONS
from pock_mlir.context import make_context
from pock_mlir.frontend import import_model, parameter_shapes
from pock_mlir.hf_model import hf_files
from pock_mlir.layers import frozen_weights
from pock_mlir.onnx_frontend import import_onnx, is_onnx_model, load_onnx, onnx_parameter_shapes
from pock_mlir.optim import SGD
from pock_mlir.passes import run_pipeline
from pock_mlir.passes.pipeline import split_top_level
from pock_mlir.program import METHODS, TrainingProgram
from pock_mlir.quantize import stored_policies
from pock_mlir.runtime.artifact import trainer_module
from pock_mlir.sparse import lora_adapters, resolve_sparse
from pock_mlir.stages import STAGE_PIPELINES
from pock_mlir.targets import resolve_target
from pock_mlir.training import build_training_functions
from pock_mlir.tuning import UNCHOSEN, BackendChoices, Tuning
from pock_mlir.weights import Weights


class CompileError(RuntimeError):
    """Compilation failed; the message names the op, its source location and what to change."""


def _diagnostics(e: ir.MLIRError) -> str:
    lines = [str(d.message) for d in e.error_diagnostics] or [str(e)]
    return "\n".join(lines)


SWITCH = "pock-backend-switch{target={target}"


def _with_tuning(pipeline: str, tuning, target: str, tuning_any: bool) -> str:
    """The lowered stage's pipeline with pock-backend-switch choosing by the table `tuning`, checked
    first (Tuning.from_file: ValueError for one it cannot read or one measured elsewhere)."""
    path = Path(tuning).resolve()
    if re.search(r"[\s{}]", str(path)):
        raise ValueError(f"tuning: {path} has a space or brace, which a pass pipeline cannot carry; move the table")
    Tuning.from_file(str(path), target, tuning_any)
    if SWITCH not in pipeline:
        raise ValueError("tuning: the lowered pipeline given has no pock-backend-switch to choose by the table")
    return pipeline.replace(SWITCH, f"{SWITCH} tuning={path} tuning_any={str(tuning_any).lower()}", 1)


def compile_training(
    model,
    example_inputs,
    example_target,
    *,
    loss="cross_entropy",
    optimizer=None,
    sparse=None,
    target="host",
    iree_flags=(),
    pipelines=None,
    verbose=False,
    output=None,
    cache=True,
    functions=("step", "loss", "evaluate"),
    weights=None,
    tuning=None,
    tuning_any=False,
) -> TrainingProgram:
    """Compile one training step of `model` (forward, loss, backward and optimizer) with IREE.

    model: a torch.nn.Module, or an ONNX inference model (an .onnx path or onnx.ModelProto), whose
        float initializers are the parameters, under their names (docs/onnx.md).
    example_inputs: the batch to train on (torch or numpy tensors of its shape), as the model is
        called: a tensor, a tuple of them (model(*inputs)), a dict of them (model(**inputs), a
        tokenizer's or collator's batch: input_ids, attention_mask, decoder_input_ids, ...), or a
        tuple ending in such a dict (model(*args, **kwargs)). A keyword whose value is None is not
        an input. The Trainer's methods take batches in the same form, with the same keywords.
    example_target: the target the loss compares the output with (class indices for cross_entropy).
    loss: "cross_entropy", "mse" or a callable loss(output, target) returning a scalar; it receives
        the model's output as the model returns it (a tensor, tuple, dict, dataclass, ModelOutput).
        The strings apply to the output's `logits` where it has them (see `output`); a model that
        computes its own loss from a `labels` input takes loss=lambda output, target: output.loss,
        and the labels as the target too (the target is always an input of the step).
    output: for a model returning a structure, the entry evaluate() returns (a key, attribute or
        index); by default `logits` where there is one, else the first.
    optimizer: pock.SGD(...) or pock.AdamW(...); SGD(lr=0.01) by default.
    sparse: which parameters to update: None (all), a dict, pock.SparseUpdate, a preset name or a
        YAML/JSON path (see docs/sparse-updates.md).
    target: host, x86-64[:cpu], aarch64[:features], vulkan or cuda[:sm_XX].
    pipelines: {stage: pipeline} replacing STAGE_PIPELINES entries, e.g. to compare a step without
        one of its passes (benchmarks do this for pock-reorder-updates).
    verbose: print each stage and its time on stderr as compilation goes (pock-compile does so on
        a terminal).
    cache: reuse IREE's output for the same lowered IR and flags from the persistent compile
        cache, and store it there (pock_mlir/cache.py; POCK_MLIR_CACHE=off turns it off everywhere).
    functions: the Trainer methods IREE compiles now, of step, gradients, loss and evaluate, as
        one module; the others compile the first time they are called. step, loss and evaluate
        share a module (and the dispatches their forwards have in common); gradients, which
        repeats the backward and which training does not call, is left out of it unless asked for
        now (one module of both compiles faster than two). "all" compiles one module of every
        function, as a bundle (pock_mlir.bundle) holds it: for a program written as a bundle.
    weights: the weights to start from, read from files instead of the model: a Hugging Face model
        directory (config.json and model.safetensors or its shards) or one .safetensors file. The
        model may then be on the meta device (built from its config alone); bfloat16 and float16
        files convert to the parameters' float32; each tensor is read from the memory-mapped files
        when the Trainer or a bundle takes it, so the host holds no copy of the model (see
        pock_mlir/weights.py). WeightsError names a tensor the files lack, hold beyond the model or
        hold in another shape, before any work.
    tuning: a table pock-tune measured (docs/tuning-for-your-device.md), for pock-backend-switch
        to choose by instead of the target's shipped one; one measured for another target, CPU or
        IREE runtime is refused (ValueError) unless `tuning_any`.
    """
    optimizer = optimizer or SGD(lr=0.01)
    if functions != "all" and not (isinstance(functions, (tuple, list)) and set(functions) <= set(METHODS)):
        raise ValueError(
            f"functions: give the Trainer methods to compile now, of {', '.join(METHODS)}, or 'all'; got {functions!r}"
        )
    unknown = sorted(set(pipelines or {}) - set(STAGE_PIPELINES))
    if unknown:
        raise ValueError(
            f"pipelines: unknown stage(s) {', '.join(unknown)}; stages with pipelines are {', '.join(STAGE_PIPELINES)}"
        )
    stage_pipelines = {**STAGE_PIPELINES, **(pipelines or {})}
    resolved_target = resolve_target(target)
    if weights is not None and is_onnx_model(model):
        raise ValueError("weights=: an ONNX model holds its weights as initializers; give the .onnx file alone")
    checked = None if weights is None else Weights(weights, model)
    if tuning is not None:
        stage_pipelines["lowered"] = _with_tuning(stage_pipelines["lowered"], tuning, resolved_target.name, tuning_any)
    context = make_context()
    stages: dict[str, str] = {}
    timings: dict[str, float] = {}
    backend = UNCHOSEN  # pock-backend-switch's choices, as it returns them

    def log(message):
        if verbose:
            print(f"[pock] {message}", file=sys.stderr, flush=True)

    with context, ir.Location.unknown():
        log("exporting the model and its loss (torch.export) and importing them into MLIR")
        start = time.perf_counter()
        # The scheme is resolved on the model's parameters before tracing: LoRA adapters and
        # int8 weights change the traced forward pass.
        onnx_model = load_onnx(model) if is_onnx_model(model) else None
        torch_model = None if onnx_model is not None else model
        adapters = lora_adapters(sparse, torch_model)
        shapes = parameter_shapes(model, adapters) if onnx_model is None else onnx_parameter_shapes(onnx_model)
        scheme = resolve_sparse(sparse, torch_model, shapes)
        if scheme.policies and all(p.kind == "frozen" for p in scheme.policies.values()):
            by_model = len(scheme.not_requiring_grad) == len(scheme.policies)
            why = (
                "the model sets requires_grad=False on all of them"
                if by_model
                else f"by the sparse scheme {scheme.source!r}"
            )
            raise ValueError(f"every parameter is frozen ({why}): there is nothing to train")
        if scheme.quantize and onnx_model is not None:
            raise ValueError(
                f"quantize: {scheme.quantize} weights need the PyTorch model; compile the ONNX model without quantize"
            )
        quantized = frozen_weights(model, scheme.policies, scheme.quantize) if scheme.quantize else []
        timings["sparse scheme"] = time.perf_counter() - start
        if onnx_model is None:
            imported = import_model(
                model, example_inputs, example_target, loss, context, output, adapters, quantized, checked
            )
        else:
            imported = import_onnx(onnx_model, example_inputs, example_target, loss, context, output)
        stages["imported"] = str(imported.module)
        timings.update({f"import: {step}": seconds for step, seconds in imported.timings.items()})
        log(f"imported {len(imported.params)} parameters in {time.perf_counter() - start:.1f}s")

        start = time.perf_counter()
        signature = build_training_functions(
            imported, optimizer, stored_policies(scheme.policies, quantized), adapters, quantized
        )
        stages["training"] = str(imported.module)
        timings["training: step functions"] = time.perf_counter() - start

        for stage, pipeline in stage_pipelines.items():
            stage_start = time.perf_counter()
            for element in split_top_level(pipeline.replace("{target}", resolved_target.name.partition(":")[0])):
                start = time.perf_counter()
                try:
                    results = run_pipeline(imported.module, element)
                except ir.MLIRError as e:
                    raise CompileError(f"{stage} stage failed:\n{_diagnostics(e)}") from None
                backend = next((r for r in results if isinstance(r, BackendChoices)), backend)
                key = f"{stage}: {element.split('{')[0]}"
                timings[key] = timings.get(key, 0.0) + time.perf_counter() - start
            stages[stage] = str(imported.module)
            log(f"{stage} stage done in {time.perf_counter() - stage_start:.1f}s")

    program = TrainingProgram(
        stages=stages,
        signature=signature,
        target=resolved_target,
        optimizer=optimizer,
        scheme=scheme,
        initial_params=imported.initial_params,
        initial_buffers=imported.initial_buffers,
        extra_flags=tuple(iree_flags),
        backend=backend,
        timings=timings,
        cache=cache,
        hf_files=hf_files(model),
    )
    # Compiled now so that errors surface here, not at the first step (its steps time themselves).
    wanted = set(FUNCTIONS) if functions == "all" else {f for m in functions for f in trainer_module(METHODS[m])}
    for group in [tuple(f for f in FUNCTIONS if f in wanted)] if wanted else []:
        log(f"compiling with IREE for {resolved_target.name} (the longest stage): {', '.join(group)}")
        start = time.perf_counter()
        program.module(group)
        log(f"IREE compiled for {resolved_target.name} in {time.perf_counter() - start:.1f}s")
    return program
