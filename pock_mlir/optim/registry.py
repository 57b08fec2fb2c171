"""What the compiler knows of each optimizer, filled by the optimizer's own file.

An optimizer (sgd.py, adamw.py) is a frozen dataclass of its hyperparameters that emits a pock
update op per parameter; each update op it emits is registered here with its number of state
slots and its lowering to torch-dialect arithmetic. The passes ask this registry: pock-sparse-bp
narrows an update's state with the parameter, pock-reorder-updates moves updates, and
pock-lower-optimizers and pock-strip-params lower them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch_mlir import ir

# An update op takes (param, grad, state..., [step]) and returns (new_param, new_state...).
Lowering = Callable[..., list]  # (TorchBuilder, the op) -> its results' replacements


@dataclass(frozen=True)
class UpdateOp:
    name: str  # "pock.sgd_momentum"
    state_slots: int
    lower: Lowering


UPDATE_OPS: dict[str, UpdateOp] = {}
OPTIMIZERS: dict[str, type] = {}  # "sgd" -> SGD: the names pock-compile --optimizer and manifests use


def update_op(op_class, state_slots: int):
    """Register the decorated lowering for `op_class` (a pock dialect op) with its state slots."""
    def register(lower: Lowering) -> Lowering:
        name = op_class.OPERATION_NAME
        UPDATE_OPS[name] = UpdateOp(name, state_slots, lower)
        return lower
    return register


def optimizer(name: str):
    """Register the decorated optimizer class under `name`."""
    def register(cls):
        OPTIMIZERS[name] = cls
        return cls
    return register


def f64(x: float) -> ir.FloatAttr:
    return ir.FloatAttr.get(ir.F64Type.get(), float(x))


def attribute(op, name):
    return op.attributes[name].value  # attributes come back downcast (FloatAttr, BoolAttr, IntegerAttr)


def parse_optimizer(text: str):
    """'sgd:lr=0.01,momentum=0.9' or 'adamw:lr=1e-3,weight_decay=0' -> an optimizer."""
    kind, _, options = text.partition(":")
    if kind.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{kind}'; use " + " or ".join(f"{n}:lr=..." for n in OPTIMIZERS))
    values = {}
    for item in filter(None, options.split(",")):
        key, _, raw = item.partition("=")
        if key == "nesterov":
            values[key] = raw.lower() in ("1", "true")
        elif key == "betas":
            values[key] = tuple(float(x) for x in raw.split("/"))
        else:
            values[key] = float(raw)
    return OPTIMIZERS[kind.lower()](**values)
