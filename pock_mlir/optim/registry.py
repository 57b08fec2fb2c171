"""What the compiler knows of each optimizer, filled by the optimizer's own file.

An optimizer (sgd.py, adamw.py) is a frozen dataclass of its hyperparameters that emits a pock
update op per parameter; each update op it emits is registered here with its number of state
slots and its lowering to torch-dialect arithmetic. The passes ask this registry: pock-sparse-bp
narrows an update's state with the parameter, pock-reorder-updates moves updates, and
pock-lower-optimizers and pock-strip-params lower them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.dialects.pock import HYPERPARAMETER_CHECKS

# An update op takes (param, grad, state..., [step]) and returns (new_param, new_state...).
Lowering = Callable[..., list]  # (TorchBuilder, the op) -> its results' replacements


@dataclass(frozen=True)
class UpdateOp:
    name: str  # "pock.sgd_momentum"
    state_slots: int
    lower: Lowering


UPDATE_OPS: dict[str, UpdateOp] = {}
OPTIMIZERS: dict[str, type] = {}  # "sgd" -> SGD: the names pock-compile --optimizer and manifests use


def update_op(op_class, state_slots: int, hyperparameters: Callable[[dict], object]):
    """Register the decorated lowering for `op_class` (a pock dialect op) with its state slots, and
    `hyperparameters(attributes)`, the optimizer made of the op's attributes, whose constructor's
    ValueError the op's verifier reports: IR and the Python API are refused alike."""

    def register(lower: Lowering) -> Lowering:
        name = op_class.OPERATION_NAME
        UPDATE_OPS[name] = UpdateOp(name, state_slots, lower)
        HYPERPARAMETER_CHECKS[name] = hyperparameters
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


PAIR = "tuple[float, float]"  # the annotation of a two-number hyperparameter (AdamW's betas)


def check_fields(optimizer) -> None:
    """Refuse hyperparameters of the wrong kind before the optimizer's own range checks: a float
    field takes a finite real number, a bool field a bool, a pair field (AdamW's betas) two."""
    name = type(optimizer).__name__
    for f in dataclasses.fields(optimizer):
        value = getattr(optimizer, f.name)
        if f.type in ("float", float):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} {f.name} must be a finite number, got {value!r}")
        elif f.type in ("bool", bool):
            if not isinstance(value, bool):
                raise ValueError(f"{name} {f.name} must be True or False, got {value!r}")
        elif f.type == PAIR:
            if (
                not isinstance(value, (tuple, list))
                or len(value) != 2
                or any(isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b) for b in value)
            ):
                raise ValueError(f"{name} {f.name} must be two finite numbers, got {value!r}")
            object.__setattr__(optimizer, f.name, tuple(value))  # torch.optim users pass a list


def _parse_value(optimizer: str, key: str, raw: str, field_type):
    if field_type in ("bool", bool):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{optimizer} {key} must be true or false, got '{raw}'")
        return raw.lower() in ("true", "1")
    parts = raw.split("/") if field_type == PAIR else [raw]
    if len(parts) != (2 if field_type == PAIR else 1):
        raise ValueError(f"{optimizer} {key} takes two numbers as a/b (e.g. betas=0.9/0.999), got '{raw}'")
    try:
        values = tuple(float(x) for x in parts)
    except ValueError:
        raise ValueError(f"{optimizer} {key} must be a number, got '{raw}'") from None
    return values if field_type == PAIR else values[0]


def parse_optimizer(text: str):
    """'sgd:lr=0.01,momentum=0.9' or 'adamw:lr=1e-3,weight_decay=0,betas=0.9/0.999' -> an optimizer."""
    kind, _, options = text.partition(":")
    if kind.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer '{kind}'; use " + " or ".join(f"{n}:lr=..." for n in OPTIMIZERS))
    cls = OPTIMIZERS[kind.lower()]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {}
    for item in filter(None, options.split(",")):
        key, equals, raw = item.partition("=")
        if key not in fields:
            raise ValueError(f"{kind} has no option '{key}'; its options are {', '.join(fields)}")
        if not equals or not raw:
            raise ValueError(f"{kind} {key} needs a value ({key}=...)")
        if key in values:
            raise ValueError(f"{kind} {key} is given twice")
        values[key] = _parse_value(kind, key, raw, fields[key])
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"{kind} needs {', '.join(missing)} ({kind}:{missing[0]}=...)")
    return cls(**values)
