"""pock-autodiff: expand pock.grad ops into torch-dialect backward ops.

All pock.grad ops of one loss share a single reverse sweep, emitted before the first of
them; each is then replaced by its parameter's gradient (pock.channel_slice of it when the
op asks for fewer channels, zeros when the loss does not depend on the parameter).
"""

from dataclasses import dataclass

from pock_mlir.dialects.pock import ChannelSliceOp
from torch_mlir import ir

from pock_mlir.autodiff import MissingRuleError, differentiate
from pock_mlir.torch_builder import TorchBuilder

from .base import ModulePass, PassError, functions


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    name = "pock-autodiff"
    description = "Expand pock.grad into reverse-mode backward ops using the derivative-rule table"

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            block = func.regions[0].blocks[0]
            groups: dict[ir.Value, list] = {}
            for op in block.operations:
                if op.operation.name == "pock.grad":
                    groups.setdefault(op.operands[0], []).append(op)
            for loss, grad_ops in groups.items():
                self._expand(loss, grad_ops)

    @staticmethod
    def _expand(loss, grad_ops):
        params = [op.operands[1] for op in grad_ops]
        try:
            grads = differentiate(loss, params, grad_ops[0].operation)
        except MissingRuleError as e:
            raise PassError(str(e), e.location) from None
        for op, grad in zip(grad_ops, grads):
            b = TorchBuilder(ir.InsertionPoint(op), op.location)
            if grad is None:
                grad = b.zeros_like(op.operands[1])
            if b.shape(grad) != b.shape(op.results[0]):  # pock-sparse-bp moves this slice into the backward
                channels = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), b.shape(op.results[0])[0])
                grad = ChannelSliceOp(grad, channels, op.results[0].type, loc=op.location, ip=b.ip).result
            op.results[0].replace_all_uses_with(grad)
            op.operation.erase()
