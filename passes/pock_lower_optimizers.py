"""pock-lower-optimizers: optimizer updates and channel slices as torch-dialect arithmetic.

The formulas follow torch.optim.SGD and torch.optim.AdamW exactly (decoupled weight decay
for AdamW, the momentum buffer initialised to the first gradient for SGD), so a compiled
step reproduces PyTorch's parameter trajectory.
"""

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.torch_builder import TorchBuilder

from .base import ModulePass, functions


def _attr(op, name):
    return op.attributes[name].value  # attributes come back downcast (FloatAttr, BoolAttr, IntegerAttr)


def lower_sgd(b: TorchBuilder, op):
    param, grad = op.operands
    lr, wd = _attr(op, "lr"), _attr(op, "weight_decay")
    direction = b.add(grad, b.mul(param, wd)) if wd else grad
    return [b.sub(param, b.mul(direction, lr))]


def lower_sgd_momentum(b: TorchBuilder, op):
    param, grad, buf, step = op.operands
    lr, momentum = _attr(op, "lr"), _attr(op, "momentum")
    dampening, wd, nesterov = _attr(op, "dampening"), _attr(op, "weight_decay"), _attr(op, "nesterov")
    direction = b.add(grad, b.mul(param, wd)) if wd else grad
    new_buf = b.add(b.mul(buf, momentum), b.mul(direction, 1.0 - dampening) if dampening else direction)
    if dampening:
        # torch starts the buffer at the undamped gradient; with dampening 0 the zero-initialised
        # buffer already gives the same first step.
        new_buf = b.aten.where.self(b.aten.eq.Scalar(step, 0), direction, new_buf)
    direction = b.add(direction, b.mul(new_buf, momentum)) if nesterov else new_buf
    return [b.sub(param, b.mul(direction, lr)), new_buf]


def lower_adamw(b: TorchBuilder, op):
    param, grad, m, v, step = op.operands
    lr, beta1, beta2 = _attr(op, "lr"), _attr(op, "beta1"), _attr(op, "beta2")
    eps, wd = _attr(op, "eps"), _attr(op, "weight_decay")
    t = b.add(step, 1.0)
    decayed = b.mul(param, 1.0 - lr * wd) if wd else param
    new_m = b.add(b.mul(m, beta1), b.mul(grad, 1.0 - beta1))
    new_v = b.add(b.mul(v, beta2), b.mul(b.mul(grad, grad), 1.0 - beta2))
    bias_correction1 = b.aten.rsub.Scalar(b.aten.pow.Scalar(beta1, t), 1.0, 1)
    bias_correction2 = b.aten.rsub.Scalar(b.aten.pow.Scalar(beta2, t), 1.0, 1)
    denom = b.add(b.div(b.aten.sqrt(new_v), b.aten.sqrt(bias_correction2)), eps)
    step_size = b.div(b.full((), lr), bias_correction1)
    new_param = b.sub(decayed, b.mul(step_size, b.div(new_m, denom)))
    return [new_param, new_m, new_v]


def lower_channel_slice(b: TorchBuilder, op):
    return [b.aten.slice.Tensor(op.operands[0], 0, 0, _attr(op, "channels"), 1)]


def lower_channel_update(b: TorchBuilder, op):
    param, update = op.operands
    k = b.shape(update)[0]
    return [b.aten.slice_scatter(param, update, 0, 0, k, 1)]


LOWERINGS = {
    "pock.sgd": lower_sgd,
    "pock.sgd_momentum": lower_sgd_momentum,
    "pock.adamw": lower_adamw,
    "pock.channel_slice": lower_channel_slice,
    "pock.channel_update": lower_channel_update,
}


@dataclass(frozen=True)
class LowerOptimizersPass(ModulePass):
    name = "pock-lower-optimizers"
    description = "Lower pock optimizer updates (sgd, sgd_momentum, adamw) and channel slices to torch-dialect arithmetic"

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for op in list(func.regions[0].blocks[0].operations):
                lower = LOWERINGS.get(op.operation.name)
                if lower is None:
                    continue
                b = TorchBuilder(ir.InsertionPoint(op), op.location)
                for old, new in zip(op.results, lower(b, op)):
                    old.replace_all_uses_with(new)
                op.operation.erase()
