"""The pock dialect, defined in Python on torch-mlir's IRDL-backed `dialects.ext`.

A training step in pock IR marks its trainable parameters (`pock.param`), asks for the
gradient of a scalar loss (`pock.grad`, expanded by `pock-autodiff`) and applies optimizer
updates (`pock.sgd`, `pock.sgd_momentum`, `pock.adamw`, `pock.ort_adamw`, lowered by
`pock-lower-optimizers`).
Channel-sparse updates read and write a leading slice of output channels
(`pock.channel_slice`, `pock.channel_update`).

Operands are torch-dialect tensors, which IRDL cannot name, so they are constrained as Any
here and checked by each op's Python verifier, whose errors name the op and the rule broken.
"""

from collections.abc import Callable
from typing import Any

from torch_mlir import ir
from torch_mlir._mlir_libs import _mlir
from torch_mlir.dialects import ext

from pock_mlir.torch_types import parse_tensor_type


class Pock(ext.Dialect, name="pock"):
    pass


# The bindings import a dialect's Python module, <search prefix>.<namespace>, for each op of it
# they wrap, and try again on the next op while none is found: a failed import search per pock op
# (tens of thousands in a MobileNetV2's compilation). This module is the pock dialect's.
if __package__ not in _mlir.globals.dialect_search_modules:
    _mlir.globals.append_dialect_search_prefix(__package__)

POLICIES = ("full", "frozen", "bias", "channels")

# An update op's hyperparameter check, by op name: the optimizer's own (pock_mlir/optim), which
# registers it with the op's lowering, so that pock-opt refuses on IR what the Python API refuses.
# It takes the op's attributes (floats, and bools for i1 flags) and raises ValueError.
HYPERPARAMETER_CHECKS: dict[str, Callable[[dict], None]] = {}


class _Verified(Pock.Operation):
    """Helpers that make a verifier read as a list of rules (each op's `verify_rules`)."""

    def verify_invariants(self) -> bool:
        # This verifier runs before IRDL's, so an op missing an operand or attribute must pass
        # here to let IRDL name what is missing instead of the rules failing on an absent field.
        if not self.has_declared_fields():
            return True
        try:
            return self.verify_rules()
        except ValueError as e:  # parse_tensor_type rejects dynamic shapes
            return self.fail(str(e))

    def has_declared_fields(self) -> bool:
        """Every declared operand and result is there, and every attribute with its declared kind."""
        fields = self._fields
        if len(self.operands) != sum(isinstance(f, ext.OperandDef) for f in fields):
            return False
        if len(self.results) != sum(isinstance(f, ext.ResultDef) for f in fields):
            return False
        for f in fields:
            if isinstance(f, ext.AttributeDef):
                if f.name not in self.attributes:
                    return False
                try:
                    f.constraint(self.attributes[f.name])  # casts to the declared kind or raises
                except ValueError:
                    return False
        return True

    def fail(self, message: str) -> bool:
        self.location.emit_error(f"'{self.OPERATION_NAME}' op {message}")
        return False

    def float_attr(self, name: str) -> float:
        return ir.FloatAttr(self.attributes[name]).value

    def int_attr(self, name: str) -> int:
        return ir.IntegerAttr(self.attributes[name]).value

    def str_attr(self, name: str) -> str:
        return ir.StringAttr(self.attributes[name]).value

    def check_same_types(self, names_and_values) -> bool:
        (first_name, first), *rest = names_and_values
        for name, value in rest:
            if str(value.type) != str(first.type):
                return self.fail(f"{name} type {value.type} must equal {first_name} type {first.type}")
        return True

    def check_float_tensor(self, name: str, value) -> bool:
        t = parse_tensor_type(value.type)
        if t is None or not t.is_float:
            return self.fail(f"{name} must be a floating-point !torch.vtensor, got {value.type}")
        return True

    def check_range(self, name: str, low: float, high: float, *, low_open=False, high_open=False) -> bool:
        v = self.float_attr(name)
        above = v > low if low_open else v >= low
        below = v < high if high_open else v <= high
        if not (above and below):
            if high == float("inf"):
                return self.fail(f"{name} must be {'>' if low_open else '>='} {low}, got {v}")
            lo = "(" if low_open else "["
            hi = ")" if high_open else "]"
            return self.fail(f"{name} must be in {lo}{low}, {high}{hi}, got {v}")
        return True

    def check_hyperparameters(self) -> bool:
        """The optimizer's checks of the op's attributes (HYPERPARAMETER_CHECKS)."""
        check = HYPERPARAMETER_CHECKS.get(self.OPERATION_NAME)
        if check is None:  # pock_mlir.context loads the optimizers with the dialect
            return self.fail("has no optimizer to check its hyperparameters (import pock_mlir.optim)")
        values = {}
        for f in self._fields:
            if isinstance(f, ext.AttributeDef):
                attribute = self.attributes[f.name]
                values[f.name] = bool(attribute.value) if str(attribute.type) == "i1" else attribute.value
        try:
            check(values)
        except ValueError as e:
            return self.fail(str(e))
        return True

    def check_step(self, value) -> bool:
        t = parse_tensor_type(value.type)
        if t is None or t.shape != () or not t.is_float:
            return self.fail(f"step must be a rank-0 float !torch.vtensor (steps taken so far), got {value.type}")
        return True


class ParamOp(_Verified, name="param"):
    """A trainable parameter: its state_dict name and its update policy.

    policy is one of full, frozen, bias (a weight whose module updates only its bias is
    frozen; the bias itself is full) or channels (the first ceil(ratio * C) output channels
    are updated). ratio is 1.0 for every policy but channels. A frozen value may be an integer
    tensor (an int8 weight, pock_mlir/quantize.py).
    """

    value: ext.Operand[Any]
    param_name: ir.StringAttr
    policy: ir.StringAttr
    ratio: ir.FloatAttr
    result: ext.Result[Any]

    def verify_rules(self) -> bool:
        policy = self.str_attr("policy")
        if policy not in POLICIES:
            return self.fail(f"policy must be one of {', '.join(POLICIES)}, got '{policy}'")
        value = parse_tensor_type(self.value.type)
        if value is None or not (value.is_float or policy == "frozen"):  # frozen: int8 weights too
            return self.fail(f"value must be a !torch.vtensor, floating-point unless frozen, got {self.value.type}")
        if not self.check_range("ratio", 0.0, 1.0, low_open=True):
            return False
        if policy != "channels" and self.float_attr("ratio") != 1.0:
            return self.fail(f"ratio must be 1.0 unless policy is 'channels', got {self.float_attr('ratio')}")
        if policy == "channels" and parse_tensor_type(self.value.type).rank == 0:
            return self.fail("policy 'channels' needs a tensor with an output-channel dimension, got a scalar")
        return self.check_same_types([("value", self.value), ("result", self.result)])


class GradOp(_Verified, name="grad"):
    """The gradient of a scalar loss with respect to one parameter; expanded by pock-autodiff,
    which differentiates once for all pock.grad ops of the same loss.

    One op per parameter rather than one variadic op: IRDL binds a single constraint
    variable per variadic group, so a variadic list of differently shaped tensors would not
    verify. After pock-sparse-bp a gradient may cover only the leading output channels of
    its parameter, so its dim 0 may be smaller than the parameter's.
    """

    loss: ext.Operand[Any]
    param: ext.Operand[Any]
    grad: ext.Result[Any]

    def verify_rules(self) -> bool:
        loss = parse_tensor_type(self.loss.type)
        if loss is None or loss.shape != () or not loss.is_float:
            return self.fail(f"loss must be a rank-0 float !torch.vtensor, got {self.loss.type}")
        p, g = parse_tensor_type(self.param.type), parse_tensor_type(self.grad.type)
        if p is None or g is None or p.element != g.element or p.rank != g.rank or p.shape[1:] != g.shape[1:]:
            return self.fail(f"gradient type {self.grad.type} must match parameter type {self.param.type}")
        if p.rank and not (0 < g.shape[0] <= p.shape[0]):
            return self.fail(f"gradient covers {g.shape[0]} channels, must be 1..{p.shape[0]}")
        return True


class SGDOp(_Verified, name="sgd"):
    """Plain SGD: param - lr * (grad + weight_decay * param)."""

    param: ext.Operand[Any]
    grad: ext.Operand[Any]
    lr: ir.FloatAttr
    weight_decay: ir.FloatAttr
    new_param: ext.Result[Any]

    def verify_rules(self) -> bool:
        return (
            self.check_float_tensor("param", self.param)
            and self.check_same_types([("param", self.param), ("grad", self.grad), ("new_param", self.new_param)])
            and self.check_hyperparameters()
        )


class SGDMomentumOp(_Verified, name="sgd_momentum"):
    """SGD with momentum as torch.optim.SGD computes it; `step` counts the steps taken before
    this one (the first step initialises the buffer to the gradient)."""

    param: ext.Operand[Any]
    grad: ext.Operand[Any]
    momentum_buffer: ext.Operand[Any]
    step: ext.Operand[Any]
    lr: ir.FloatAttr
    momentum: ir.FloatAttr
    dampening: ir.FloatAttr
    weight_decay: ir.FloatAttr
    nesterov: ir.IntegerAttr  # an i1 (`true`/`false`); builtin BoolAttr has no IRDL name of its own
    new_param: ext.Result[Any]
    new_momentum_buffer: ext.Result[Any]

    def verify_rules(self) -> bool:
        return (
            self.check_float_tensor("param", self.param)
            and self.check_same_types(
                [
                    ("param", self.param),
                    ("grad", self.grad),
                    ("momentum_buffer", self.momentum_buffer),
                    ("new_param", self.new_param),
                    ("new_momentum_buffer", self.new_momentum_buffer),
                ]
            )
            and self.check_step(self.step)
            and self.check_hyperparameters()
        )


class AdamWOp(_Verified, name="adamw"):
    """AdamW as torch.optim.AdamW computes it; `step` counts the steps taken before this one."""

    param: ext.Operand[Any]
    grad: ext.Operand[Any]
    exp_avg: ext.Operand[Any]
    exp_avg_sq: ext.Operand[Any]
    step: ext.Operand[Any]
    lr: ir.FloatAttr
    beta1: ir.FloatAttr
    beta2: ir.FloatAttr
    eps: ir.FloatAttr
    weight_decay: ir.FloatAttr
    new_param: ext.Result[Any]
    new_exp_avg: ext.Result[Any]
    new_exp_avg_sq: ext.Result[Any]

    def verify_rules(self) -> bool:
        return (
            self.check_float_tensor("param", self.param)
            and self.check_same_types(
                [
                    ("param", self.param),
                    ("grad", self.grad),
                    ("exp_avg", self.exp_avg),
                    ("exp_avg_sq", self.exp_avg_sq),
                    ("new_param", self.new_param),
                    ("new_exp_avg", self.new_exp_avg),
                    ("new_exp_avg_sq", self.new_exp_avg_sq),
                ]
            )
            and self.check_step(self.step)
            and self.check_hyperparameters()
        )


class OrtAdamWOp(_Verified, name="ort_adamw"):
    """AdamW as ONNX Runtime training computes it (its adam_mode 1, Hugging Face's AdamW): the bias
    corrections scale the learning rate, eps is added to sqrt(exp_avg_sq), and the weight decays
    after the update; `step` counts the steps taken before this one."""

    param: ext.Operand[Any]
    grad: ext.Operand[Any]
    exp_avg: ext.Operand[Any]
    exp_avg_sq: ext.Operand[Any]
    step: ext.Operand[Any]
    lr: ir.FloatAttr
    beta1: ir.FloatAttr
    beta2: ir.FloatAttr
    eps: ir.FloatAttr
    weight_decay: ir.FloatAttr
    new_param: ext.Result[Any]
    new_exp_avg: ext.Result[Any]
    new_exp_avg_sq: ext.Result[Any]

    def verify_rules(self) -> bool:
        return (
            self.check_float_tensor("param", self.param)
            and self.check_same_types(
                [
                    ("param", self.param),
                    ("grad", self.grad),
                    ("exp_avg", self.exp_avg),
                    ("exp_avg_sq", self.exp_avg_sq),
                    ("new_param", self.new_param),
                    ("new_exp_avg", self.new_exp_avg),
                    ("new_exp_avg_sq", self.new_exp_avg_sq),
                ]
            )
            and self.check_step(self.step)
            and self.check_hyperparameters()
        )


class ChannelSliceOp(_Verified, name="channel_slice"):
    """The first `channels` output channels (dim 0) of a tensor."""

    value: ext.Operand[Any]
    channels: ir.IntegerAttr
    result: ext.Result[Any]

    def verify_rules(self) -> bool:
        src, res = parse_tensor_type(self.value.type), parse_tensor_type(self.result.type)
        k = self.int_attr("channels")
        if src is None or src.rank == 0:
            return self.fail(f"value must be a tensor of rank >= 1, got {self.value.type}")
        if not 0 < k <= src.shape[0]:
            return self.fail(f"channels must be in [1, {src.shape[0]}], got {k}")
        if res is None or res.shape != (k,) + src.shape[1:] or res.element != src.element:
            return self.fail(f"result type {self.result.type} must be the first {k} channels of {self.value.type}")
        return True


class ChannelUpdateOp(_Verified, name="channel_update"):
    """`param` with its leading output channels replaced by `update`."""

    param: ext.Operand[Any]
    update: ext.Operand[Any]
    result: ext.Result[Any]

    def verify_rules(self) -> bool:
        p, u = parse_tensor_type(self.param.type), parse_tensor_type(self.update.type)
        if (
            p is None
            or u is None
            or p.rank == 0
            or p.rank != u.rank
            or p.element != u.element
            or p.shape[1:] != u.shape[1:]
            or not 0 < u.shape[0] <= p.shape[0]
        ):
            return self.fail(
                f"update type {self.update.type} must be a leading channel slice of param type {self.param.type}"
            )
        return self.check_same_types([("param", self.param), ("result", self.result)])


def load_pock(context: ir.Context) -> None:
    """Load the pock dialect into a torch-mlir context (once per context)."""
    with context, ir.Location.unknown():
        Pock.load()


def irdl_text() -> str:
    """The dialect as IRDL, for `iree-opt --irdl-file` and other stock MLIR tools."""
    context = ir.Context()
    with context, ir.Location.unknown():
        return str(Pock._emit_module())
