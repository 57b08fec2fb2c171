"""One measurement in its own process: `python -m bench.child '<json spec>'` prints `RESULT <json>`.
A training system says READY after its warm-up and then takes commands on stdin, one a line:
`round` times a round of steps, `done` ends (by hand: `printf 'round\ndone\n' | python -m bench.child ...`).

Each system runs in a fresh process so that its peak memory is its own. Peak memory is the
process's peak resident set during the timed steps (the kernel's high-water mark, reset by
writing 5 to /proc/self/clear_refs after warm-up; bench/memory.py) minus the resident set right after the
imports every child shares (torch, numpy, the IREE runtime, pock_mlir): what the model, its
parameters, gradients, optimizer state, activations and the framework's working memory take.
pock-mlir compiles in one child and trains in another, so compiler memory is not counted.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import pickle
import shutil
import sys
import time
from pathlib import Path

import iree.runtime  # noqa: F401  (part of the shared import baseline)
import numpy as np
import torch

import pock_mlir as pock
from bench.flops import step_flops
from bench.memory import rss_kb
from bench.models import ORT_LOSS_TYPES, PEFT_SCHEMES, ort_optimizer, scheme_spec, trainable_names
from bench.protocol import Unsupported, first_line, memory_facts, print_result, timed_rounds
from bench.zoo import bench_model
from pock_mlir.bundle import write_bundle
from pock_mlir.frontend import resolve_loss
from pock_mlir.iree_flags import CHOSEN_VECTOR_TAILS
from pock_mlir.ort_recipe import ORT_LOSSES


def _setup(spec):
    model_def = bench_model(spec["model"])
    module = model_def.build()
    inputs, target = model_def.batch()
    scheme, label = scheme_spec(model_def, spec["scheme"])
    return model_def, module, inputs, target, scheme, label


def with_peft_adapters(scheme: dict, module):
    """`module` under PEFT's LoRA, with the adapters and the other trained modules the pock-mlir
    scheme names (PyTorch's LoRA baseline)."""
    import peft  # only this row's child needs it (it imports transformers)

    from pock_mlir.sparse import lora_adapters

    adapters = lora_adapters(scheme, module)
    others = trainable_names({k: v for k, v in scheme.items() if not str(v).startswith("lora")}, module)
    config = peft.LoraConfig(
        r=adapters[0].r,
        lora_alpha=adapters[0].alpha,
        target_modules=[a.module for a in adapters],
        modules_to_save=sorted({n.rpartition(".")[0] for n in others}) or None,
    )
    return peft.get_peft_model(module, config)


def torch_step(spec, compiled: bool):
    """PyTorch's training step of the spec's model and scheme: (forward_backward, step, optimizer,
    the scheme's label, the trained parameters)."""
    model_def, module, inputs, target, scheme, label = _setup(spec)
    if spec["scheme"] in PEFT_SCHEMES:
        module = with_peft_adapters(scheme, module)
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    else:
        trainable = trainable_names(scheme, module)
    for name, p in module.named_parameters():
        p.requires_grad_(name in trainable)
    params = [p for n, p in module.named_parameters() if n in trainable]
    optimizer = model_def.optimizer.torch_optimizer(params)
    loss_fn = resolve_loss(model_def.loss)
    forward = torch.compile(module) if compiled else module

    def forward_backward():
        loss = loss_fn(forward(*inputs), target)
        loss.backward()
        return loss

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward()
        optimizer.step()
        return loss.item()

    return forward_backward, step, optimizer, label, params


def run_torch(spec, compiled: bool) -> dict:
    forward_backward, step, optimizer, label, params = torch_step(spec, compiled)
    result = {"scheme_used": label, "trainable_params": sum(p.numel() for p in params)}
    warmup = spec["warmup"]
    if compiled:
        start = time.perf_counter()
        step()  # compiles; it is also the first warm-up step, so every system takes the same steps
        result["compile_s"] = time.perf_counter() - start
        warmup -= 1
    result.update(timed_rounds(step, {**spec, "warmup": max(warmup, 0)}))
    if spec.get("count_flops"):
        optimizer.zero_grad(set_to_none=True)
        result["flops"] = step_flops(forward_backward)
    return result


def count_flops(spec) -> dict:
    """The FLOPs of PyTorch's step of the spec's model and scheme, untimed (python -m bench --recount-flops)."""
    forward_backward, *_ = torch_step(spec, compiled=False)
    return {"flops": step_flops(forward_backward)}


def compile_pock(spec) -> dict:
    model_def, module, inputs, target, scheme, label = _setup(spec)
    # "ort_optimizer": the optimizer ONNX Runtime runs in its place (pock-mlir-deployed-ort-optimizer)
    optimizer = ort_optimizer(model_def.optimizer) if spec.get("ort_optimizer") else model_def.optimizer
    options = dict(
        loss=model_def.loss,
        optimizer=optimizer,
        sparse=None if scheme == "full" else scheme,
        pipelines=spec.get("pipelines"),
        cache=False,  # time the compilation itself
        # another CPU's table, as on a CPU with none of its own (python -m bench.held_out --as-unmeasured-cpu)
        tuning=spec.get("tuning"),
        tuning_any=True,
    )
    flags, tails = tuple(spec["iree_flags"]), None
    if spec.get("other_tails"):  # pock-mlir-other-tails: the vector tails pock-backend-switch did not choose
        chosen = pock.compile_training(module, inputs, target, functions=(), **options).vector_tails.form
        tails = "peeled" if chosen == "masked" else "masked"
        flags += CHOSEN_VECTOR_TAILS[tails]
    start = time.perf_counter()
    program = pock.compile_training(module, inputs, target, iree_flags=flags, **options)
    compile_s = time.perf_counter() - start
    # what training needs (the step's compiled module), without the IR text of every stage (which
    # would stay resident in the run)
    runnable = dataclasses.replace(program, stages={}, modules=dict(program.modules))
    with open(spec["program"], "wb") as f:
        pickle.dump(runnable, f)
    if spec.get("bundle"):  # for pock-mlir-deployed (bench/deployed_child.py)
        write_bundle(program, spec["bundle"], example_inputs=inputs, example_target=target, loss=model_def.loss)
    return {
        "scheme_used": label,
        "compile_s": compile_s,
        "compile_breakdown_s": dict(program.timings),
        "iree_flags": program.iree_flags(),
        "vector_tails": tails or program.vector_tails.form,
        "tuning": program.backend.tuning,  # the table pock-backend-switch chose by
        "trainable_params": program.signature.trained_values,
    }


def device_batch(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """A bench batch as a Trainer's device takes it (int64 as int32), converted once, not in every timed step."""

    def converted(x):
        return x.numpy().astype(np.int32) if x.dtype == torch.int64 else x.numpy()

    return tuple(converted(x) for x in inputs), converted(target)


def run_pock(spec) -> dict:
    model_def = bench_model(spec["model"])
    inputs, target = device_batch(*model_def.batch())
    with open(spec["program"], "rb") as f:
        program = pickle.load(f)
    trainer = program.trainer(retain_memory=spec.get("retain_memory", True))
    del program  # the trainer holds what it needs on the device
    gc.collect()
    result = {**timed_rounds(lambda: trainer.step(inputs, target), spec), **memory_facts(trainer)}
    if spec.get("profile"):
        from bench.profile import profile_step

        with open(spec["program"], "rb") as f:
            result["profile"] = profile_step(pickle.load(f), inputs, target)
    return result


class _ModelAndLoss(torch.nn.Module):
    """The model and its loss as one module, so that ONNX Runtime differentiates the model's own
    loss (a token-level loss, a loss on a ModelOutput's logits) on the same batch."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs_and_target):
        *inputs, target = inputs_and_target
        return self.loss_fn(self.model(*inputs), target)


def _layer_norms_with_statistics(graph) -> None:
    """Give each LayerNormalization node its optional Mean and InvStdDev outputs: ONNX Runtime's
    gradient of LayerNormalization reads them, and torch's exporter leaves them off."""
    for node in graph.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([f"{node.output[0]}.mean", f"{node.output[0]}.inv_std_dev"])


ORT_PLAIN_SGD = "SGD without momentum (ONNX Runtime has none)"


def _ort_optimizer(optimizer):
    """ONNX Runtime's optimizer block for the model's optimizer (bench.models.ort_optimizer), and
    the note when it differs."""
    note = ORT_PLAIN_SGD if ort_optimizer(optimizer) != optimizer else None
    return _ort_block(*_ort_recipe_optimizer(optimizer)), note


def _ort_recipe_optimizer(optimizer) -> tuple[str, dict]:
    """ONNX Runtime's optimizer for the model's (bench.models.ort_optimizer) as generate_artifacts and
    pock.from_ort_recipe name it: its OptimType name and its block's arguments."""
    runs = ort_optimizer(optimizer)
    if isinstance(runs, pock.AdamW):
        return "AdamW", {"betas": list(runs.betas), "eps": runs.eps, "weight_decay": runs.weight_decay}
    if isinstance(runs, pock.SGD) and not (runs.momentum or runs.weight_decay or runs.nesterov):
        return "SGD", {}
    raise NotImplementedError(f"ONNX Runtime's on-device training has no optimizer like {optimizer}")


def _ort_block(name: str, options: dict):
    """ONNX Runtime's optimizer block of an _ort_recipe_optimizer."""
    from onnxruntime.training.onnxblock import optim

    return optim.AdamW(**options) if name == "AdamW" else optim.SGD()


def export_ort(spec) -> dict:
    """ONNX Runtime training artifacts of the model and its loss (torch's TorchScript ONNX exporter,
    then onnxruntime.training.artifacts), and the batch as batch.npz, in spec["artifacts"]."""
    import onnx
    from onnxruntime.training import artifacts

    model_def, module, inputs, target, scheme, label = _setup(spec)
    if hasattr(module, "set_attn_implementation"):
        # a Hugging Face model: the same attention, without the grouped-query SDPA that torch's
        # TorchScript exporter cannot convert
        module.set_attn_implementation("eager")
    directory = Path(spec["artifacts"])
    directory.mkdir()
    np.savez(directory / "batch.npz", *(x.numpy() for x in (*inputs, target)))  # positional: the graph's inputs
    start = time.perf_counter()
    exported = io.BytesIO()
    torch.onnx.export(
        _ModelAndLoss(module, resolve_loss(model_def.loss)),
        (*inputs, target),
        exported,
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        export_params=True,
        input_names=[*(f"input{i}" for i in range(len(inputs))), "target"],
        output_names=["loss"],
    )
    graph = onnx.load_from_string(exported.getvalue())
    _layer_norms_with_statistics(graph)
    trainable = trainable_names(scheme, module)
    parameters = {f"model.{name}": name in trainable for name, _ in module.named_parameters()}
    initializers = [i.name for i in graph.graph.initializer if i.name in parameters]
    lost = [name for name in parameters if name not in initializers and parameters[name]]
    if lost:  # the exporter folded or renamed them: ONNX Runtime would leave them untrained
        raise RuntimeError(f"trainable parameters missing from the exported graph: {', '.join(lost)}")
    optimizer, optimizer_note = _ort_optimizer(model_def.optimizer)
    artifacts.generate_artifacts(
        graph,
        requires_grad=[n for n in initializers if parameters[n]],
        frozen_params=[n for n in initializers if not parameters[n]],
        loss=None,
        optimizer=optimizer,
        artifact_directory=directory,
    )
    result = {
        "scheme_used": label,
        "compile_s": time.perf_counter() - start,
        "learning_rate": model_def.optimizer.lr,
        "trainable_params": sum(p.numel() for n, p in module.named_parameters() if n in trainable),
    }
    return {**result, "optimizer_differs": optimizer_note} if optimizer_note else result


def export_onnx_file(spec) -> dict:
    """The file an ONNX Runtime user trains: the model alone (its loss is ONNX Runtime's) exported by
    torch's TorchScript ONNX exporter in training mode (BatchNormalization trains), parameters
    unfolded, as model.onnx; the batch as batch.npz; and the generate_artifacts arguments of the
    scheme (whole tensors), the loss and ONNX Runtime's optimizer as recipe.json, in spec["file"].
    Dropouts are exported at p = 0: ONNX Runtime and pock-mlir draw their masks apart, and the
    losses of the two systems are checked equal (bench.__main__.check_same_losses)."""
    import onnx

    model_def, module, inputs, target, scheme, label = _setup(spec)
    if model_def.loss not in ORT_LOSS_TYPES:
        raise Unsupported(f"ONNX Runtime's LossType has no loss like {model_def.loss}")
    zeroed = sorted(n for n, m in module.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0)
    for name in zeroed:
        module.get_submodule(name).p = 0.0
    directory = Path(spec["file"])
    directory.mkdir()
    np.savez(directory / "batch.npz", *(x.numpy() for x in (*inputs, target)))  # positional: the graph's inputs
    exported = io.BytesIO()
    torch.onnx.export(
        module,
        inputs,
        exported,
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        export_params=True,
        input_names=[f"input{i}" for i in range(len(inputs))],
        output_names=["output"],
    )
    graph = onnx.load_from_string(exported.getvalue())
    _layer_norms_with_statistics(graph)  # what ONNX Runtime's gradient reads: the file a user of it makes
    onnx.save(graph, directory / "model.onnx")
    trainable = trainable_names(scheme, module)
    parameters = {name for name, _ in module.named_parameters()}
    initializers = [i.name for i in graph.graph.initializer if i.name in parameters]
    lost = sorted(trainable - set(initializers))
    if lost:  # the exporter folded or renamed them: neither system could train them
        raise RuntimeError(f"trainable parameters missing from the exported graph: {', '.join(lost)}")
    optimizer, options = _ort_recipe_optimizer(model_def.optimizer)
    recipe = {
        "requires_grad": [n for n in initializers if n in trainable],
        "frozen_params": [n for n in initializers if n not in trainable],
        "loss": ORT_LOSS_TYPES[model_def.loss],
        "optimizer": optimizer,
        "lr": model_def.optimizer.lr,
        "optimizer_options": options,
    }
    (directory / "recipe.json").write_text(json.dumps(recipe))
    result = {
        "scheme_used": label,
        "learning_rate": model_def.optimizer.lr,
        "trainable_params": sum(p.numel() for n, p in module.named_parameters() if n in trainable),
    }
    if ort_optimizer(model_def.optimizer) != model_def.optimizer:
        result["optimizer_differs"] = ORT_PLAIN_SGD
    if optimizer == "SGD":  # torch.optim has ONNX Runtime's SGD, not its AdamW (pock.OrtAdamW)
        result["float32_strays"] = _float32_strays(spec, ort_optimizer(model_def.optimizer))
    return {**result, "dropout_zeroed": zeroed} if zeroed else result


FLOAT32_THREADS = (1, 2)  # the bench's PyTorch runs on two threads, make test's on one


def _float32_strays(spec, optimizer) -> list[float]:
    """How far PyTorch's float32 loss strays from its float64 loss at each warm-up step of the
    file's training (the larger over FLOAT32_THREADS: the order of float32 sums depends on how many
    threads split them), for check_same_losses: a trajectory that amplifies rounding (train-mode
    BatchNorm on a small batch) separates any two float32 runtimes by about as much."""
    want = _eager_losses(spec, optimizer, spec["warmup"], float64=True, dropout_off=True)
    threads, strays = torch.get_num_threads(), [0.0] * len(want)
    try:
        for count in FLOAT32_THREADS:
            torch.set_num_threads(count)
            losses = _eager_losses(spec, optimizer, spec["warmup"], dropout_off=True)
            strays = [max(s, abs(a - b)) for s, a, b in zip(strays, losses, want)]
    finally:
        torch.set_num_threads(threads)
    return strays


def _onnx_file(spec) -> tuple[Path, dict, list[np.ndarray]]:
    """export_onnx_file's directory, its recipe and its batch (inputs, then the target)."""
    directory = Path(spec["file"])
    with np.load(directory / "batch.npz") as saved:
        batch = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return directory, json.loads((directory / "recipe.json").read_text()), batch


def ort_file_artifacts(spec) -> dict:
    """ONNX Runtime's training artifacts of the .onnx file with the recipe (generate_artifacts with
    its LossType and optimizer), and the batch, in spec["artifacts"] for bench/ort_child.py."""
    import onnx
    from onnxruntime.training import artifacts

    source, recipe, _ = _onnx_file(spec)
    directory = Path(spec["artifacts"])
    directory.mkdir()
    shutil.copy(source / "batch.npz", directory / "batch.npz")
    start = time.perf_counter()
    artifacts.generate_artifacts(
        onnx.load(source / "model.onnx"),
        requires_grad=recipe["requires_grad"],
        frozen_params=recipe["frozen_params"],
        loss=artifacts.LossType[recipe["loss"]],
        optimizer=_ort_block(recipe["optimizer"], recipe["optimizer_options"]),
        artifact_directory=directory,
    )
    return {"compile_s": time.perf_counter() - start}


def compile_onnx_file(spec) -> dict:
    """pock.from_ort_recipe of the .onnx file with the recipe ONNX Runtime's row trains, written as a
    device bundle in spec["bundle"] for bench/deployed_child.py."""
    source, recipe, batch = _onnx_file(spec)
    *inputs, target = (torch.from_numpy(x) for x in batch)
    start = time.perf_counter()
    program = pock.from_ort_recipe(
        source / "model.onnx",
        tuple(inputs),
        target,
        **recipe,
        iree_flags=tuple(spec["iree_flags"]),
        cache=False,  # time the compilation itself
    )
    compile_s = time.perf_counter() - start
    write_bundle(
        program, spec["bundle"], example_inputs=tuple(inputs), example_target=target, loss=ORT_LOSSES[recipe["loss"]]
    )
    return {
        "compile_s": compile_s,
        "compile_breakdown_s": dict(program.timings),
        "iree_flags": program.iree_flags(),
        "trainable_params": program.signature.trained_values,
    }


def export_jax(spec) -> dict:
    """What bench/jax_child.py's port of the model reads, in spec["artifacts"]: the config, the
    parameters and buffers by their PyTorch names, the names the scheme trains, the optimizer and
    the batch."""
    model_def, module, inputs, target, scheme, label = _setup(spec)
    optimizer = model_def.optimizer
    if not isinstance(optimizer, pock.AdamW):  # the decoders' optimizer, the one the port has
        raise NotImplementedError(f"the JAX port has AdamW only, not {optimizer}")
    trained = trainable_names(scheme, module)
    directory = Path(spec["artifacts"])
    directory.mkdir()
    arrays = {name: t.detach().numpy() for name, t in (*module.named_parameters(), *module.named_buffers())}
    np.savez(directory / "arrays.npz", **arrays)
    (ids,) = inputs
    np.savez(directory / "batch.npz", ids=ids.numpy().astype(np.int32), target=target.numpy().astype(np.int32))
    exported = {
        "config": dataclasses.asdict(module.cfg),
        "trained": sorted(trained),
        "optimizer": dataclasses.asdict(optimizer),
    }
    (directory / "model.json").write_text(json.dumps(exported))
    return {
        "scheme_used": label,
        "trainable_params": sum(p.numel() for n, p in module.named_parameters() if n in trained),
    }


def _executorch_optimizer(optimizer):
    """The optimizer ExecuTorch's training runs for the model's (its training extension has SGD,
    momentum included, and nothing else), and the note when it differs."""
    if isinstance(optimizer, pock.SGD):
        return optimizer, None
    return pock.SGD(lr=optimizer.lr), f"SGD at the same learning rate (ExecuTorch has no {type(optimizer).__name__})"


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return torch.var(x, dim, correction=correction, keepdim=keepdim), torch.mean(x, dim, keepdim=keepdim)


def _empty(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.empty(size, dtype=dtype, device=device)


def _executorch_decompositions() -> dict:
    """Core ATen and the decompositions ExecuTorch's kernels need in a training graph beyond them:
    the functional batch norm of a training step (no ExecuTorch kernel; torch's decomposition of it
    calls var_mean, which core ATen would lower to prims ops ExecuTorch cannot run, so var_mean
    becomes var and mean), empty_permuted (no ExecuTorch kernel; its layout only orders memory,
    and ExecuTorch's tensors are contiguous) and max-pool's backward (ExecuTorch's kernel gave wrong
    gradients)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    table = core_aten_decompositions()
    table.update(
        get_decompositions(
            [aten._native_batch_norm_legit_functional.default, aten.max_pool2d_with_indices_backward.default]
        )
    )
    table[aten.var_mean.correction] = _var_mean
    table[aten.empty_permuted.default] = _empty
    return table


def _check_executorch_kernels(graph) -> None:
    """Fail before lowering on what ExecuTorch's kernels cannot run in the joint graph."""
    for node in graph.nodes:
        if node.target is torch.ops.aten.convolution_backward.default and node.args[2].meta["val"].dim() != 4:
            raise Unsupported("ExecuTorch has no backward of 1-D (or 3-D) convolutions, only of 2-D ones")


def _eager_losses(spec, optimizer, steps: int, float64: bool = False, dropout_off: bool = False) -> list[float]:
    """The losses of eager PyTorch's first `steps` steps with `optimizer` (the one ExecuTorch runs:
    what the ExecuTorch child's must equal before it is timed), in float64 if asked, with the
    Dropouts at p = 0 if asked (as export_onnx_file exports them)."""
    model_def, module, inputs, target, scheme, _ = _setup(spec)
    if float64:
        module = module.double()
        inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    for dropout in (m for m in module.modules() if dropout_off and isinstance(m, torch.nn.Dropout)):
        dropout.p = 0.0
    trainable = trainable_names(scheme, module)
    for name, p in module.named_parameters():
        p.requires_grad_(name in trainable)
    torch_optimizer = optimizer.torch_optimizer([p for n, p in module.named_parameters() if n in trainable])
    loss_fn, losses = resolve_loss(model_def.loss), []
    for _ in range(steps):
        torch_optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(module(*inputs), target)
        loss.backward()
        torch_optimizer.step()
        losses.append(loss.item())
    return losses


def export_executorch(spec) -> dict:
    """ExecuTorch's training program of the model and its loss (torch.export, the joint forward and
    backward of _export_forward_backward, to_edge, to_executorch) as program.pte, the batch as
    batch.npz, and training.json (its optimizer, eager PyTorch's losses of the checked steps) in
    spec["artifacts"], for bench/executorch_child.py."""
    from executorch.exir import to_edge
    from torch._export.verifier import SpecViolationError
    from torch.export.experimental import _export_forward_backward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model_def, module, inputs, target, scheme, label = _setup(spec)
    optimizer, optimizer_note = _executorch_optimizer(model_def.optimizer)
    trainable = trainable_names(scheme, module)
    owners = {id(p): name for name, p in module.named_parameters()}  # a tied weight under its first name
    tied = [
        (name, owners[id(p)])
        for name, p in module.named_parameters(remove_duplicate=False)
        if owners[id(p)] != name and owners[id(p)] in trainable
    ]
    if tied:  # _export_forward_backward asserts that a parameter received no gradient
        raise Unsupported(
            f"torch.export's joint forward and backward cannot train a tied weight ({tied[0][0]} is {tied[0][1]})"
        )
    for name, p in module.named_parameters():
        p.requires_grad_(name in trainable)  # the joint graph has the gradients of these only
    directory = Path(spec["artifacts"])
    directory.mkdir()
    np.savez(directory / "batch.npz", *(x.numpy() for x in (*inputs, target)))  # positional: the method's inputs
    start = time.perf_counter()
    # the math SDPA, where the joint graph decomposes attention: the fused kernels' backward ops
    # have no ExecuTorch kernel
    with sdpa_kernel(SDPBackend.MATH):
        exported = torch.export.export(_ModelAndLoss(module, resolve_loss(model_def.loss)), (*inputs, target))
        joint = _export_forward_backward(exported).run_decompositions(_executorch_decompositions())
    _check_executorch_kernels(joint.graph)
    # ExecuTorch's portable and optimized kernels, no XNNPACK delegate: its partitioner gave wrong losses
    try:
        program = to_edge(joint).to_executorch()
    except SpecViolationError as e:  # an op of the joint graph outside the Core ATen opset to_edge takes
        raise Unsupported(f"ExecuTorch's to_edge: {first_line(e).split(' (https')[0]}") from None
    (directory / "program.pte").write_bytes(program.buffer)
    compile_s = time.perf_counter() - start
    checked = max(spec["warmup"], 1)
    (directory / "training.json").write_text(
        json.dumps(
            {"optimizer": dataclasses.asdict(optimizer), "eager_losses": _eager_losses(spec, optimizer, checked)}
        )
    )
    result = {
        "scheme_used": label,
        "compile_s": compile_s,
        "trainable_params": sum(p.numel() for n, p in module.named_parameters() if n in trainable),
    }
    return {**result, "optimizer_differs": optimizer_note} if optimizer_note else result


def measure_sgemm(spec) -> dict:
    """Practical single-precision matmul peak with every thread: the best of torch and numpy."""
    n, repeats = spec.get("size", 2048), 5
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = {}
    for name, mm, x, y in (("torch", torch.mm, a, b), ("numpy", np.matmul, a.numpy(), b.numpy())):
        mm(x, y)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            mm(x, y)
            times.append(time.perf_counter() - start)
        best[name] = 2 * n**3 / min(times) / 1e9
    return {"sgemm_gflops": best, "peak_gflops": max(best.values())}


RUNNERS = {
    "eager": lambda spec: run_torch(spec, compiled=False),
    "torch.compile": lambda spec: run_torch(spec, compiled=True),
    "pock-compile": compile_pock,
    "pock-run": run_pock,
    "ort-export": export_ort,  # its training runs in bench/ort_child.py, without torch
    "onnx-file": export_onnx_file,  # the .onnx file both of the ONNX file's rows train
    "ort-file-artifacts": ort_file_artifacts,  # ONNX Runtime's on it, trained in bench/ort_child.py
    "pock-file-compile": compile_onnx_file,  # pock-mlir's on it, trained in bench/deployed_child.py
    "jax-export": export_jax,  # its training runs in bench/jax_child.py, without torch
    "executorch-export": export_executorch,  # its training runs in bench/executorch_child.py
    "sgemm": measure_sgemm,
    "count-flops": count_flops,
}


def _unsupported(error: Exception) -> str | None:
    """Why pock-mlir cannot run the model yet, for the errors that mean that."""
    if isinstance(error, Unsupported):  # a peer cannot run the model
        return first_line(error)
    if isinstance(error, (pock.CompileError, pock.FrontendError)):  # a missing rule or an op the importer lacks
        return first_line(error)
    if isinstance(error, ModuleNotFoundError):
        if not (error.name or "").startswith("examples"):
            raise error
        return f"{error.name.replace('.', '/')}.py does not exist yet"
    return None


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    print_result(lambda: RUNNERS[spec["task"]](spec), rss_kb(), _unsupported)


if __name__ == "__main__":
    main()
