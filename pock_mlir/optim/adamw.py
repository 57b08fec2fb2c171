"""AdamW, as torch.optim.AdamW (decoupled weight decay, bias-corrected moments)."""

from __future__ import annotations

from dataclasses import dataclass

from pock_mlir.dialects.pock import AdamWOp

from .registry import attribute, check_fields, f64, optimizer, update_op


def check_adam(adam) -> None:
    """The checks of an Adam adam's lr, betas, eps and weight_decay (AdamW's, OrtAdamW's)."""
    check_fields(adam)
    kind = type(adam).__name__
    for name in ("lr", "eps"):  # torch.optim.AdamW takes 0 too: a step that changes nothing, or divides by 0
        if getattr(adam, name) <= 0:
            raise ValueError(f"{kind} {name} must be > 0, got {getattr(adam, name)}")
    if not all(0 <= b < 1 for b in adam.betas):
        raise ValueError(f"{kind} betas must be in [0, 1), got {adam.betas}")
    if adam.weight_decay < 0:
        raise ValueError(f"{kind} weight_decay must be >= 0, got {adam.weight_decay}")


def emit_adam_update(op_class, adam, ip, loc, param, grad, state, step):
    """Create `op_class` (AdamWOp, OrtAdamWOp: the same operands and attributes) with Adam adam's
    hyperparameters; returns (new_param, [new_exp_avg, new_exp_avg_sq])."""
    op = op_class(
        param,
        grad,
        state[0],
        state[1],
        step,
        f64(adam.lr),
        f64(adam.betas[0]),
        f64(adam.betas[1]),
        f64(adam.eps),
        f64(adam.weight_decay),
        param.type,
        param.type,
        param.type,
        loc=loc,
        ip=ip,
    )
    return op.new_param, [op.new_exp_avg, op.new_exp_avg_sq]


def adam_from_attributes(adam_class, attributes: dict):
    """The Adam `adam_class` (AdamW, OrtAdamW) made of its update op's attributes."""
    return adam_class(
        attributes["lr"], (attributes["beta1"], attributes["beta2"]), attributes["eps"], attributes["weight_decay"]
    )


@optimizer("adamw")
@dataclass(frozen=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __post_init__(self):
        check_adam(self)

    state_slots = ("exp_avg", "exp_avg_sq")

    def emit(self, ip, loc, param, grad, state, step):
        """Create the update op; returns (new_param, [new_state...])."""
        return emit_adam_update(AdamWOp, self, ip, loc, param, grad, state, step)

    def torch_optimizer(self, params):
        """The torch.optim equivalent, for checking and benchmarking against PyTorch."""
        import torch

        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)


@update_op(AdamWOp, state_slots=2, hyperparameters=lambda attributes: adam_from_attributes(AdamW, attributes))
def lower_adamw(b, op):
    param, grad, m, v, step = op.operands
    lr, beta1, beta2 = attribute(op, "lr"), attribute(op, "beta1"), attribute(op, "beta2")
    eps, wd = attribute(op, "eps"), attribute(op, "weight_decay")
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
