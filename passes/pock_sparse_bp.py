"""pock-sparse-bp: sparse backpropagation, the backward computes only what kept gradients need.

After pock-autodiff, a channel-sparse parameter's gradient is `pock.channel_slice` of its full
gradient. This pass moves each such slice up through the ops that compute the gradient, as long
as every use of a value wants the same leading slice of it, so that those ops run on the kept
channels only: `slice(permute(mm(A^T, G)), 0)` becomes `permute(mm(A^T, slice(G, 1)))`, a matmul
with k instead of C output columns. The slice crosses transpose, permute, view-like reshapes,
sum (sum_to), expand, elementwise ops with broadcasting (add, mul by a broadcast bias,
threshold_backward, ...), mm and bmm, convolution (its output channels are its weight's) and
convolution_backward (a weight gradient's output channels are g's). Where a value is needed
whole elsewhere (the cotangent that also feeds the input gradient), the slice stops there and
becomes an `aten.slice.Tensor` right after the value's definition, shared by every op that wants
the same slice. Finally the ops no kept gradient needs any more are erased (as pock-dce does);
together with pock-autodiff differentiating only what depends on a trainable parameter, no
backward op is left below the lowest updated layer, none for frozen parameters and no full
gradient for a channel-sparse one.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.op_facts import Slice, facts_of, op_key, shape_of, tensor_results
from pock_mlir.torch_builder import TorchBuilder, decode_operand
from pock_mlir.torch_types import TensorType, tensor_type_of

from .base import ModulePass, functions
from .pock_dce import erase_dead_ops


def _sliced_shape(value: ir.Value, s: Slice) -> tuple[int, ...]:
    shape = list(shape_of(value))
    shape[s.dim] = s.size
    return tuple(shape)


def _rebuild(b: TorchBuilder, op, result: ir.Value, operands: list[ir.Value], s: Slice) -> ir.Value:
    """The op on sliced operands, its tensor `result` sliced like the original's."""
    if facts_of(op).view:
        return b.aten.view(operands[0], list(_sliced_shape(result, s)))
    if op_key(op) == "aten.expand":
        return b.aten.expand(operands[0], list(_sliced_shape(result, s)), decode_operand(op.operands[2]))
    sliced_type = ir.Type.parse(TensorType(_sliced_shape(result, s), tensor_type_of(result).element).asm())
    types = [sliced_type if r == result else r.type for r in op.results]
    rebuilt = ir.Operation.create(op.name, results=types, operands=operands, loc=op.location, ip=b.ip)
    return rebuilt.results[list(op.results).index(result)]


def _tensor_result(op) -> ir.Value | None:
    """The op's one tensor result, or None (a convolution_backward computing one gradient has
    none-typed results for the others)."""
    indices = tensor_results(op)
    return op.results[indices[0]] if len(indices) == 1 else None


def _constant_operands(op) -> bool:
    """Rules read dims and shapes from constant operands; an op with a computed one stays whole."""
    try:
        for v in op.operands:
            if tensor_type_of(v) is None:
                decode_operand(v)
    except ValueError:
        return False
    return True


# -- pushing channel slices up the backward --------------------------------------------------


def push_channel_slices(block: ir.Block) -> None:
    """Compute each channel-sliced gradient from sliced operands (see the module docstring)."""
    ops = [op.operation for op in block.operations]
    wanted: dict[ir.Value, list] = {}  # value -> the Slice (or None: whole) each use so far wants
    demand: dict[ir.Value, Slice] = {}  # values computed sliced, by the slice every use wants
    operand_slices: dict[ir.Operation, list] = {}

    def want(value, s):
        wanted.setdefault(value, []).append(s)

    # Uses come after definitions, so walking backwards sees every use of a value before it.
    for op in reversed(ops):
        if op.name == "pock.channel_slice":
            want(op.operands[0], Slice(0, ir.IntegerAttr(op.attributes["channels"]).value))
            continue
        slices = None
        result = _tensor_result(op)
        if result is not None:
            uses = wanted.get(result, [])
            rule = facts_of(op).slices
            if (
                rule
                and uses
                and uses[0] is not None
                and all(u == uses[0] for u in uses)
                and len(uses) == len(list(result.uses))
                and _constant_operands(op)
            ):
                slices = rule(op, uses[0])
                if slices is not None:
                    demand[result] = uses[0]
                    operand_slices[op] = slices
        for i, operand in enumerate(op.operands):
            want(operand, slices[i] if slices else None)
    if not demand:
        return

    sliced: dict[ir.Value, ir.Value] = {}
    explicit: dict[tuple[ir.Value, Slice], ir.Value] = {}

    def slice_of(value: ir.Value, s: Slice) -> ir.Value:
        if value in demand:
            return sliced[value]
        if (value, s) not in explicit:  # one slice after the definition serves every user
            owner = value.owner
            ip = (
                ir.InsertionPoint.at_block_begin(block)
                if isinstance(owner, ir.Block)
                else ir.InsertionPoint.after(owner)
            )
            b = TorchBuilder(ip, value.location if isinstance(owner, ir.Block) else owner.location)
            explicit[(value, s)] = b.aten.slice.Tensor(value, s.dim, 0, s.size, 1)
        return explicit[(value, s)]

    for op in ops:
        if op.name == "pock.channel_slice" and op.operands[0] in demand:
            op.results[0].replace_all_uses_with(sliced[op.operands[0]])
            continue
        if op not in operand_slices:
            continue
        operands = [v if s is None else slice_of(v, s) for v, s in zip(op.operands, operand_slices[op])]
        result = _tensor_result(op)
        sliced[result] = _rebuild(
            TorchBuilder(ir.InsertionPoint(op), op.location), op, result, operands, demand[result]
        )


@dataclass(frozen=True)
class SparseBackpropPass(ModulePass):
    name = "pock-sparse-bp"
    description = (
        "Compute channel-sparse gradients from sliced operands and erase every backward op no kept gradient needs"
    )

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for block in func.regions[0].blocks:
                erase_dead_ops(block)  # a dead use (an unneeded input gradient) would keep a value whole
                push_channel_slices(block)
                erase_dead_ops(block)
