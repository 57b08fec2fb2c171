"""pock-reorder-updates: apply each parameter's update as soon as its gradient is complete.

The training builder appends every optimizer update after the whole backward pass, so each
gradient buffer (and the activations its weight-gradient op reads) lives until the end of
the step. This pass moves each update, together with the ops that exist only to feed it
(its weight-gradient op, gradient slices, constants), to just after the last op it needs
that stays in place. Values only move earlier, so no lifetime grows.

Under IREE it matters where a gradient is a buffer of its own: a convolution's weight gradient
(im2col, a matmul, a transpose) is, a linear layer's is not (IREE fuses the elementwise update
into the matmul producing it, wherever the update sits). IREE places a fused update where its
last op is; the training builder guards every new value with a select on whether the loss was
finite, at the return, so the lowered pipeline runs this pass twice: before lowering
(`roots=optimizer`) to move the updates, and after (`roots=returned`) to move each select to
its update. Without the second run every such gradient lives to the end of the step
(tests/test_passes_perf.py compares the step's workspace with and without the pass).

Roots are the optimizer ops before pock-lower-optimizers (`roots=optimizer`); after
lowering, `roots=returned` takes every op whose results only the function returns (the
lowered torch arithmetic of the updates).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.optim import UPDATE_OPS

from .base import ModulePass, PassError, functions, option

OPTIMIZER_OPS = (*UPDATE_OPS, "pock.channel_update")
ROOT_KINDS = ("optimizer", "returned")


def _users(op: ir.Operation) -> list[ir.Operation]:
    return [use.owner for result in op.results for use in result.uses]


def _is_root(op: ir.Operation, roots: str) -> bool:
    if roots == "optimizer":
        return op.name in OPTIMIZER_OPS
    users = _users(op)
    return bool(users) and all(u.name == "func.return" for u in users)


def reorder_block(block: ir.Block, roots: str) -> None:
    """Move the update subgraph of one block to its earliest points."""
    ops = [op.operation for op in block.operations]
    position = {op: i for i, op in enumerate(ops)}

    # Each root with its feeders: the ops all of whose users are that one root's group (or the
    # return). Ops shared between updates (the backward's cotangents) stay where they are.
    group: dict[ir.Operation, ir.Operation] = {}
    for op in reversed(ops):
        if op.regions or op.name == "func.return":
            continue
        if _is_root(op, roots):
            group[op] = op
            continue
        users = _users(op)
        owners = {group.get(u) for u in users if u.name != "func.return"}
        if len(owners) == 1 and None not in owners:
            group[op] = owners.pop()
    if not group:
        return

    # A group goes right after the last op that stays in place that any of its ops needs, directly
    # or through another group it needs (a channel-sparse write-back needs its update's group),
    # which moves too: never after that group's ops, which may move earlier than the group itself.
    stays: dict[ir.Operation, int] = {}  # by root: the last op that stays in place its own ops need
    needs: dict[ir.Operation, set] = {}  # by root: the other groups its ops need
    for op, root in group.items():
        stays.setdefault(root, -1)
        needs.setdefault(root, set())
        for operand in op.operands:
            owner = operand.owner
            if isinstance(owner, ir.Block):
                continue
            other = group.get(owner.operation)
            if other is None:
                stays[root] = max(stays[root], position[owner.operation])
            elif other is not root:
                needs[root].add(other)
    ready: dict[ir.Operation, int] = {}  # by root; -1: it needs only arguments and constants, it goes first

    def resolve(root: ir.Operation) -> int:
        if root not in ready:
            ready[root] = max([stays[root], *(resolve(other) for other in needs[root])])
        return ready[root]

    for root in needs:
        resolve(root)
    if roots == "returned":
        _after_other_readers(group, needs, ready, position)

    last_placed: dict[int, ir.Operation] = {}
    for op in ops:  # original order within a group keeps every def before its uses
        if op not in group:
            continue
        anchor = ready[group[op]]
        after = last_placed.get(anchor) or (ops[anchor] if anchor >= 0 else None)
        if after is None:
            op.move_before(block.operations[0].operation)
        else:
            op.move_after(after)
        last_placed[anchor] = op


def _after_other_readers(group, needs, ready, position) -> None:
    """Raise each group's anchor to the anchors of the other groups reading the op it is anchored at
    (and to those of the groups it needs), until nothing moves. IREE fuses an elementwise value read
    by several ops into the last of its readers only: a select of SGD's momentum placed before the
    parameter's update, which reads the new momentum too, would keep that update out of the
    dispatch of the weight gradient's matmul (a dispatch of its own per update)."""
    readers: dict[int, set] = {}  # by the position of an op that stays: the groups with an op reading it
    for op, root in group.items():
        for operand in op.operands:
            owner = operand.owner
            # a constant (an op without operands) is no value IREE fuses: groups reading it are unrelated
            if not isinstance(owner, ir.Block) and owner.operation not in group and len(owner.operation.operands):
                readers.setdefault(position[owner.operation], set()).add(root)
    moved = True
    while moved:
        moved = False
        for root in ready:
            later = max(
                [*(ready[other] for other in readers.get(ready[root], ())), *(ready[other] for other in needs[root])],
                default=-1,
            )
            if later > ready[root]:
                ready[root], moved = later, True


@dataclass(frozen=True)
class ReorderUpdatesPass(ModulePass):
    name = "pock-reorder-updates"
    description = (
        "Move each parameter update (and the ops that only feed it) to just after its gradient is "
        "complete, so gradient buffers die during the backward pass instead of at its end"
    )
    roots: str = option(
        "optimizer",
        "what to move: 'optimizer' (the optimizer updates of pock_mlir/optim/ and pock.channel_update, before "
        "pock-lower-optimizers) or 'returned' (ops only the return uses, after lowering)",
    )

    def apply(self, module: ir.Operation) -> None:
        if self.roots not in ROOT_KINDS:
            raise PassError(f"roots must be one of {', '.join(ROOT_KINDS)}, got '{self.roots}'")
        for func in functions(module):
            for block in func.regions[0].blocks:
                reorder_block(block, self.roots)
