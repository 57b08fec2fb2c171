"""The cost of a backward pass, as the sparse-BP report and pock-backend-switch count it.

ops                  backward ops: every op the gradients need that the loss does not,
                     constants and list constructions aside.
FLOPs                mm 2*m*k*n, bmm 2*b*m*k*n, matmul 2 * output elements * k,
                     convolution 2 * output elements * input channels per group * kernel
                     elements; layout ops (view, permute, transpose, expand, slice, ...)
                     and fills 0; any other op the element count of its largest operand
                     or result (elementwise ops, reductions).
saved activations    bytes of the forward values the backward reads that depend on the
                     batch (parameters, and values computed from parameters alone, are
                     not activations; arguments live through the step anyway; a value
                     read for its shape alone, as convolution_backward's input when it
                     computes the input gradient, is not kept: OpFacts.shape_only).
parameter gradients  bytes of the gradients the backward produces for the optimizer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch_mlir import ir

import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.op_facts import facts_of, numel
from pock_mlir.torch_types import tensor_type_of

_NOT_OPS = ("torch.constant.", "torch.prim.ListConstruct")


@dataclass(frozen=True)
class BackwardCost:
    ops: int
    flops: int
    saved_activation_bytes: int
    gradient_bytes: int


def _bytes(value: ir.Value) -> int:
    t = tensor_type_of(value)
    return t.numel * t.itemsize


def op_flops(op: ir.Operation) -> int:
    """Floating-point operations of one op (see the module docstring; its facts in pock_mlir.op_facts)."""
    facts = facts_of(op)
    if facts.flops is not None:
        return facts.flops(op)
    if facts.view or facts.free:
        return 0
    return max(numel(v) for v in [*op.operands, *op.results])


def ancestors(values) -> set[ir.Operation]:
    """Every op `values` are computed from, within their block."""
    seen, stack = set(), [v.owner for v in values if not isinstance(v.owner, ir.Block)]
    while stack:
        op = stack.pop()
        op = op.operation
        if op in seen:
            continue
        seen.add(op)
        stack.extend(o.owner for o in op.operands if not isinstance(o.owner, ir.Block))
    return seen


def _backward_of(function):
    """(block ops, the forward: ancestors of the loss, values that depend on the batch, returned values)."""
    block = function.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    returned = list(ops[-1].operands)
    parameter_args = {op.operands[0] for op in ops if op.name == "pock.param"}
    batch = {arg for arg in block.arguments if arg not in parameter_args}  # values that depend on the batch
    for op in ops:
        if op.name != "pock.param" and any(v in batch for v in op.operands):
            batch.update(op.results)
    return ops, ancestors(returned[:1]), batch, returned


def _backward_ops(ops, forward, needed) -> list[ir.Operation]:
    return [op for op in ops if op in needed and op not in forward and not op.name.startswith(_NOT_OPS)]


def _values_read(op: ir.Operation) -> list[ir.Value]:
    """The operands `op` reads for their values, not their shape alone (OpFacts.shape_only)."""
    shape_only = facts_of(op).shape_only
    skipped = shape_only(op) if shape_only else ()
    return [v for i, v in enumerate(op.operands) if i not in skipped]


def _saved(backward, forward, batch) -> set[ir.Value]:
    return {
        v
        for op in backward
        for v in _values_read(op)
        if v in batch and not isinstance(v.owner, ir.Block) and v.owner.operation in forward
    }


def backward_cost(function) -> BackwardCost:
    """The cost of the backward of a function returning (loss, gradients...)."""
    ops, forward, batch, returned = _backward_of(function)
    backward = _backward_ops(ops, forward, ancestors(returned[1:]))
    return BackwardCost(
        ops=len(backward),
        flops=sum(op_flops(op) for op in backward),
        saved_activation_bytes=sum(_bytes(v) for v in _saved(backward, forward, batch)),
        gradient_bytes=sum(_bytes(v) for v in returned[1:]),
    )


@dataclass(frozen=True)
class GradientShares:
    """Each gradient's share of a full backward (a function returning the loss and every parameter's
    gradient), so that the backward of any subset of the gradients costs a union of shares, as
    pock-dce would cut it (the sparse-scheme search costs thousands of schemes so). A gradient's
    share is every backward op it needs and the saved activations those ops read. A channel ratio
    narrows its own ops, those no other gradient needs (the weight-gradient op): pock-sparse-bp
    narrows also the ops that lead there when no other gradient of the scheme needs them, so the
    FLOPs of a channel ratio are an upper bound; saved activations and gradient bytes are exact."""

    flops: tuple[int, ...]  # by backward op index
    activation_bytes: tuple[int, ...]  # by saved-activation index
    ops: tuple[frozenset[int], ...]  # by gradient, in the function's result order
    saved: tuple[frozenset[int], ...]
    own_flops: tuple[int, ...]
    gradient_bytes: tuple[int, ...]
    forward_flops: int

    def cost(self, rows: dict[int, float]) -> BackwardCost:
        """The backward of the gradients `rows` names (gradient index -> the share of its output
        channels kept, 1.0 for all), the others dropped."""
        ops = frozenset().union(*(self.ops[i] for i in rows))
        saved = frozenset().union(*(self.saved[i] for i in rows))
        narrowed = sum((1.0 - share) * self.own_flops[i] for i, share in rows.items())
        return BackwardCost(
            ops=len(ops),
            flops=round(sum(self.flops[op] for op in ops) - narrowed),
            saved_activation_bytes=sum(self.activation_bytes[v] for v in saved),
            gradient_bytes=round(sum(share * self.gradient_bytes[i] for i, share in rows.items())),
        )


def gradient_shares(function) -> GradientShares:
    """The GradientShares of a function returning (loss, every gradient...)."""
    ops, forward, batch, returned = _backward_of(function)
    backward = _backward_ops(ops, forward, ancestors(returned[1:]))
    op_index = {op: i for i, op in enumerate(backward)}
    saved_values = list(_saved(backward, forward, batch))
    value_index = {v: i for i, v in enumerate(saved_values)}
    shares, saved = [], []
    for gradient in returned[1:]:
        wanted = ancestors([gradient])
        needed = [op for op in backward if op in wanted]
        shares.append(frozenset(op_index[op] for op in needed))
        saved.append(frozenset(value_index[v] for v in _saved(needed, forward, batch)))
    flops = tuple(op_flops(op) for op in backward)
    needed_by = Counter(op for share in shares for op in share)
    own = [[op for op in share if needed_by[op] == 1] for share in shares]
    return GradientShares(
        flops=flops,
        activation_bytes=tuple(_bytes(v) for v in saved_values),
        ops=tuple(shares),
        saved=tuple(saved),
        own_flops=tuple(sum(flops[op] for op in share) for share in own),
        gradient_bytes=tuple(_bytes(v) for v in returned[1:]),
        forward_flops=sum(op_flops(op) for op in ops if op in forward and not op.name.startswith(_NOT_OPS)),
    )
