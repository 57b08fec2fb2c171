"""pock-strip-params: replace pock.param markers by the values they mark.

The last pock step before IREE: afterwards the module is plain torch dialect. Any other
pock op still present means an earlier pass was skipped, which is reported by name.
"""

from dataclasses import dataclass

from torch_mlir import ir

from .base import ModulePass, PassError, functions
from .pock_lower_optimizers import LOWERINGS, LowerOptimizersPass

_LOWERED_BY = {"pock.grad": "pock-autodiff", **{name: LowerOptimizersPass.name for name in LOWERINGS}}


@dataclass(frozen=True)
class StripParamsPass(ModulePass):
    name = "pock-strip-params"
    description = "Replace pock.param markers by their values, leaving plain torch dialect for IREE"

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for op in list(func.regions[0].blocks[0].operations):
                name = op.operation.name
                if name == "pock.param":
                    op.results[0].replace_all_uses_with(op.operands[0])
                    op.operation.erase()
                elif name.startswith("pock."):
                    raise PassError(
                        f"{name} is still present; run {_LOWERED_BY.get(name, 'its lowering')} before this pass",
                        op.location,
                    )
