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
                       not activations; arguments live through the step anyway).
  parameter gradients  bytes of the gradients the backward produces for the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

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
    return t.numel * t.dtype.itemsize


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


def backward_cost(function) -> BackwardCost:
    """The cost of the backward of a function returning (loss, gradients...)."""
    block = function.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    returned = list(ops[-1].operands)
    forward, needed = ancestors(returned[:1]), ancestors(returned[1:])
    backward = [op for op in ops if op in needed and op not in forward and not op.name.startswith(_NOT_OPS)]
    parameter_args = {op.operands[0] for op in ops if op.name == "pock.param"}
    batch = {arg for arg in block.arguments if arg not in parameter_args}  # values that depend on the batch
    for op in ops:
        if op.name != "pock.param" and any(v in batch for v in op.operands):
            batch.update(op.results)
    saved = {v for op in backward for v in op.operands
             if v in batch and not isinstance(v.owner, ir.Block) and v.owner.operation in forward}
    return BackwardCost(ops=len(backward), flops=sum(op_flops(op) for op in backward),
                        saved_activation_bytes=sum(_bytes(v) for v in saved),
                        gradient_bytes=sum(_bytes(v) for v in returned[1:]))
