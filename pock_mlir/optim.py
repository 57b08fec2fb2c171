"""Optimizers as compile-time descriptions: each emits its pock update op for one parameter.

Their state (momentum buffers, Adam moments) lives next to the parameters in the runtime and
is threaded through the train step; `step` counts the steps taken so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir


def _f64(x: float) -> ir.FloatAttr:
    return ir.FloatAttr.get(ir.F64Type.get(), float(x))


@dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"SGD lr must be > 0, got {self.lr}")
        if self.momentum < 0 or self.weight_decay < 0:
            raise ValueError("SGD momentum and weight_decay must be >= 0")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening = 0")

    @property
    def state_slots(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def emit(self, ip, loc, param, grad, state, step):
        """Create the update op; returns (new_param, [new_state...])."""
        if not self.momentum:
            op = ir.Operation.create("pock.sgd", results=[param.type], operands=[param, grad], attributes={
                "lr": _f64(self.lr), "weight_decay": _f64(self.weight_decay)}, loc=loc, ip=ip)
            return op.results[0], []
        op = ir.Operation.create("pock.sgd_momentum", results=[param.type, param.type],
                                 operands=[param, grad, state[0], step], attributes={
                                     "lr": _f64(self.lr), "momentum": _f64(self.momentum),
                                     "dampening": _f64(self.dampening), "weight_decay": _f64(self.weight_decay),
                                     "nesterov": ir.BoolAttr.get(self.nesterov)}, loc=loc, ip=ip)
        return op.results[0], [op.results[1]]

    def torch_optimizer(self, params):
        """The torch.optim equivalent, for checking and benchmarking against PyTorch."""
        import torch
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, dampening=self.dampening,
                               weight_decay=self.weight_decay, nesterov=self.nesterov)


@dataclass(frozen=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __post_init__(self):
        if self.lr <= 0 or self.eps <= 0:
            raise ValueError("AdamW lr and eps must be > 0")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"AdamW betas must be in [0, 1), got {self.betas}")

    state_slots = ("exp_avg", "exp_avg_sq")

    def emit(self, ip, loc, param, grad, state, step):
        op = ir.Operation.create("pock.adamw", results=[param.type] * 3,
                                 operands=[param, grad, state[0], state[1], step], attributes={
                                     "lr": _f64(self.lr), "beta1": _f64(self.betas[0]), "beta2": _f64(self.betas[1]),
                                     "eps": _f64(self.eps), "weight_decay": _f64(self.weight_decay)}, loc=loc, ip=ip)
        return op.results[0], [op.results[1], op.results[2]]

    def torch_optimizer(self, params):
        import torch
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)


def parse_optimizer(text: str):
    """'sgd:lr=0.01,momentum=0.9' or 'adamw:lr=1e-3,weight_decay=0' -> an optimizer."""
    kind, _, options = text.partition(":")
    values = {}
    for item in filter(None, options.split(",")):
        key, _, raw = item.partition("=")
        if key == "nesterov":
            values[key] = raw.lower() in ("1", "true")
        elif key == "betas":
            values[key] = tuple(float(x) for x in raw.split("/"))
        else:
            values[key] = float(raw)
    classes = {"sgd": SGD, "adamw": AdamW}
    if kind.lower() not in classes:
        raise ValueError(f"unknown optimizer '{kind}'; use sgd:lr=...,momentum=... or adamw:lr=...")
    return classes[kind.lower()](**values)
