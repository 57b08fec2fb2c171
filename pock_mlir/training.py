"""Building the training program in pock IR around the imported forward_loss function: the
functions train_step, gradients, loss and loss_train, whose arguments and results are laid out as
pock_mlir/abi.py says (evaluate and evaluate_train come from the frontend, train_step_into from
pock-step-into). loss runs the eval-mode forward (ImportedModel.eval_function), the others the
forward in the mode the model was compiled in.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.abi import (
    FORWARD_LOSS,
    GRADIENTS,
    LOSS,
    LOSS_TRAIN,
    TRAIN_STEP,
    Policy,
    Slot,
    StepSignature,
    TensorSpec,
    layout,
)
from pock_mlir.dialects.pock import ChannelSliceOp, ChannelUpdateOp, GradOp, ParamOp
from pock_mlir.frontend import ImportedModel
from pock_mlir.passes.base import function_named
from pock_mlir.torch_builder import TorchBuilder
from pock_mlir.torch_types import TensorType

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _slot_type(slot: Slot) -> ir.Type:
    return _tensor_type(slot.spec)


def _tensor_type(spec: TensorSpec, shape=None) -> ir.Type:
    dtype = getattr(torch, spec.dtype)
    return ir.Type.parse(TensorType.of(spec.shape if shape is None else shape, dtype).asm())


def _mark_params(signature: StepSignature, args, ip, loc):
    marked = []
    for spec, value in zip(signature.params, args):
        policy = signature.policies.get(spec.name, Policy())
        marked.append(
            ParamOp(
                value,
                ir.StringAttr.get(spec.name),
                ir.StringAttr.get(policy.kind),
                ir.FloatAttr.get(ir.F64Type.get(), policy.ratio),
                value.type,
                loc=loc,
                ip=ip,
            ).result
        )
    return marked


def _grads(signature: StepSignature, loss, marked, ip, loc):
    grads = {}
    for spec, value in zip(signature.params, marked):
        if spec.name in signature.trainable:
            grad_type = _tensor_type(spec, signature.trainable_shape(spec.name))
            grads[spec.name] = GradOp(loss, value, grad_type, loc=loc, ip=ip).grad
    return grads


def _call_forward_loss(forward_loss, params, buffers, batch, ip):
    """(loss, [updated buffers...]); batch: the inputs, then the target. (Its last result,
    evaluate's output, is dead code here.)"""
    results = func.CallOp(forward_loss, list(params) + list(buffers) + list(batch), ip=ip).results
    return results[0], list(results[1:-1])


def build_training_functions(
    imported: ImportedModel, optimizer, policies: dict[str, Policy], adapters=(), quantized=()
) -> StepSignature:
    """Add train_step, gradients and loss to the imported module (in its context)."""
    trainable = [p.name for p in imported.params if policies.get(p.name, Policy()).kind != "frozen"]
    if not trainable:
        raise ValueError("every parameter is frozen: there is nothing to train")
    signature = StepSignature(
        params=imported.params,
        buffers=imported.buffers,
        updated_buffers=imported.updated_buffers,
        trainable=trainable,
        state=[],
        inputs=imported.inputs,
        target=imported.target,
        output=imported.output,
        policies=dict(policies),
        by_keyword=imported.by_keyword,
        adapters=list(adapters),
        quantized=list(quantized),
        vocabularies=dict(imported.vocabularies),
        state_dict=dict(imported.state_dict),
    )
    signature.state = [
        TensorSpec(f"{name}.{slot}", signature.trainable_shape(name), "float32")
        for name in trainable
        for slot in optimizer.state_slots
    ]

    module = imported.module
    body = module.body
    forward_loss, eval_forward_loss = (
        function_named(module.operation, name) for name in (FORWARD_LOSS, imported.eval_function)
    )
    for function in (forward_loss, eval_forward_loss):
        function.attributes["sym_visibility"] = ir.StringAttr.get("private")
    loc = ir.Location.name(TRAIN_STEP)

    with loc:
        ip, args = _function(body, signature, TRAIN_STEP)
        marked = _mark_params(signature, args["params"], ip, loc)
        loss, new_buffers = _call_forward_loss(forward_loss, marked, args["buffers"], args["batch"], ip)
        b = TorchBuilder(ip, loc)
        # A step whose loss is not finite changes nothing (the Trainer then says so): its new
        # values are its old ones. The select fuses into the updates' dispatches; comparing the
        # loss itself (aten.isfinite has no lowering to linalg) leaves IREE no op of its own to
        # dispatch once for all of them, as abs(loss) <= max was (a dispatch per step). It is
        # computed where the loss is, so that pock-reorder-updates can move each select to its update.
        finite = b.aten.logical_and(b.aten.le.Scalar(loss, FLOAT32_MAX), b.aten.ge.Scalar(loss, -FLOAT32_MAX))
        grads = _grads(signature, loss, marked, ip, loc)
        *state, step = args["optimizer"]
        new_params, new_state = [], []
        state_iter = iter(state)
        by_name = dict(zip([p.name for p in signature.params], marked))
        for name in trainable:
            param, policy = by_name[name], signature.policies.get(name, Policy())
            slots = [next(state_iter) for _ in optimizer.state_slots]
            if policy.kind == "channels":
                slice_type = _tensor_type(
                    next(p for p in signature.params if p.name == name), signature.trainable_shape(name)
                )
                k = signature.trainable_shape(name)[0]
                sliced = ChannelSliceOp(
                    param, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), k), slice_type, loc=loc, ip=ip
                ).result
                updated, slot_values = optimizer.emit(ip, loc, sliced, grads[name], slots, step)
                updated = ChannelUpdateOp(param, updated, param.type, loc=loc, ip=ip).result
            else:
                updated, slot_values = optimizer.emit(ip, loc, param, grads[name], slots, step)
            new_params.append(updated)
            new_state.extend(slot_values)
        old_buffers = dict(zip([s.name for s in signature.buffers], args["buffers"]))
        results = zip(
            new_params + new_state + new_buffers + [b.add(step, 1.0)],
            [by_name[n] for n in trainable] + state + [old_buffers[n] for n in signature.updated_buffers] + [step],
        )
        func.ReturnOp([loss] + [b.aten.where.self(finite, new, old) for new, old in results], ip=ip)

        ip, args = _function(body, signature, GRADIENTS)
        marked = _mark_params(signature, args["params"], ip, loc)
        loss, _ = _call_forward_loss(forward_loss, marked, args["buffers"], args["batch"], ip)
        grads = _grads(signature, loss, marked, ip, loc)
        func.ReturnOp([loss] + [grads[n] for n in trainable], ip=ip)

        for name, forward in ((LOSS, eval_forward_loss), (LOSS_TRAIN, forward_loss)):
            ip, args = _function(body, signature, name)
            loss, _ = _call_forward_loss(forward, args["params"], args["buffers"], args["batch"], ip)
            func.ReturnOp([loss], ip=ip)
    return signature


def _function(body, signature: StepSignature, name: str) -> tuple[ir.InsertionPoint, dict[str, list[ir.Value]]]:
    """An empty function `name` laid out as pock_mlir.abi says; its entry block's insertion point
    and arguments by role."""
    arguments, results = layout(signature, name)
    with ir.InsertionPoint(body):
        function = func.FuncOp(name, ([_slot_type(s) for s in arguments], [_slot_type(s) for s in results]))
    entry = function.add_entry_block()
    by_role: dict[str, list[ir.Value]] = defaultdict(list)  # a model without buffers has none
    for slot, value in zip(arguments, entry.arguments):
        by_role[slot.role].append(value)
    return ir.InsertionPoint(entry), by_role
