"""From an nn.Module and a loss to torch-dialect IR with parameters as function arguments.

torch.export cannot trace torch.func.grad, so only the forward pass and the loss are
exported, as functions of (parameters, buffers, inputs, target) through functional_call;
pock-autodiff derives the backward pass. Core ATen decompositions are applied before import
(IREE cannot compile some undecomposed ops). int64 inputs and targets travel as int32 (IREE
misreads i64 input buffers on demotion) and are widened back inside the exported function, so
the model and the loss see the dtypes the user gave, as in eager PyTorch.

Buffers the forward pass updates in place (BatchNorm running statistics and batch counts in
train mode) are found by running the model once on copies of its buffers; `forward_loss`
returns their new values after the loss, in `ImportedModel.updated_buffers` order, and the
model's (selected) output last. The step trains with the model in the mode it has when compiled.
`evaluate` and the loss of validation run it as `model.eval()` does (dropout off, BatchNorm on its
running statistics): `forward_loss_eval`, the same function exported with the model in eval mode,
on a zero target for `evaluate`. A model whose train-mode forward draws no dropout masks, updates
no buffers and gives the eval-mode output on the example batch computes alike in both modes: it is
exported once, and `forward_loss` serves both (exporting is most of the frontend's time).
`evaluate_train` is evaluate in the compiled mode (ImportedModel.eval_function).

Dropout and stochastic depth in training mode stay on and are reproducible: when the model draws
such masks, its functions take one more input after the model's own, `seed` (an int32 scalar),
and the model is traced inside `pock_mlir.dropout.SeededDropout(seed)`, which computes each mask with a
counter-based integer hash of (seed, dropout call number, element index) in pure int32 torch
ops; see pock_mlir/dropout.py for the exact scheme. The Trainer passes the seed and increments
it after every step. Any other random op (torch.rand, bernoulli of a probability tensor, ...) is
an error naming the op and its source line, never silently dropped.

Token-level cross-entropy (output (B, T, V), target (B, T)) goes through a callable loss, e.g.
`lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())`: the "cross_entropy" string
follows F.cross_entropy, whose class dimension is dim 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch_mlir import ir
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter

from pock_mlir import layers, lora, quantize
from pock_mlir.abi import (
    EVALUATE,
    EVALUATE_TRAIN,
    FORWARD_LOSS,
    RESERVED_INPUT_NAMES,
    SEED_INPUT,
    TensorSpec,
    positional_input_name,
    split_call,
)
from pock_mlir.dropout import SeededDropout

LOSSES: dict[str, Callable] = {  # on what evaluate returns of a structured output (select_output)
    "cross_entropy": lambda output, target: F.cross_entropy(select_output(output), target.long()),
    "mse": lambda output, target: F.mse_loss(select_output(output), target),
}


EVAL_FORWARD_LOSS = "forward_loss_eval"  # the eval-mode forward and loss, where its modes differ


class FrontendError(ValueError):
    """The model, its example inputs or its loss cannot be exported."""


def spec_of(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(t.shape), str(torch.empty((), dtype=t.dtype).numpy().dtype))


@dataclass
class ImportedModel:
    """The imported module (functions `forward_loss`, perhaps `forward_loss_eval`, `evaluate` and
    `evaluate_train`) and what its arguments are."""

    module: ir.Module
    params: list[TensorSpec]
    buffers: list[TensorSpec]
    updated_buffers: list[str]  # returned by forward_loss after the loss, in this order
    inputs: list[TensorSpec]
    target: TensorSpec
    output: TensorSpec
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    state_dict: dict[str, str]  # the model's state_dict keys -> the tensor holding each (state_dict_sources)
    eval_function: str  # the eval-mode forward and loss: EVAL_FORWARD_LOSS, or FORWARD_LOSS where the modes agree
    vocabularies: dict[str, int] = field(default_factory=dict)  # see embedding_vocabularies
    timings: dict[str, float] = field(default_factory=dict)  # seconds per import step
    by_keyword: int = 0  # the last this many model inputs are keyword arguments (StepSignature.by_keyword)


def as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    raise FrontendError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def call_tensors(inputs) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """The (args, kwargs) tensors of a model call from a batch's inputs (see pock_mlir.abi.split_call)."""
    try:
        args, kwargs = split_call(inputs)
    except ValueError as e:
        raise FrontendError(str(e)) from None
    reserved = [k for k in kwargs if k in RESERVED_INPUT_NAMES or k in map(positional_input_name, range(len(args)))]
    if reserved:
        raise FrontendError(
            f"keyword input(s) {', '.join(reserved)}: the compiled module gives the name(s) to its "
            f"target, dropout seed or positional inputs; wrap the model in a module whose forward "
            f"takes the input under another name"
        )
    tensors = {}
    for key, value in kwargs.items():
        try:
            tensors[key] = as_tensor(value)
        except FrontendError as e:
            raise FrontendError(
                f"keyword input {key!r}: {e}; inputs are tensors (set other arguments on the model, "
                f"e.g. in its config, or wrap it in a module that passes them)"
            ) from None
    return tuple(as_tensor(x) for x in args), tensors


def device_dtype(t: torch.Tensor) -> torch.Tensor:
    """Integer tensors travel to the device as int32 (see module docstring)."""
    if t.dtype == torch.int64:
        return t.to(torch.int32)
    return t


def resolve_loss(loss) -> Callable:
    if callable(loss):
        return loss
    if loss in LOSSES:
        return LOSSES[loss]
    raise FrontendError(f"unknown loss {loss!r}; use one of {', '.join(LOSSES)} or a callable loss(output, target)")


def _state_with_copies(names, values, updated) -> dict:
    """Parameters and buffers by name, the `updated` buffers replaced by copies: torch.export
    cannot functionalize an in-place update of a function argument, but can of a copy, which
    then holds the buffer's new value."""
    state = dict(zip(names, values))
    state.update({name: state[name].clone() for name in updated})
    return state


@dataclass(frozen=True)
class Rewrites:
    """What the traced forward computes differently from the model: LoRA adapters added to some
    layers (pock_mlir/lora.py), int8 or int4 weights in others (pock_mlir/quantize.py). Their tensors are
    parameters of the program, not of the model."""

    adapters: tuple[lora.Adapter, ...] = ()
    quantized: tuple[quantize.QuantizedWeight, ...] = ()

    def initial_values(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The program's parameters from the model's: quantized weights in place of their float32
        ones, then the adapters' initial values."""
        result = {name: value for name, value in params.items() if name not in {w.weight for w in self.quantized}}
        for weight in self.quantized:
            value = params[weight.weight]
            if value.is_meta:
                # weights= files: the stored tensors' shapes and dtypes alone (the values are
                # quantized from the files later, one tensor at a time: weights.py)
                for name, (shape, dtype) in weight.stored_specs.items():
                    result[name] = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device="meta")
                continue
            result.update({n: torch.from_numpy(v) for n, v in weight.quantize(value.numpy()).items()})
        device = "meta" if any(v.is_meta for v in params.values()) else "cpu"
        adapters = layers.initial_adapter_values(list(self.adapters))
        result.update({n: torch.from_numpy(v).to(device) for n, v in adapters.items()})
        return result

    @contextlib.contextmanager
    def attached(self, model, state: dict):
        """The model computes with the rewrites, their tensors read from `state`; yields the
        entries of `state` that are the model's own."""
        added = lora.names(self.adapters) | {n for w in self.quantized for n in (w.values, w.scale)}
        with (
            layers.adapters_attached(model, list(self.adapters), state),
            layers.quantized_attached(model, list(self.quantized), state),
        ):
            yield {name: value for name, value in state.items() if name not in added}


def parameter_shapes(model, adapters: list[lora.Adapter]) -> dict[str, tuple[int, ...]]:
    """The shapes of the model's parameters and of the adapters it will get, by name."""
    if not isinstance(model, torch.nn.Module):
        raise FrontendError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    shapes.update({n: shape for a in adapters for n, shape in ((a.a, a.a_shape), (a.b, a.b_shape))})
    return shapes


def state_dict_sources(model: torch.nn.Module) -> dict[str, str]:
    """The model's state_dict keys, in its order, each with the parameter or buffer holding it as
    named_parameters and named_buffers name it (its first name): a tied weight is one parameter
    under each of its keys; a non-persistent buffer is under none. An extra state that is no
    parameter or buffer (get_extra_state) is not a tensor the program holds, and is left out."""
    first_name: dict[int, str] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        first_name.setdefault(id(tensor), name)
    return {
        key: first_name[id(tensor)]
        for key, tensor in model.state_dict(keep_vars=True).items()
        if id(tensor) in first_name
    }


def _call_model(model, state: dict, inputs: tuple, by_keyword: tuple[str, ...], seeded: bool, rewrites: Rewrites):
    """model(*args, **kwargs) with `state` (the rewrites' tensors included), kwargs the last inputs,
    named by `by_keyword`; a seeded call's last input is the seed of its dropout masks."""
    seed, inputs = (inputs[-1], inputs[:-1]) if seeded else (None, inputs)
    split = len(inputs) - len(by_keyword)
    args, kwargs = tuple(inputs[:split]), dict(zip(by_keyword, inputs[split:]))
    with rewrites.attached(model, state) as own:
        if seed is None:
            return functional_call(model, own, args, kwargs)
        with SeededDropout(seed):
            return functional_call(model, own, args, kwargs)


def select_output(output, selector=None) -> torch.Tensor:
    """The tensor `evaluate` returns from what the model returns: the output itself when it is a
    tensor; else the entry `selector` names (a key or attribute of a dict, dataclass or Hugging
    Face ModelOutput, an index of a tuple or list), by default `logits` where there is one, else
    the first entry; nested structures are followed the same way."""
    return _selected(output, selector)[1]


def _selected(output, selector=None) -> tuple[str, torch.Tensor]:
    """select_output's tensor and its path in the output ("output" for a tensor, else the keys
    followed, e.g. "logits"), which the bundle records."""
    if isinstance(output, torch.Tensor):
        if selector is not None:
            raise FrontendError(f"output={selector!r}: the model returns a tensor, not a structure to select from")
        return "output", output
    if dataclasses.is_dataclass(output) and not isinstance(output, Mapping):
        output = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
    if isinstance(output, Mapping):
        entries = {k: v for k, v in output.items() if v is not None}
    elif isinstance(output, (tuple, list)):
        entries = dict(enumerate(output))
    else:
        raise FrontendError(
            f"the model returns a {type(output).__name__}; pock-mlir takes tensors, tuples, lists, "
            f"dicts, dataclasses and ModelOutputs of them"
        )
    key = selector if selector is not None else "logits" if "logits" in entries else next(iter(entries), None)
    if key not in entries:
        raise FrontendError(f"output={selector!r}: the model's output has {', '.join(map(repr, entries)) or 'nothing'}")
    path, tensor = _selected(entries[key])
    return (str(key) if path == "output" else f"{key}.{path}"), tensor


def _describe(output) -> str:
    return str(tuple(output.shape)) if isinstance(output, torch.Tensor) else f"a {type(output).__name__}"


def _hold_outside_module_tree(wrapper: torch.nn.Module, model: torch.nn.Module) -> None:
    """wrapper.model = model without making it a submodule: torch.export would lift the model's
    own buffers into the program, and the importer finds no value for non-persistent ones (rotary
    tables, attention masks). Every tensor reaches the model through functional_call instead."""
    object.__setattr__(wrapper, "model", model)


def _widened(values, dtypes) -> tuple:
    """The batch in the dtypes the user gave (int64 class indices, token ids): the module takes
    int32 at its boundary, the model and the loss see what they see in eager PyTorch."""
    return tuple(v.to(d) for v, d in zip(values, dtypes))


class _ForwardLoss(torch.nn.Module):
    """(loss, new values of the updated buffers..., evaluate's output) from (params..., buffers...,
    inputs..., target). One export serves the step and evaluate: exporting and decomposing are most
    of the frontend's time, and evaluate's forward is the step's."""

    def __init__(self, model, names, updated, dtypes, by_keyword, seeded, rewrites, loss_fn, selector):
        super().__init__()
        _hold_outside_module_tree(self, model)
        self.names, self.updated, self.dtypes, self.seeded, self.loss_fn = names, updated, dtypes, seeded, loss_fn
        self.by_keyword, self.rewrites, self.selector = by_keyword, rewrites, selector

    def forward(self, *args):
        n = len(self.names)
        state = _state_with_copies(self.names, args[:n], self.updated)
        *inputs, target = _widened(args[n:], self.dtypes)
        output = _call_model(self.model, state, tuple(inputs), self.by_keyword, self.seeded, self.rewrites)
        return (
            self.loss_fn(output, target),
            *(state[name] for name in self.updated),
            select_output(output, self.selector),
        )


def _add_evaluate(module: ir.Module, name: str, forward: str) -> None:
    """name(params..., buffers..., inputs...) -> the selected output: the function `forward` (a
    forward and loss) on a zero target, its last result. The loss and buffer updates it drops are
    dead once inlined (pock-dce)."""
    from torch_mlir.dialects import func

    from pock_mlir.passes.base import function_named
    from pock_mlir.torch_builder import TorchBuilder

    forward_loss = function_named(module.operation, forward)
    arguments = list(forward_loss.regions[0].blocks[0].arguments)
    loc = ir.Location.name(name)
    with loc, ir.InsertionPoint(module.body):
        evaluate = func.FuncOp(
            name, ([a.type for a in arguments[:-1]], [ir.FunctionType(forward_loss.type).results[-1]])
        )
        block = evaluate.add_entry_block()
    with loc, ir.InsertionPoint(block) as ip:
        target = TorchBuilder.type_of(arguments[-1])
        zeros = TorchBuilder(ip, loc).full(target.shape, 0, target.dtype)
        results = func.CallOp(forward_loss, [*block.arguments, zeros]).results
        func.ReturnOp([results[-1]])


@contextlib.contextmanager
def _in_eval_mode(model: torch.nn.Module):
    """model.eval() for the block; then every module back in the mode it had."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _split_into_slices(x, split_sizes, dim=0):
    starts = [0, *itertools.accumulate(split_sizes)]
    return [torch.ops.aten.slice.Tensor(x, dim, start, end) for start, end in zip(starts, starts[1:])]


def _unfold_within_its_windows(x, dim, size, step):
    """Tensor.unfold of the part of `dim` its windows cover: torch-mlir cannot lower an unfold that
    leaves elements after its last window (NotImplemented keeps the op)."""
    covered = (x.shape[dim] - size) // step * step + size
    if covered == x.shape[dim]:
        return NotImplemented
    return torch.ops.aten.unfold.default(torch.ops.aten.slice.Tensor(x, dim, 0, covered), dim, size, step)


def _embedding_bag_as_matmuls(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """embedding_bag as an embedding and a mask of which bag each index is in: sums and means are a
    matmul of the mask with the embedded rows, max an amax over the masked rows. torch-mlir lowers
    only the sum mode of the fused op, and through these ops every mode trains by their rules. The
    other three results are torch's bookkeeping for its backward kernels, which F.embedding_bag
    drops; they are given as its mean and max modes return them (per index its bag; per bag its
    size without padding; in max mode, per bag and feature the row of the max, else the size)."""
    count = indices.shape[0]
    starts = offsets[:-1] if include_last_offset else offsets
    ends = offsets[1:] if include_last_offset else torch.cat([offsets[1:], offsets.new_full((1,), count)])
    position = torch.arange(count, dtype=offsets.dtype)
    within = (position >= starts[:, None]) & (position < ends[:, None])  # (bags, indices)
    in_bag = within & (indices != padding_idx) if padding_idx >= 0 else within
    bag_size = in_bag.sum(1)
    offset2bag = (within * torch.arange(starts.shape[0], dtype=offsets.dtype)[:, None]).sum(0)
    rows = torch.ops.aten.embedding.default(weight, indices, -1, scale_grad_by_freq)
    if mode == 2:
        masked = torch.where(in_bag[:, :, None], rows, float("-inf"))
        empty = (bag_size == 0)[:, None]
        output = torch.where(empty, 0.0, masked.amax(1))
        max_indices = torch.where(empty, 0, indices[masked.argmax(1)])
        return output, offset2bag, bag_size, max_indices
    weights = in_bag.to(weight.dtype)
    if per_sample_weights is not None:
        weights = weights * per_sample_weights
    output = weights @ rows
    if mode == 1:
        output = output / bag_size.clamp_min(1)[:, None].to(weight.dtype)
    return output, offset2bag, bag_size, bag_size


def _grouped_mm_as_masked_bmm(input, weight, offs):
    """Hugging Face's grouped matmul of experts (rows offs[i-1]:offs[i] of input times weight[i],
    the rows past offs[-1] zero) as one bmm of every expert's copy of input with the other experts'
    rows zeroed, summed over experts: its loop over data-dependent row ranges neither exports nor
    lowers, and through mul, bmm and sum it trains by their rules (E times the matmul's FLOPs)."""
    rows = torch.arange(input.shape[0], dtype=offs.dtype)
    group = (offs[None, :] <= rows[:, None]).sum(1)  # per row the index of its expert
    own = group[None, :] == torch.arange(weight.shape[0], dtype=group.dtype)[:, None]  # (experts, rows)
    return torch.bmm(own[:, :, None].to(input.dtype) * input, weight).sum(0)


def _histc_as_comparisons(input, bins=100, min=0, max=0):
    """histc with given bounds as a comparison of each element's bin with every bin, summed
    (torch-mlir does not lower histc; Hugging Face's experts count their tokens with it). Bounds
    taken from the data (min == max) have no static form: NotImplemented keeps the op."""
    if min == max:
        return NotImplemented
    flat = input.flatten()
    inside = (flat >= min) & (flat <= max)
    bin_of = ((flat - min) * bins / (max - min)).floor().clamp(0, bins - 1)  # as torch computes it; max: last bin
    hits = (bin_of[:, None] == torch.arange(bins, dtype=flat.dtype)[None, :]) & inside[:, None]
    return hits.sum(0).to(input.dtype)


def decompositions() -> dict:
    """torch-mlir's core ATen decompositions, except that `detach` stays (the table turns it into
    `alias`, through which gradients would flow), `_log_softmax` stays (its rule is one fused
    expression; through the decomposition's max, cross-entropy's backward made three more
    logits-sized tensors; IREE lowers it itself), splits become slices (no tensor lists for
    pock-autodiff to follow), and embedding_bag and unfold take forms torch-mlir lowers."""
    table = dict(get_decomposition_table())
    del table[torch.ops.aten.detach.default]
    del table[torch.ops.aten._log_softmax.default]
    table[torch.ops.aten.split_with_sizes.default] = _split_into_slices
    table[torch.ops.aten.unfold.default] = _unfold_within_its_windows
    table[torch.ops.aten._embedding_bag.default] = _embedding_bag_as_matmuls
    table[torch.ops.aten._embedding_bag_forward_only.default] = _embedding_bag_as_matmuls
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):  # registered once transformers' MoE code is imported
        table[torch.ops.transformers.grouped_mm_fallback.default] = _grouped_mm_as_masked_bmm
    table[torch.ops.aten.histc.default] = _histc_as_comparisons
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    table[flash] = functools.partial(_attention_in_the_fused_layout, table[flash])
    return table


def _attention_in_the_fused_layout(maths, *args, **kwargs):
    """scaled_dot_product_attention's CPU kernel, decomposed into maths, with its output laid out as
    the fused kernel lays it out ([B, T, H, D] in memory, viewed as [B, H, T, D]): the export
    recorded views of it that rely on that layout (GPT-2's transpose and view of the heads failed
    with "Cannot view a tensor with shape [2, 16, 64] and strides (64, 128, 1)")."""
    output, *rest = maths(*args, **kwargs)
    return (output.transpose(1, 2).contiguous().transpose(1, 2), *rest)


def _export(module: torch.nn.Module, args: tuple, what: str, timings: dict[str, float]):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            program = torch.export.export(module, args, strict=False)
            timings[f"torch.export of the {what}"] = time.perf_counter() - start
            start = time.perf_counter()
            program = program.run_decompositions(decompositions())
            timings[f"decompositions of the {what}"] = time.perf_counter() - start
    except Exception as e:
        raise FrontendError(f"torch.export failed on the model's {what}: {type(e).__name__}: {e}") from e
    _reject_random_ops(program)
    return program


# Ops that pass every element of an integer tensor on unchanged (a cast, a view, a copy): ids that
# reach an embedding through them are all the input's ids. A slice or arithmetic breaks the chain.
_IDS_KEPT = frozenset(
    {
        "convert_element_type",
        "_to_copy",
        "to",
        "view",
        "reshape",
        "_unsafe_view",
        "clone",
        "alias",
        "expand",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "t",
        "contiguous",
        "flatten",
        "detach",
        "lift_fresh_copy",
    }
)


def embedding_vocabularies(program, state_count: int, input_names: list[str]) -> dict[str, int]:
    """For each model input whose every id indexes an embedding (aten.embedding, through casts and
    views only), the fewest rows of the embeddings it indexes: the ids eager PyTorch accepts,
    [0, rows), which the runtime checks on the host (the device would read out of bounds).
    program: forward_loss's, whose arguments are the state, the inputs, the target."""
    arguments = program.graph_signature.user_inputs
    placeholders = dict(zip(arguments[state_count : state_count + len(input_names)], input_names))
    vocabularies: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.embedding.default:
            continue
        ids = node.args[1]
        while ids.op == "call_function" and getattr(ids.target, "_opname", None) in _IDS_KEPT:
            ids = ids.args[0]
        if ids.op == "placeholder" and ids.name in placeholders:
            name, rows = placeholders[ids.name], node.args[0].meta["val"].shape[0]
            vocabularies[name] = min(rows, vocabularies.get(name, rows))
    return vocabularies


def _model_frame(stack_trace: str | None) -> str:
    """The innermost `file:line` of a traced op's stack outside torch and pock_mlir."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace or "")
    user = [f"{path}:{line}" for path, line in frames if not re.search(r"[/\\](torch|pock_mlir)[/\\]", path)]
    return user[-1] if user else "an unknown line"


def _reject_random_ops(program) -> None:
    for node in program.graph.nodes:
        if node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            raise FrontendError(
                f"{node.target} (at {_model_frame(node.meta.get('stack_trace'))}) draws random numbers, which a "
                f"compiled step cannot reproduce. Dropout (nn.Dropout, F.dropout, F.dropout1d/2d/3d, "
                f"scaled_dot_product_attention's dropout_p, nn.MultiheadAttention) and stochastic depth "
                f"(Tensor.bernoulli_(p) with a float p) are supported through a seeded hash if called through "
                f"torch.nn.functional (not bound by `from ... import`); draw other random "
                f"tensors outside the model and pass them as inputs, or put the model in eval mode."
            )


def _check_dtypes_and_sizes(params, buffers, inputs: dict[str, torch.Tensor], target) -> None:
    """pock-mlir trains float32 models on non-empty batches: say so before tracing."""
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        held = [n for n, t in {**params, **buffers}.items() if t.dtype == dtype]
        if held:
            raise FrontendError(
                f"the model holds {str(dtype).removeprefix('torch.')} tensors ({', '.join(held[:3])}"
                f"{', ...' if len(held) > 3 else ''}); pock-mlir trains float32 models: call "
                f"model.float() before compiling"
            )
    for what, t in [*inputs.items(), ("the target", target)]:
        if t.dtype == torch.float64:
            raise FrontendError(
                f"{what} is float64; pock-mlir trains in float32: pass it as .float() "
                f"(the Trainer casts float64 batches to float32 itself)"
            )
        if t.dtype in (torch.float16, torch.bfloat16):
            raise FrontendError(
                f"{what} is {str(t.dtype).removeprefix('torch.')}; pock-mlir trains in float32: pass it as .float()"
            )
        if t.numel() == 0:
            raise FrontendError(
                f"{what} has shape {tuple(t.shape)}, with no elements: give an example batch of the size to train on"
            )


@contextlib.contextmanager
def _tensor_attributes_kept(model: torch.nn.Module):
    """Put back the plain tensor attributes of the model's modules after tracing: a forward hook
    that sets one (torch.nn.utils.weight_norm recomputes `weight` before each call) left the
    trace's fake tensor in the user's model."""
    kept = [
        (module, name, value)
        for module in model.modules()
        for name, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    ]
    try:
        yield
    finally:
        for module, name, value in kept:
            setattr(module, name, value)


def _check_modules(model: torch.nn.Module) -> None:
    """Layers torch.export cannot trace in the mode they are in: say which and what to change."""
    for name, module in model.named_modules():
        if (
            isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
            and module.training
            and module.track_running_stats
            and module.momentum is None
        ):
            raise FrontendError(
                f"{type(module).__name__} '{name}' has momentum=None (a cumulative average over the "
                f"steps, whose factor 1 / num_batches_tracked torch.export cannot trace); give it a "
                f"momentum (torch's default is 0.1) or put it in eval mode"
            )


def _eval_output_equals(
    model,
    params: dict,
    buffers: dict,
    inputs: tuple,
    by_keyword: tuple[str, ...],
    rewrites: Rewrites,
    selector,
    output: torch.Tensor,
) -> bool:
    """Whether the model in eval mode gives `output` (its train-mode output) on `inputs`, run on
    copies of its buffers: a layer that computes otherwise in eval mode shows here."""
    with torch.no_grad(), _in_eval_mode(model):
        copies = {n: b.clone() for n, b in buffers.items()}
        evaluated = select_output(
            _call_model(model, {**params, **copies}, inputs, by_keyword, False, rewrites), selector
        )
    return evaluated.shape == output.shape and bool(torch.equal(evaluated, output))


def _faked(mode: FakeTensorMode, tensors: dict) -> dict:
    """Each tensor as a fake CPU tensor of `mode`, of its shape and dtype."""
    with mode:
        return {k: torch.empty(t.shape, dtype=t.dtype, device="cpu") for k, t in tensors.items()}


def _updated_on_fake(model: torch.nn.Module, copies: dict[str, torch.Tensor]) -> list[str]:
    """The buffers a probe of the model on fake tensors updated: those an in-place op wrote (their
    version counters moved), and train-mode BatchNorm's running statistics, which native_batch_norm
    writes without moving them (the eager probe compares values instead, which fakes have none of)."""
    written = {n for n, copy in copies.items() if copy._version > 0}
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training and module.track_running_stats:
            written |= {f"{prefix}.{n}" if prefix else n for n in ("running_mean", "running_var")}
    return [n for n in copies if n in written]


def import_model(
    model: torch.nn.Module,
    example_inputs,
    example_target,
    loss,
    context: ir.Context,
    output_selector=None,
    adapters: list[lora.Adapter] = (),
    quantized: list[quantize.QuantizedWeight] = (),
    weights=None,
) -> ImportedModel:
    """output_selector: which entry of a structured model output `evaluate` returns (see
    select_output); the loss always receives the model's output as it is. adapters: LoRA
    adapters traced into the forward pass, as parameters after the model's own; quantized: the
    layers whose weights are int8 parameters instead (see Rewrites). weights: a
    pock_mlir.weights.Weights, the checkpoint the parameters start from instead of the model's
    own values: the model is traced on fake tensors (no memory, no values) and the initial
    parameters are read from the files one at a time when the Trainer or a bundle takes them."""
    if not isinstance(model, torch.nn.Module):
        raise FrontendError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rewrites = Rewrites(tuple(adapters), tuple(quantized))
    user_args, user_kwargs = call_tensors(example_inputs)
    user_inputs, user_target = (*user_args, *user_kwargs.values()), as_tensor(example_target)
    by_keyword = tuple(user_kwargs)
    input_names = [positional_input_name(i) for i in range(len(user_args))] + list(user_kwargs)
    inputs, target = tuple(device_dtype(t) for t in user_inputs), device_dtype(user_target)
    loss_fn = resolve_loss(loss)

    from_files = weights is not None
    own = {n: p.detach().to("meta") if from_files else p.detach() for n, p in model.named_parameters()}
    params = rewrites.initial_values(own)
    buffers = dict(weights.buffers) if from_files else {n: b.detach() for n, b in model.named_buffers()}
    if not params:
        raise FrontendError("the model has no parameters to train")
    described = [f"input {i}" for i in range(len(user_args))] + [f"keyword input {k!r}" for k in user_kwargs]
    _check_dtypes_and_sizes(params, buffers, dict(zip(described, inputs)), target)
    _check_modules(model)
    names = list(params) + list(buffers)
    real_buffers, probing = buffers, contextlib.nullcontext()
    if from_files:
        # Fake CPU tensors (shapes and dtypes, no memory): the model traces as on the CPU, and
        # Hugging Face skips its data-dependent checks, as it does under torch.export.
        probing = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        params, buffers = _faked(probing, params), _faked(probing, buffers)
        inputs, user_inputs = (
            tuple(_faked(probing, dict(enumerate(inputs))).values()),
            tuple(_faked(probing, dict(enumerate(user_inputs))).values()),
        )
        target, user_target = _faked(probing, {0: target})[0], _faked(probing, {0: user_target})[0]
    state = tuple(params.values()) + tuple(buffers.values())

    # The check runs on copies of the buffers so that it leaves the user's model as it was; the
    # copies whose values changed are the buffers the step updates (by value, because
    # native_batch_norm writes running statistics without bumping their version counters).
    with _tensor_attributes_kept(model), probing:
        copies = {n: b.clone() for n, b in buffers.items()}
        dropout_probe = SeededDropout(torch.zeros((), dtype=torch.int32))
        with torch.no_grad():
            with dropout_probe:
                output = _call_model(model, {**params, **copies}, user_inputs, by_keyword, False, rewrites)
            try:
                loss_value = loss_fn(output, user_target)
            except Exception as e:
                raise FrontendError(
                    f"the loss failed on the model's output {_describe(output)} and the target "
                    f"{tuple(target.shape)}: {e}"
                ) from e
        output_path, evaluated = _selected(output, selector=output_selector)
        if not isinstance(loss_value, torch.Tensor) or loss_value.dim() != 0:
            raise FrontendError("the loss must return a scalar tensor (use a mean or sum reduction)")
        seeded = dropout_probe.calls > 0
        if from_files:
            updated = _updated_on_fake(model, copies)
            modes_differ = True  # no values to compare the modes' outputs by: export both
        else:
            updated = [n for n, copy in copies.items() if not torch.equal(copy, buffers[n])]
            modes_differ = (
                seeded
                or bool(updated)
                or not _eval_output_equals(
                    model, params, buffers, user_inputs, by_keyword, rewrites, output_selector, evaluated
                )
            )
        if seeded:
            inputs += (torch.zeros((), dtype=torch.int32),)  # a fake one while probing fakes
            input_names.append(SEED_INPUT)

        dtypes = [t.dtype for t in user_inputs] + ([torch.int32] if seeded else [])
        timings: dict[str, float] = {}
        traced = _ForwardLoss(
            model, names, updated, dtypes + [user_target.dtype], by_keyword, seeded, rewrites, loss_fn, output_selector
        )
        forward_loss = _export(traced, state + inputs + (target,), "forward and loss", timings)
        if modes_differ:
            with _in_eval_mode(model):
                eval_forward_loss = _export(traced, state + inputs + (target,), "eval-mode forward and loss", timings)
    start = time.perf_counter()
    importer = FxImporter(context=context)
    importer.import_frozen_program(forward_loss, func_name=FORWARD_LOSS)
    if modes_differ:
        importer.import_frozen_program(eval_forward_loss, func_name=EVAL_FORWARD_LOSS)
    eval_function = EVAL_FORWARD_LOSS if modes_differ else FORWARD_LOSS
    _add_evaluate(importer.module, EVALUATE, eval_function)
    _add_evaluate(importer.module, EVALUATE_TRAIN, FORWARD_LOSS)
    timings["FX import into MLIR"] = time.perf_counter() - start
    return ImportedModel(
        module=importer.module,
        params=[spec_of(n, t) for n, t in params.items()],
        buffers=[spec_of(n, t) for n, t in buffers.items()],
        updated_buffers=updated,
        inputs=[spec_of(name, t) for name, t in zip(input_names, inputs)],
        target=spec_of("target", target),
        output=spec_of(output_path, evaluated),
        initial_params=(
            weights.initial_params(rewrites) if from_files else {n: t.numpy().copy() for n, t in params.items()}
        ),
        initial_buffers={n: t.numpy().copy() for n, t in real_buffers.items()},
        vocabularies=embedding_vocabularies(forward_loss, len(state), input_names),
        state_dict=state_dict_sources(model),
        eval_function=eval_function,
        timings=timings,
        by_keyword=len(by_keyword),
    )
