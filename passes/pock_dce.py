"""pock-dce: erase value-semantic ops whose results nobody uses.

Upstream DCE keeps torch ops (they carry no memory-effect interface), so after autodiff or
sparse pruning the backward ops that no kept gradient needs would survive without this.
"""

import re
from dataclasses import dataclass

from torch_mlir import ir

import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.op_facts import FACTS, facts_of, op_key

from .base import ModulePass, functions

# In-place ATen ops (aten.add_.Tensor, aten.copy_) write into their operand; dunder names
# such as aten.__and__ are not in-place.
_IN_PLACE = re.compile(r"^torch\.aten\.\w*[^_]_(\.|$)")


def is_pure(op: ir.Operation) -> bool:
    name = op.name
    if facts_of(op).effectful or _IN_PLACE.match(name):
        return False
    if len(op.regions):  # torch.prim.If / Loop: their bodies may raise or print
        return False
    if name == "torch.operator":  # a custom op: pure if pock knows it (declared, not effectful)
        return op_key(op) in FACTS
    return name.startswith(
        ("torch.aten.", "torch.prims.", "torch.constant.", "torch.prim.", "torch.vtensor.literal", "pock.")
    )


def erase_dead_ops(block: ir.Block) -> int:
    """Erase unused pure ops in one reverse sweep (uses always come after definitions)."""
    erased = 0
    for op in reversed(list(block.operations)):
        op = op.operation
        if op.results and is_pure(op) and all(not list(r.uses) for r in op.results):
            op.erase()
            erased += 1
    return erased


@dataclass(frozen=True)
class DeadCodeEliminationPass(ModulePass):
    name = "pock-dce"
    description = "Erase torch and pock ops whose results are unused (the backward ops no kept gradient needs)"

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for block in func.regions[0].blocks:
                erase_dead_ops(block)
