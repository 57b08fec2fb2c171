"""pock-expand-custom: expand pock's own ops, which IREE does not know, into aten ops.

The importer emits a custom op traced from PyTorch (the int4 linear of pock_mlir/layers.py) as a
torch.operator, and pock-autodiff may add others (its input gradient): pock's passes treat each
as one op with its facts, and this pass, the first of the lowered stage, replaces each by its
expansion (op_facts.OpFacts.expand, next to the op's derivative rule). `chunk` bounds the float32
values an expansion materializes at once: the int4 matmuls unpack their weight chunk by chunk.
"""

from dataclasses import dataclass

from torch_mlir import ir

import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.op_facts import facts_of
from pock_mlir.torch_builder import TorchBuilder, decode_operand

from .base import ModulePass, functions, option


@dataclass(frozen=True)
class ExpandCustomPass(ModulePass):
    name = "pock-expand-custom"
    description = "Expand pock's custom ops (torch.operator: the int4 matmuls) into aten ops for IREE"

    # 2^24 values (64 MB): a 7B decoder's MLP weights in 3 chunks, not 11 at 2^22, which halves
    # IREE's compile of an int4 LoRA step (bench/runs/amd-epyc-25-17/NOTES.md)
    chunk: int = option(1 << 24, "the most float32 values an expansion materializes at once")

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for op in list(func.regions[0].blocks[0].operations):
                op = op.operation
                expand = facts_of(op).expand if op.name == "torch.operator" else None
                if expand is None:
                    continue
                b = TorchBuilder(ir.InsertionPoint(op), op.location)
                op.results[0].replace_all_uses_with(expand(b, self.chunk, *map(decode_operand, op.operands)))
                op.erase()
