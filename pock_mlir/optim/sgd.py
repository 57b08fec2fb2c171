"""SGD, as torch.optim.SGD: plain, or with momentum (dampening, weight decay, Nesterov).

Its hyperparameters are checked as torch.optim.SGD checks them (momentum and weight decay >= 0,
any dampening, Nesterov only with momentum and no dampening; the lowering computes torch's update
for each), but for a learning rate of 0, which trains nothing and is refused."""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.dialects.pock import SGDMomentumOp, SGDOp

from .registry import attribute, check_fields, f64, optimizer, update_op


@optimizer("sgd")
@dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self):
        check_fields(self)
        if self.lr <= 0:
            raise ValueError(f"SGD lr must be > 0, got {self.lr}")
        for name in ("momentum", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"SGD {name} must be >= 0, got {getattr(self, name)}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(
                f"SGD nesterov momentum requires momentum > 0 and dampening 0, got momentum "
                f"{self.momentum} and dampening {self.dampening}"
            )

    @property
    def state_slots(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def emit(self, ip, loc, param, grad, state, step):
        """Create the update op; returns (new_param, [new_state...])."""
        if not self.momentum:
            op = SGDOp(param, grad, f64(self.lr), f64(self.weight_decay), param.type, loc=loc, ip=ip)
            return op.new_param, []
        op = SGDMomentumOp(
            param,
            grad,
            state[0],
            step,
            f64(self.lr),
            f64(self.momentum),
            f64(self.dampening),
            f64(self.weight_decay),
            ir.IntegerAttr.get(ir.IntegerType.get_signless(1), int(self.nesterov)),
            param.type,
            param.type,
            loc=loc,
            ip=ip,
        )
        return op.new_param, [op.new_momentum_buffer]

    def torch_optimizer(self, params):
        """The torch.optim equivalent, for checking and benchmarking against PyTorch."""
        import torch

        return torch.optim.SGD(
            params,
            lr=self.lr,
            momentum=self.momentum,
            dampening=self.dampening,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
        )


@update_op(SGDOp, state_slots=0, hyperparameters=lambda attributes: SGD(**attributes))
def lower_sgd(b, op):
    param, grad = op.operands
    lr, wd = attribute(op, "lr"), attribute(op, "weight_decay")
    direction = b.add(grad, b.mul(param, wd)) if wd else grad
    return [b.sub(param, b.mul(direction, lr))]


@update_op(SGDMomentumOp, state_slots=1, hyperparameters=lambda attributes: SGD(**attributes))
def lower_sgd_momentum(b, op):
    param, grad, buf, step = op.operands
    lr, momentum = attribute(op, "lr"), attribute(op, "momentum")
    dampening, wd, nesterov = attribute(op, "dampening"), attribute(op, "weight_decay"), attribute(op, "nesterov")
    direction = b.add(grad, b.mul(param, wd)) if wd else grad
    new_buf = b.add(b.mul(buf, momentum), b.mul(direction, 1.0 - dampening) if dampening else direction)
    if dampening:
        # torch starts the buffer at the undamped gradient; with dampening 0 the zero-initialised
        # buffer already gives the same first step.
        new_buf = b.aten.where.self(b.aten.eq.Scalar(step, 0), direction, new_buf)
    direction = b.add(direction, b.mul(new_buf, momentum)) if nesterov else new_buf
    return [b.sub(param, b.mul(direction, lr)), new_buf]
