"""pock-lower-optimizers: optimizer updates and channel slices as torch-dialect arithmetic.

Each optimizer's update op is lowered by the lowering its file registers (pock_mlir/optim/),
whose formulas follow torch.optim exactly, so a compiled step reproduces PyTorch's parameter
trajectory.
"""

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.optim import UPDATE_OPS
from pock_mlir.optim.registry import attribute
from pock_mlir.torch_builder import TorchBuilder

from .base import ModulePass, functions


def lower_channel_slice(b: TorchBuilder, op):
    return [b.aten.slice.Tensor(op.operands[0], 0, 0, attribute(op, "channels"), 1)]


def lower_channel_update(b: TorchBuilder, op):
    param, update = op.operands
    k = b.shape(update)[0]
    return [b.aten.slice_scatter(param, update, 0, 0, k, 1)]


LOWERINGS = {
    **{name: update.lower for name, update in UPDATE_OPS.items()},
    "pock.channel_slice": lower_channel_slice,
    "pock.channel_update": lower_channel_update,
}


@dataclass(frozen=True)
class LowerOptimizersPass(ModulePass):
    name = "pock-lower-optimizers"
    description = (
        f"Lower pock optimizer updates ({', '.join(n.removeprefix('pock.') for n in UPDATE_OPS)}) and "
        "channel slices to torch-dialect arithmetic"
    )

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for op in list(func.regions[0].blocks[0].operations):
                lower = LOWERINGS.get(op.operation.name)
                if lower is None:
                    continue
                b = TorchBuilder(ir.InsertionPoint(op), op.location)
                for old, new in zip(op.results, lower(b, op)):
                    old.replace_all_uses_with(new)
                op.operation.erase()
