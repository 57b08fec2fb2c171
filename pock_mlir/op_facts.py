"""What the compiler knows of each torch op besides its IR, in one table (FACTS) filled where
the op's derivative rule is defined (pock_mlir/autodiff/rules/, through `defrule`'s keywords):
its derivative rule (pock-autodiff), how a channel slice of its result maps to slices of its
operands (pock-sparse-bp), whether it only views or fills data, and its FLOPs (the cost model,
pock_mlir/cost.py), and whether it has effects beyond its results (pock-dce). An op that has
facts but no derivative rule (a backward-only op such as threshold_backward, a fill) is
declared with `declare`.

This registry imports no rule file: importing pock_mlir.autodiff fills it (its package imports the
rule files once), so whoever reads FACTS imports pock_mlir.autodiff at the top.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.torch_builder import constant_value, decode_operand
from pock_mlir.torch_types import tensor_type_of


@dataclass
class OpFacts:
    rule: Callable | None = None  # the derivative rule (pock_mlir/autodiff/rules/base.py says how it is called)
    slices: Callable | None = None  # (op, Slice of its result) -> a Slice or None per operand, or None: see below
    view: bool = False  # the same elements in another shape: sparse BP rebuilds it as aten.view; no FLOPs
    free: bool = False  # moves, views or fills data: no FLOPs
    flops: Callable | None = None  # (op) -> FLOPs; None: the element count of its largest operand or result
    effectful: bool = False  # effects beyond its results: pock-dce never erases it
    shape_only: Callable | None = None  # (op) -> indices of the operands it reads for their shape alone
    expand: Callable | None = None  # (b, chunk, *operands) -> its result in aten ops, for an op IREE lacks


FACTS: dict[str, OpFacts] = {}
NO_FACTS = OpFacts()


def declare(*names: str, **facts) -> None:
    """Record facts of ops by name (without the `torch.` prefix); each fact is stated once."""
    for name in names:
        entry = FACTS.setdefault(name, OpFacts())
        for fact, value in facts.items():
            if getattr(entry, fact) not in (None, False):
                raise ValueError(f"{name}: {fact} is already declared")
            setattr(entry, fact, value)


def op_key(op: ir.Operation) -> str:
    """An op's name as FACTS and the rules know it: `aten.mm` for `torch.aten.mm`, and a custom op,
    which the importer emits as torch.operator, by the name it carries (`pock.int4_linear`)."""
    if op.name == "torch.operator":
        return ir.StringAttr(op.attributes["name"]).value.removeprefix("torch.")
    return op.name.removeprefix("torch.")


def facts_of(op: ir.Operation) -> OpFacts:
    return FACTS.get(op_key(op), NO_FACTS)


def derivative_rules() -> dict[str, Callable]:
    return {name: facts.rule for name, facts in FACTS.items() if facts.rule is not None}


def param_name(op: ir.Operation) -> str:
    """The state_dict name a pock.param op marks."""
    return ir.StringAttr(op.attributes["param_name"]).value


# -- how a slice of an op's result maps to slices of its operands ----------------------------
# A slice rule gets the op and the slice of its single tensor result that every user wants, and
# returns one Slice or None (the whole operand, or a non-tensor operand) per operand, or None
# when the op cannot compute only that slice.


@dataclass(frozen=True)
class Slice:
    """The leading `size` entries of dimension `dim`."""

    dim: int
    size: int


def shape_of(value: ir.Value) -> tuple[int, ...]:
    return tensor_type_of(value).shape


def elementwise(op, s: Slice):
    out = shape_of(op.results[0])
    slices = []
    for x in op.operands:
        t = tensor_type_of(x)
        if t is None:
            slices.append(None)
            continue
        dim = s.dim - (len(out) - t.rank)  # broadcasting aligns dimensions from the right
        slices.append(Slice(dim, s.size) if dim >= 0 and t.shape[dim] == out[s.dim] else None)
    return slices


def mm_slices(op, s: Slice):
    return [Slice(0, s.size), None] if s.dim == 0 else [None, Slice(1, s.size)]


def bmm_slices(op, s: Slice):
    return [[Slice(0, s.size), Slice(0, s.size)], [Slice(1, s.size), None], [None, Slice(2, s.size)]][s.dim]


def permute_slices(op, s: Slice):
    dims = decode_operand(op.operands[1])
    return [Slice(dims[s.dim] % len(dims), s.size), None]


def transpose_slices(op, s: Slice):
    rank = len(shape_of(op.results[0]))
    d0, d1 = (decode_operand(o) % rank for o in op.operands[1:])
    dim = d1 if s.dim == d0 else d0 if s.dim == d1 else s.dim
    return [Slice(dim, s.size), None, None]


def t_slices(op, s: Slice):
    return [Slice(len(shape_of(op.results[0])) - 1 - s.dim, s.size)]


def sum_dims_slices(op, s: Slice):
    rank = len(shape_of(op.operands[0]))
    dims = decode_operand(op.operands[1])
    reduced = set(range(rank)) if not dims else {d % rank for d in dims}
    kept = list(range(rank)) if decode_operand(op.operands[2]) else [d for d in range(rank) if d not in reduced]
    return [Slice(kept[s.dim], s.size)] + [None] * (len(op.operands) - 1)


def reshape_slices(op, s: Slice):
    """A leading slice of a reshape's dim d is a leading slice of the input dim that starts at
    the same flat offset and whose trailing block divides d's, if there is one."""
    src, out = shape_of(op.operands[0]), shape_of(op.results[0])
    lead, trail = math.prod(out[: s.dim]), math.prod(out[s.dim + 1 :])
    for dim in range(len(src)):
        src_trail = math.prod(src[dim + 1 :])
        if math.prod(src[:dim]) == lead and src[dim] > 1 and trail % src_trail == 0:
            return [Slice(dim, s.size * trail // src_trail)] + [None] * (len(op.operands) - 1)
    return None


def expand_slices(op, s: Slice):
    out, src = shape_of(op.results[0]), shape_of(op.operands[0])
    dim = s.dim - (len(out) - len(src))
    return [Slice(dim, s.size) if dim >= 0 and src[dim] == out[s.dim] else None, None, None]


def convolution_slices(op, s: Slice):
    """convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups): the output's batch rows come from the input's, its channels from the weight's
    (ungrouped, not transposed)."""
    if s.dim == 0:
        return [Slice(0, s.size)] + [None] * (len(op.operands) - 1)
    if s.dim == 1 and not decode_operand(op.operands[6]) and decode_operand(op.operands[8]) == 1:
        bias = None if tensor_type_of(op.operands[2]) is None else Slice(0, s.size)
        return [None, Slice(0, s.size), bias] + [None] * (len(op.operands) - 3)
    return None


def tensor_results(op) -> list[int]:
    """The indices of an op's tensor results (convolution_backward's unrequested ones are none)."""
    return [i for i, r in enumerate(op.results) if tensor_type_of(r) is not None]


def convolution_backward_slices(op, s: Slice):
    """convolution_backward(g, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, mask) computing one gradient, ungrouped: the weight gradient's output
    channels are g's and the weight's, the input gradient's channels the input's and the
    weight's input channels, its batch rows g's and the input's."""
    rest = [None] * (len(op.operands) - 3)
    if decode_operand(op.operands[9]) != 1 or decode_operand(op.operands[7]) or tensor_results(op) not in ([0], [1]):
        return None
    if tensor_results(op) == [1]:
        return [Slice(1, s.size), None, Slice(0, s.size), *rest] if s.dim == 0 else None
    if s.dim == 0:
        return [Slice(0, s.size), Slice(0, s.size), None, *rest]
    return [None, Slice(1, s.size), Slice(1, s.size), *rest] if s.dim == 1 else None


# -- FLOPs of the ops that are not one operation per element (pock_mlir/cost.py) --------------


def numel(value: ir.Value) -> int:
    t = tensor_type_of(value)
    return t.numel if t is not None else 0


def mm_flops(op) -> int:
    (m, k), (_, n) = shape_of(op.operands[0]), shape_of(op.operands[1])
    return 2 * m * k * n


def bmm_flops(op) -> int:
    (b, m, k), (_, _, n) = shape_of(op.operands[0]), shape_of(op.operands[1])
    return 2 * b * m * k * n


def matmul_flops(op) -> int:
    """Every output element is a length-k dot product."""
    return 2 * numel(op.results[0]) * shape_of(op.operands[0])[-1]


def convolution_flops(op) -> int:
    weight = shape_of(op.operands[1])
    transposed, kernel = constant_value(op.operands[6]), math.prod(weight[2:])
    if transposed:  # every input element meets out_channels/groups * kernel weights
        return 2 * numel(op.operands[0]) * weight[1] * kernel
    return 2 * numel(op.results[0]) * weight[1] * kernel


def convolution_backward_shape_only(op) -> set[int]:
    """The input is read for its values by the weight gradient only, the weight by the input
    gradient only; otherwise for its shape (pock-backend-switch's forms read neither then)."""
    input_gradient, weight_gradient, _ = constant_value(op.operands[10])
    return {i for i, read in ((1, weight_gradient), (2, input_gradient)) if not read}


def convolution_backward_flops(op) -> int:
    """Each gradient asked for costs what the forward convolution does."""
    g, weight = op.operands[0], shape_of(op.operands[2])
    mask = constant_value(op.operands[10])
    return sum(mask) * 2 * numel(g) * weight[1] * math.prod(weight[2:])


# Torch ops pock never differentiates or emits, which pock-dce must keep: effects beyond results.
declare(
    "runtime.assert", "prim.Print", "overwrite.tensor.contents", "copy.to_tensor", "prim.RaiseException", effectful=True
)
