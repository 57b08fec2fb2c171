"""pock-order-param-reads: make each parameter's update wait for the backward's other reads of it.

train_step_into may write a parameter's new value into the buffer that holds the old one (one set
of parameters on the device instead of two), but only where IREE's schedule runs every read of
the old value before the write (pock_mlir/in_place.py checks). The forward's reads come first by
dataflow, and the update reads the old value where it writes the new one. The backward's input
gradient also reads the weight (dx = dy W), yet nothing orders it before the update: IREE runs
the two dispatches side by side. This pass gives the update a data dependency on what the input
gradient computes: the update reads `param + 0 * d[0]`, where d is the first value downstream of
each such read that IREE materializes (an operand of the next contraction, a returned value, or a
gradient an update reads) and that is computed before the update. IREE fuses the addition into the
update's dispatch as one scalar load, so the update runs after that dispatch. Running later can
keep the update's own inputs alive longer: on a model whose memory is its activations the step's
workspace grew (docs/quality.md). The product is not folded, since 0 * NaN is NaN: a non-finite
input gradient makes the parameter non-finite, where it would already have made every earlier
layer's gradient so.

Runs before pock-reorder-updates, which then places each update after the values it now needs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.cost import ancestors
from pock_mlir.optim import UPDATE_OPS
from pock_mlir.torch_builder import TorchBuilder
from pock_mlir.torch_types import tensor_type_of

from .base import ModulePass, functions

# Ops whose operands IREE materializes as buffers: it fuses elementwise consumers into them, not producers.
CONTRACTIONS = frozenset(
    f"torch.aten.{name}"
    for name in ("mm", "bmm", "matmul", "linear", "addmm", "baddbmm", "convolution", "convolution_backward")
)
# What reads a parameter to update it: an optimizer update, or the channel slice it updates.
UPDATE_READERS = frozenset((*UPDATE_OPS, "pock.channel_slice", "pock.channel_update"))


def _views(param: ir.Value) -> dict:
    """The values computed from `param` alone (with constants): views of the weight, such as a
    linear layer's W^T, which IREE folds into whatever reads them, so never the value to wait for.
    A dict used as a set ordered as found: the waits, and so the IR, follow that order (a set's
    order is the values' hashes', which differ from one compilation to the next)."""
    views, stack = {param: None}, [param]
    while stack:
        for use in stack.pop().uses:
            user = use.owner.operation
            tensors = [v for v in user.operands if tensor_type_of(v) is not None]
            if user.results and all(v in views for v in tensors):  # revisited as each operand becomes a view
                new = [r for r in user.results if r not in views]
                views.update(dict.fromkeys(new))
                stack.extend(new)
    return views


def _materialized_after(reader: ir.Operation, views: dict, position: dict, before: int) -> list[ir.Value]:
    """The first float values downstream of `reader` that IREE holds in a buffer and that are
    computed before position `before`: each is used by a contraction, returned, or a gradient an
    update reads (where no contraction follows, as in the embeddings' backward), and is not a view
    of the parameter."""
    found, seen = [], set()
    frontier = deque(reader.results)
    while frontier:
        value = frontier.popleft()
        if value in seen or position[value.owner.operation] >= before:
            continue
        seen.add(value)
        users = [use.owner.operation for use in value.uses]
        tensor = tensor_type_of(value)
        if (
            value not in views
            and tensor is not None
            and tensor.is_float
            and any(u.name in CONTRACTIONS or u.name in UPDATE_READERS or u.name == "func.return" for u in users)
        ):
            found.append(value)
            continue
        frontier.extend(r for u in users if u.name not in UPDATE_READERS for r in u.results)
    return found


def _downstream(ops: list[ir.Operation]) -> set:
    """The ops that use the results of `ops`, transitively, `ops` included."""
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(use.owner.operation for r in op.results for use in r.uses)
    return seen


def order_function(func) -> None:
    block = func.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    if not any(op.name in UPDATE_OPS for op in ops):
        return
    forward = ancestors([ops[-1].operands[0]])  # of the loss
    # What reads the updates' results reads the old parameter in the same dispatch (the step's
    # guard against a non-finite loss selects between the two).
    updating = _downstream([op for op in ops if op.name in UPDATE_READERS])
    position = {op: i for i, op in enumerate(ops)}
    # A dense update reads its parameter; a channel-sparse one, a slice of it (pock.channel_slice),
    # and pock.channel_update writes the rows back into it.
    params = [op.operands[0] for op in ops if op.name in (*UPDATE_OPS, "pock.channel_update")]
    params = list(
        dict.fromkeys(p for p in params if not isinstance(p.owner, ir.Block) and p.owner.name == "pock.param")
    )
    for param in params:
        # The backward may read the weight through a view the forward made of it (a linear layer's
        # W^T): IREE folds a view into its reader, so the reader reads the weight.
        views = _views(param)
        readers = list(
            dict.fromkeys(
                use.owner.operation
                for v in views
                for use in v.uses
                if not (use.owner.operation.results and all(r in views for r in use.owner.operation.results))
            )
        )
        late = [r for r in readers if r not in updating and r not in forward]
        if not late:
            continue
        update_readers = [r for r in readers if r.name in UPDATE_READERS and param in list(r.operands)]
        if not update_readers:
            continue
        # the values the updates wait for must be computed before them (not the step's guard
        # against a non-finite loss, which selects between old and new after every update)
        earliest = min(position[r] for r in update_readers)
        waits = list(dict.fromkeys(v for r in late for v in _materialized_after(r, views, position, earliest)))
        if not waits:
            continue
        for reader in update_readers:
            b = TorchBuilder(ir.InsertionPoint(reader), reader.location)
            zero = None
            for wait in waits:
                flat = wait if len(b.shape(wait)) == 1 else b.reshape(wait, [-1])
                first = b.aten.select.int(flat, 0, 0)
                zero = first if zero is None else b.add(zero, first)
            ordered = b.add(param, b.mul(zero, 0.0))
            for index, operand in enumerate(reader.operands):
                if operand == param:
                    reader.operands[index] = ordered


@dataclass(frozen=True)
class OrderParamReadsPass(ModulePass):
    name = "pock-order-param-reads"
    description = (
        "Make each parameter update depend on the backward's other reads of the old parameter, so "
        "that the step may write the new parameter where the old one is"
    )

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            order_function(func)
