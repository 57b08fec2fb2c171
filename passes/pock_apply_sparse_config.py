"""pock-apply-sparse-config: apply a sparse scheme to a training-stage module, before pock-autodiff.

For pock-opt (compile_training resolves the scheme before building the step instead): it
re-annotates a training-stage module with a sparse scheme in the YAML/JSON format of
compile_training's `sparse=` (patterns and the full/bias-only presets; presets that read the
model's structure need the model):
pock.param policies are set, a frozen parameter's pock.grad is dropped and its update op
replaced by its unchanged parameter and state, and a channel-sparse parameter's pock.grad
gets the reduced type, its update op runs on pock.channel_slice of the parameter and its
state and pock.channel_update writes them back. Function signatures do not change (the
runtime's argument order is fixed by the step's ABI, which a pass cannot update): state
arguments keep their full shape, and a gradient the function returns is padded with zeros
(frozen: all zeros). A scheme can only narrow the input's training: unfreezing needs
optimizer state the signature lacks, and a parameter already channel-sparse in the input
can be kept or frozen but not re-sliced. Then run the backward as usual:

    pock-opt step.mlir -p 'pock-apply-sparse-config{config=sparse.yaml},inline,pock-autodiff,pock-sparse-bp'
"""

from __future__ import annotations

from dataclasses import dataclass

from pock_mlir.dialects.pock import ChannelSliceOp, ChannelUpdateOp, GradOp
from torch_mlir import ir

from pock_mlir.abi import Policy
from pock_mlir.op_facts import param_name, shape_of
from pock_mlir.optim import UPDATE_OPS
from pock_mlir.torch_builder import TorchBuilder
from pock_mlir.torch_types import TensorType, tensor_type_of

from .base import ModulePass, PassError, functions, option


def _param_name(value: ir.Value) -> str | None:
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "pock.param":
        return None
    return param_name(owner)


def _channel_slice(ip, loc, result_type, value, channels: int) -> ir.Value:
    return ChannelSliceOp(
        value, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), channels), result_type, loc=loc, ip=ip
    ).result


def _channel_update(ip, loc, param, update) -> ir.Value:
    return ChannelUpdateOp(param, update, param.type, loc=loc, ip=ip).result


def _narrow_update(update, grad, k: int) -> None:
    """Run `update` on the first k channels of its parameter and state, writing them back."""
    ip, loc = ir.InsertionPoint(update), update.location
    slots = UPDATE_OPS[update.name].state_slots
    operands = list(update.operands)
    full = operands[: 2 + slots]
    slice_type = grad.type
    narrowed = [_channel_slice(ip, loc, slice_type, v, k) for v in (full[0], *full[2:])]
    attributes = {name: update.attributes[name] for name in update.attributes}
    new = ir.Operation.create(
        update.name,
        results=[slice_type] * (1 + slots),
        operands=[narrowed[0], grad, *narrowed[1:], *operands[2 + slots :]],
        attributes=attributes,
        loc=loc,
        ip=ip,
    )
    for old_result, base, new_result in zip(update.results, (full[0], *full[2:]), new.results):
        old_result.replace_all_uses_with(_channel_update(ip, loc, base, new_result))
    update.erase()


def _freeze_update(update) -> None:
    """The parameter and state come out unchanged."""
    slots = UPDATE_OPS[update.name].state_slots
    operands = list(update.operands)
    for old_result, unchanged in zip(update.results, [operands[0], *operands[2 : 2 + slots]]):
        old_result.replace_all_uses_with(unchanged)
    update.erase()


def _rows(shape: tuple[int, ...]) -> int:
    return shape[0] if shape else 1


def _reannotate_grad(grad_op, policy: Policy, name: str) -> None:
    param, result = grad_op.operands[1], grad_op.results[0]
    param_shape, grad_shape = shape_of(param), shape_of(result)
    k = 0 if policy.kind == "frozen" else policy.channels(param_shape) if param_shape else 1
    if k == _rows(grad_shape):
        return
    if k and grad_shape != param_shape:
        raise PassError(
            f"'{name}' already has a {_rows(grad_shape)}-channel gradient in the input, the config asks "
            f"for {k}; apply config to a module built with every parameter in full",
            grad_op.location,
        )
    b = TorchBuilder(ir.InsertionPoint(grad_op), grad_op.location)
    grad = None
    if k:
        grad_type = ir.Type.parse(TensorType((k,) + param_shape[1:], tensor_type_of(param).element).asm())
        grad = GradOp(*grad_op.operands, grad_type, loc=grad_op.location, ip=b.ip).grad
    for use in list(result.uses):
        update = use.owner
        if update.name not in UPDATE_OPS or use.operand_number != 1:
            continue
        if k:
            _narrow_update(update, grad, k)
        else:
            _freeze_update(update)
    if list(result.uses):  # returned gradients keep their type: zero-padded, or zeros when frozen
        zeros = b.zeros_like(result if not k else param)
        result.replace_all_uses_with(_channel_update(b.ip, grad_op.location, zeros, grad) if k else zeros)
    grad_op.erase()


def reannotate(module: ir.Operation, config: str) -> None:
    """Apply the sparse scheme in `config` to the training functions of `module`."""
    from pock_mlir.sparse import SparseConfigError, resolve_sparse  # imports PyTorch: presets read nn.Modules

    params = {}
    for func in functions(module):
        for op in func.regions[0].blocks[0].operations:
            if op.operation.name == "pock.param":
                params[_param_name(op.results[0])] = shape_of(op.results[0])
    try:
        scheme = resolve_sparse(config, None, params)
    except SparseConfigError as e:
        raise PassError(f"config {config}: {e}") from None
    for func in functions(module):
        block = func.regions[0].blocks[0]
        grads = {}
        for op in block.operations:
            if op.operation.name == "pock.grad":
                grads[_param_name(op.operands[1])] = op.operation
        for op in [op.operation for op in block.operations if op.operation.name == "pock.param"]:
            name = _param_name(op.results[0])
            policy = scheme.policies[name]
            if grads and name not in grads and policy.kind != "frozen":
                raise PassError(
                    f"config {config}: '{name}' is frozen in the input (no pock.grad, no optimizer state "
                    f"in the signature) and cannot be unfrozen by a pass; build the step with it trainable",
                    op.location,
                )
            op.attributes["policy"] = ir.StringAttr.get(policy.kind)
            op.attributes["ratio"] = ir.FloatAttr.get(ir.F64Type.get(), policy.ratio)
            if name in grads:
                _reannotate_grad(grads[name], policy, name)


@dataclass(frozen=True)
class ApplySparseConfigPass(ModulePass):
    name = "pock-apply-sparse-config"
    description = (
        "Apply a sparse scheme (YAML/JSON) to a training-stage module's pock.param, pock.grad and "
        "update ops, before pock-autodiff; function signatures do not change"
    )
    config: str = option("", "the YAML/JSON sparse scheme (compile_training's sparse= format)")

    def apply(self, module: ir.Operation) -> None:
        if not self.config:
            raise PassError("pock-apply-sparse-config needs config=FILE (a YAML/JSON sparse scheme)")
        reannotate(module, self.config)
