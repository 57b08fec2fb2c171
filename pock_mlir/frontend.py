"""From an nn.Module and a loss to torch-dialect IR with parameters as function arguments.

torch.export cannot trace torch.func.grad, so only the forward pass and the loss are
exported, as functions of (parameters, buffers, inputs, target) through functional_call;
pock-autodiff derives the backward pass. Core ATen decompositions are applied before import
(IREE cannot compile some undecomposed ops). Integer targets travel as int32 and are widened
inside the exported function, because IREE misreads i64 input buffers on demotion.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch_mlir import ir
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter

LOSSES: dict[str, Callable] = {
    "cross_entropy": lambda output, target: F.cross_entropy(output, target.long()),
    "mse": F.mse_loss,
}


class FrontendError(ValueError):
    """The model, its example inputs or its loss cannot be exported."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    @staticmethod
    def of(name: str, t: torch.Tensor) -> TensorSpec:
        return TensorSpec(name, tuple(t.shape), str(torch.empty((), dtype=t.dtype).numpy().dtype))


@dataclass
class ImportedModel:
    """The imported module (functions `forward_loss` and `evaluate`) and what its arguments are."""

    module: ir.Module
    params: list[TensorSpec]
    buffers: list[TensorSpec]
    inputs: list[TensorSpec]
    target: TensorSpec
    output: TensorSpec
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]


def as_tensor_tuple(inputs) -> tuple[torch.Tensor, ...]:
    if isinstance(inputs, (tuple, list)):
        return tuple(as_tensor(x) for x in inputs)
    return (as_tensor(inputs),)


def as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    raise FrontendError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


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


class _ForwardLoss(torch.nn.Module):
    def __init__(self, model, names, n_inputs, loss_fn):
        super().__init__()
        self.model, self.names, self.n_inputs, self.loss_fn = model, names, n_inputs, loss_fn

    def forward(self, *args):
        n = len(self.names)
        state = dict(zip(self.names, args[:n]))
        inputs, target = args[n : n + self.n_inputs], args[n + self.n_inputs]
        output = functional_call(self.model, state, inputs)
        return self.loss_fn(output, target)


class _Forward(torch.nn.Module):
    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        n = len(self.names)
        return functional_call(self.model, dict(zip(self.names, args[:n])), args[n:])


def _export(module: torch.nn.Module, args: tuple, what: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(module, args, strict=False)
            return program.run_decompositions(get_decomposition_table())
    except Exception as e:
        raise FrontendError(f"torch.export failed on the model's {what}: {type(e).__name__}: {e}") from e


def import_model(model: torch.nn.Module, example_inputs, example_target, loss, context: ir.Context) -> ImportedModel:
    if not isinstance(model, torch.nn.Module):
        raise FrontendError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = tuple(device_dtype(t) for t in as_tensor_tuple(example_inputs))
    target = device_dtype(as_tensor(example_target))
    loss_fn = resolve_loss(loss)

    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    if not params:
        raise FrontendError("the model has no parameters to train")
    names = list(params) + list(buffers)
    state = tuple(params.values()) + tuple(buffers.values())

    with torch.no_grad():
        output = functional_call(model, dict(zip(names, state)), inputs)
        try:
            loss_value = loss_fn(output, target)
        except Exception as e:
            raise FrontendError(f"the loss failed on the model's output {tuple(output.shape)} and the target "
                                f"{tuple(target.shape)}: {e}") from e
    if not isinstance(loss_value, torch.Tensor) or loss_value.dim() != 0:
        raise FrontendError("the loss must return a scalar tensor (use a mean or sum reduction)")

    forward_loss = _export(_ForwardLoss(model, names, len(inputs), loss_fn), state + inputs + (target,), "forward and loss")
    forward = _export(_Forward(model, names), state + inputs, "forward pass")
    importer = FxImporter(context=context)
    importer.import_frozen_program(forward_loss, func_name="forward_loss")
    importer.import_frozen_program(forward, func_name="evaluate")
    return ImportedModel(
        module=importer.module,
        params=[TensorSpec.of(n, t) for n, t in params.items()],
        buffers=[TensorSpec.of(n, t) for n, t in buffers.items()],
        inputs=[TensorSpec.of(f"input{i}", t) for i, t in enumerate(inputs)],
        target=TensorSpec.of("target", target),
        output=TensorSpec.of("output", output),
        initial_params={n: t.numpy().copy() for n, t in params.items()},
        initial_buffers={n: t.numpy().copy() for n, t in buffers.items()},
    )
