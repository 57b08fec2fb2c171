"""pock-step-into: add <function>_into, which writes the step's results into buffers the caller gives.

train_step is a pure function: every call allocates its results (the loss, the new parameters,
optimizer state, buffers and step count) while its arguments still hold the old ones, and the
runtime frees the old ones afterwards. Under IREE's local-task driver that kept three result blocks
alive, not two, and each call touched its results as fresh pages. train_step_into takes
train_step's arguments and then one mutable tensor per result, the loss first; it calls
train_step, overwrites those tensors with the results (IREE writes into the caller's buffers) and
returns nothing. The Trainer alternates two sets of buffers: one step reads set A and writes set B,
the next reads B and writes A, so no buffer is read and written by one call. Its loss lands in one
buffer the Trainer maps once, rather than in one IREE allocates and the host maps every call
(pock_mlir/runtime/workspace.py LossSlot). train_step stays for
callers that want results (iree-run-module).
"""

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.abi import TRAIN_STEP

from .base import ModulePass, PassError, functions, option

SUFFIX = "_into"


def _mutable(value_type: ir.Type) -> ir.Type:
    """!torch.vtensor<...> -> !torch.tensor<...>: a tensor the function may overwrite."""
    return ir.Type.parse(str(value_type).replace("!torch.vtensor<", "!torch.tensor<", 1))


@dataclass(frozen=True)
class StepIntoPass(ModulePass):
    name = "pock-step-into"
    description = (
        "Add <function>_into: the same step, writing its results into caller-given buffers and returning nothing"
    )
    function: str = option(TRAIN_STEP, "the function to wrap")

    def apply(self, module: ir.Operation) -> None:
        step = next(
            (f for f in functions(module) if ir.StringAttr(f.attributes["sym_name"]).value == self.function), None
        )
        if step is None:
            raise PassError(f"no function @{self.function} to wrap")
        step_type = ir.FunctionType(ir.TypeAttr(step.attributes["function_type"]).value)
        inputs, results = list(step_type.inputs), list(step_type.results)
        if not results:
            raise PassError(f"@{self.function} returns nothing to write into buffers", step.location)
        with ir.InsertionPoint(module.regions[0].blocks[0]), step.location:
            wrapper = func.FuncOp(self.function + SUFFIX, (inputs + [_mutable(t) for t in results], []))
            entry = wrapper.add_entry_block()
            args = list(entry.arguments)
            with ir.InsertionPoint(entry):
                values = func.CallOp(results, ir.FlatSymbolRefAttr.get(self.function), args[: len(inputs)]).results
                for value, buffer in zip(values, args[len(inputs) :]):
                    ir.Operation.create("torch.overwrite.tensor.contents", operands=[value, buffer])
                func.ReturnOp([])
