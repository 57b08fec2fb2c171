"""pock-sparse-bp: sparse backpropagation, the backward computes only what kept gradients need.

After pock-autodiff, a channel-sparse parameter's gradient is `pock.channel_slice` of its
full gradient. This pass moves each such slice up through the ops that compute the gradient,
as long as every use of a value wants the same leading slice of it, so that those ops run on
the kept channels only: `slice(permute(mm(A^T, G)), 0)` becomes `permute(mm(A^T, slice(G, 1)))`,
a matmul with k instead of C output columns. The slice crosses transpose, permute, view-like
reshapes, sum (sum_to), expand, elementwise ops with broadcasting (add, mul by a broadcast
bias, threshold_backward, ...), mm and bmm, and convolution (its output channels are its
weight's). Where a value is needed whole elsewhere (the cotangent that also feeds the input
gradient), the slice stops there and becomes an `aten.slice.Tensor` right after the value's
definition, shared by every op that wants the same slice. Finally the ops no kept gradient
needs any more are erased (as pock-dce does); together with pock-autodiff differentiating
only what depends on a trainable parameter, no backward op is left below the lowest updated
layer, none for frozen parameters and no full gradient for a channel-sparse one.

`config=FILE` (for pock-opt; compile_training resolves the scheme before building the
step instead) first re-annotates a training-stage module, before pock-autodiff, with a
sparse scheme in the YAML/JSON format of compile_training's `sparse=` (patterns and the
full/bias-only presets; presets that read the model's structure need the model):
pock.param policies are set, a frozen parameter's pock.grad is dropped and its update op
replaced by its unchanged parameter and state, and a channel-sparse parameter's pock.grad
gets the reduced type, its update op runs on pock.channel_slice of the parameter and its
state and pock.channel_update writes them back. Function signatures do not change (the
runtime's argument order is fixed by the step's ABI, which a pass cannot update): state
arguments keep their full shape, and a gradient the function returns is padded with zeros
(frozen: all zeros). A scheme can only narrow the input's training: unfreezing needs
optimizer state the signature lacks, and a parameter already channel-sparse in the input
can be kept or frozen but not re-sliced. Then run the backward as usual:

    pock-opt step.mlir -p 'pock-sparse-bp{config=sparse.yaml},inline,pock-autodiff,pock-sparse-bp'
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.abi import Policy
from pock_mlir.dialects.pock import ChannelSliceOp, ChannelUpdateOp, GradOp
from pock_mlir.op_facts import Slice, facts_of, op_key, param_name, shape_of
from pock_mlir.optim import UPDATE_OPS
from pock_mlir.sparse import SparseConfigError, resolve_sparse
from pock_mlir.torch_builder import TorchBuilder, decode_operand
from pock_mlir.torch_types import TensorType, tensor_type_of

from .base import ModulePass, PassError, functions, option
from .pock_dce import erase_dead_ops


def _sliced_shape(value: ir.Value, s: Slice) -> tuple[int, ...]:
    shape = list(shape_of(value))
    shape[s.dim] = s.size
    return tuple(shape)


def _rebuild(b: TorchBuilder, op, operands: list[ir.Value], s: Slice) -> ir.Value:
    """The op on sliced operands, its result sliced like the original's."""
    if facts_of(op).view:
        return b.aten.view(operands[0], list(_sliced_shape(op.results[0], s)))
    if op_key(op) == "aten.expand":
        return b.aten.expand(operands[0], list(_sliced_shape(op.results[0], s)), decode_operand(op.operands[2]))
    result_type = TensorType(_sliced_shape(op.results[0], s), tensor_type_of(op.results[0]).dtype)
    return ir.Operation.create(op.name, results=[ir.Type.parse(result_type.asm())], operands=operands,
                               loc=op.location, ip=b.ip).results[0]


def _constant_operands(op) -> bool:
    """Rules read dims and shapes from constant operands; an op with a computed one stays whole."""
    try:
        for v in op.operands:
            if tensor_type_of(v) is None:
                decode_operand(v)
    except ValueError:
        return False
    return True


# -- pushing channel slices up the backward --------------------------------------------------

def push_channel_slices(block: ir.Block) -> None:
    """Compute each channel-sliced gradient from sliced operands (see the module docstring)."""
    ops = [op.operation for op in block.operations]
    wanted: dict[ir.Value, list] = {}  # value -> the Slice (or None: whole) each use so far wants
    demand: dict[ir.Value, Slice] = {}  # values computed sliced, by the slice every use wants
    operand_slices: dict[ir.Operation, list] = {}

    def want(value, s):
        wanted.setdefault(value, []).append(s)

    # Uses come after definitions, so walking backwards sees every use of a value before it.
    for op in reversed(ops):
        if op.name == "pock.channel_slice":
            want(op.operands[0], Slice(0, ir.IntegerAttr(op.attributes["channels"]).value))
            continue
        slices = None
        if len(op.results) == 1 and tensor_type_of(op.results[0]) is not None:
            result = op.results[0]
            uses = wanted.get(result, [])
            rule = facts_of(op).slices
            if (rule and uses and uses[0] is not None and all(u == uses[0] for u in uses)
                    and len(uses) == len(list(result.uses)) and _constant_operands(op)):
                slices = rule(op, uses[0])
                if slices is not None:
                    demand[result] = uses[0]
                    operand_slices[op] = slices
        for i, operand in enumerate(op.operands):
            want(operand, slices[i] if slices else None)
    if not demand:
        return

    sliced: dict[ir.Value, ir.Value] = {}
    explicit: dict[tuple[ir.Value, Slice], ir.Value] = {}

    def slice_of(value: ir.Value, s: Slice) -> ir.Value:
        if value in demand:
            return sliced[value]
        if (value, s) not in explicit:  # one slice after the definition serves every user
            owner = value.owner
            ip = ir.InsertionPoint.at_block_begin(block) if isinstance(owner, ir.Block) else ir.InsertionPoint.after(owner)
            b = TorchBuilder(ip, value.location if isinstance(owner, ir.Block) else owner.location)
            explicit[(value, s)] = b.aten.slice.Tensor(value, s.dim, 0, s.size, 1)
        return explicit[(value, s)]

    for op in ops:
        if op.name == "pock.channel_slice" and op.operands[0] in demand:
            op.results[0].replace_all_uses_with(sliced[op.operands[0]])
            continue
        if op not in operand_slices:
            continue
        operands = [v if s is None else slice_of(v, s) for v, s in zip(op.operands, operand_slices[op])]
        sliced[op.results[0]] = _rebuild(TorchBuilder(ir.InsertionPoint(op), op.location), op, operands,
                                         demand[op.results[0]])


# -- config: re-annotating a training-stage module --------------------------------------------

# Update ops take (param, grad, *state, [step]) and return (new param, *new state).
def _param_name(value: ir.Value) -> str | None:
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "pock.param":
        return None
    return param_name(owner)


def _channel_slice(ip, loc, result_type, value, channels: int) -> ir.Value:
    return ChannelSliceOp(value, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), channels), result_type,
                          loc=loc, ip=ip).result


def _channel_update(ip, loc, param, update) -> ir.Value:
    return ChannelUpdateOp(param, update, param.type, loc=loc, ip=ip).result


def _narrow_update(update, grad, k: int) -> None:
    """Run `update` on the first k channels of its parameter and state, writing them back."""
    ip, loc = ir.InsertionPoint(update), update.location
    slots = UPDATE_OPS[update.name].state_slots
    operands = list(update.operands)
    full = operands[:2 + slots]
    slice_type = grad.type
    narrowed = [_channel_slice(ip, loc, slice_type, v, k) for v in (full[0], *full[2:])]
    attributes = {name: update.attributes[name] for name in update.attributes}
    new = ir.Operation.create(update.name, results=[slice_type] * (1 + slots),
                              operands=[narrowed[0], grad, *narrowed[1:], *operands[2 + slots:]],
                              attributes=attributes, loc=loc, ip=ip)
    for old_result, base, new_result in zip(update.results, (full[0], *full[2:]), new.results):
        old_result.replace_all_uses_with(_channel_update(ip, loc, base, new_result))
    update.erase()


def _freeze_update(update) -> None:
    """The parameter and state come out unchanged."""
    slots = UPDATE_OPS[update.name].state_slots
    operands = list(update.operands)
    for old_result, unchanged in zip(update.results, [operands[0], *operands[2:2 + slots]]):
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
        raise PassError(f"'{name}' already has a {_rows(grad_shape)}-channel gradient in the input, the config asks "
                        f"for {k}; apply config to a module built with every parameter in full", grad_op.location)
    b = TorchBuilder(ir.InsertionPoint(grad_op), grad_op.location)
    grad = None
    if k:
        grad_type = ir.Type.parse(TensorType((k,) + param_shape[1:], tensor_type_of(param).dtype).asm())
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
        result.replace_all_uses_with(
            _channel_update(b.ip, grad_op.location, zeros, grad) if k else zeros)
    grad_op.erase()


def reannotate(module: ir.Operation, config: str) -> None:
    """Apply the sparse scheme in `config` to the training functions of `module`."""
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
                raise PassError(f"config {config}: '{name}' is frozen in the input (no pock.grad, no optimizer state "
                                f"in the signature) and cannot be unfrozen by a pass; build the step with it trainable",
                                op.location)
            op.attributes["policy"] = ir.StringAttr.get(policy.kind)
            op.attributes["ratio"] = ir.FloatAttr.get(ir.F64Type.get(), policy.ratio)
            if name in grads:
                _reannotate_grad(grads[name], policy, name)


@dataclass(frozen=True)
class SparseBackpropPass(ModulePass):
    name = "pock-sparse-bp"
    description = ("Compute channel-sparse gradients from sliced operands and erase every backward op no kept "
                   "gradient needs; config=FILE first applies a sparse scheme to a training-stage module")
    config: str = option("", "YAML/JSON sparse scheme to apply to pock.param/pock.grad/update ops before "
                             "pock-autodiff (signatures unchanged)")

    def apply(self, module: ir.Operation) -> None:
        if self.config:
            reannotate(module, self.config)
        for func in functions(module):
            for block in func.regions[0].blocks:
                erase_dead_ops(block)  # a dead use (an unneeded input gradient) would keep a value whole
                push_channel_slices(block)
                erase_dead_ops(block)
