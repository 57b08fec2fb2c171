"""Building the training program in pock IR around the imported forward_loss function.

Three public functions make up the compiled module; their argument order is the ABI that
the runtime and the device bundle rely on (`StepSignature`):

  train_step(params..., buffers..., opt_state..., step, inputs..., target)
      -> (loss, updated trainable params..., new opt_state..., updated buffers..., step + 1)
  gradients(params..., buffers..., inputs..., target) -> (loss, grads of trainable params...)
  evaluate(params..., buffers..., inputs...) -> output

The updated buffers are those the forward pass changes (`StepSignature.updated_buffers`: the
running statistics and batch counts of train-mode BatchNorm), in that order; `gradients` and
`evaluate` compute the same forward pass but leave the buffers as they were.

A model that draws dropout masks (dropout in training mode) has one more input after its own:
the last of `inputs...` is `seed`, an int32 scalar from which every mask of the call is hashed
(pock_mlir/dropout.py), in all three functions. The Trainer supplies it and increments it after
each step; on a device, pass a new seed per step.

Frozen parameters are arguments only; a channel-sparse parameter's gradient and optimizer
state cover its leading `channels` rows, and `pock.channel_update` writes them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.frontend import ImportedModel, TensorSpec
from pock_mlir.torch_builder import TorchBuilder
from pock_mlir.torch_types import TensorType


@dataclass(frozen=True)
class Policy:
    """How one parameter tensor is updated: full, frozen, or its first `channels` rows."""

    kind: str = "full"  # full | frozen | channels
    ratio: float = 1.0

    def channels(self, shape: tuple[int, ...]) -> int:
        if self.kind != "channels":
            return shape[0] if shape else 0
        return max(1, math.ceil(self.ratio * shape[0]))


@dataclass
class StepSignature:
    params: list[TensorSpec]
    buffers: list[TensorSpec]
    updated_buffers: list[str]  # returned by train_step after the optimizer state
    trainable: list[str]
    state: list[TensorSpec]  # named "<param>.<slot>"
    inputs: list[TensorSpec]
    target: TensorSpec
    output: TensorSpec
    policies: dict[str, Policy] = field(default_factory=dict)

    def state_argument_pairs(self) -> list[tuple[int, int]]:
        """train_step_into's (argument holding a state tensor, argument its new value is written
        into), by position: params, buffers, state, step, inputs, target, then the buffers for
        the new trainable params, state, updated buffers and step (passes/pock_step_into.py)."""
        first_read = len(self.params) + len(self.buffers)
        first_written = first_read + len(self.state) + 1 + len(self.inputs) + 1 + len(self.trainable)
        return [(first_read + k, first_written + k) for k in range(len(self.state))]

    def trainable_shape(self, name: str) -> tuple[int, ...]:
        spec = next(p for p in self.params if p.name == name)
        policy = self.policies.get(name, Policy())
        if policy.kind == "channels":
            return (policy.channels(spec.shape),) + spec.shape[1:]
        return spec.shape


def _tensor_type(spec: TensorSpec, shape=None) -> ir.Type:
    dtype = getattr(torch, spec.dtype)
    return ir.Type.parse(TensorType(tuple(spec.shape if shape is None else shape), dtype).asm())


def _mark_params(signature: StepSignature, args, ip, loc):
    marked = []
    for spec, value in zip(signature.params, args):
        policy = signature.policies.get(spec.name, Policy())
        op = ir.Operation.create("pock.param", results=[value.type], operands=[value], attributes={
            "param_name": ir.StringAttr.get(spec.name), "policy": ir.StringAttr.get(policy.kind),
            "ratio": ir.FloatAttr.get(ir.F64Type.get(), policy.ratio)}, loc=loc, ip=ip)
        marked.append(op.results[0])
    return marked


def _grads(signature: StepSignature, loss, marked, ip, loc):
    grads = {}
    for spec, value in zip(signature.params, marked):
        if spec.name in signature.trainable:
            grad_type = _tensor_type(spec, signature.trainable_shape(spec.name))
            op = ir.Operation.create("pock.grad", results=[grad_type], operands=[loss, value], loc=loc, ip=ip)
            grads[spec.name] = op.results[0]
    return grads


def _call_forward_loss(forward_loss, marked, buffers, inputs, target, ip):
    """(loss, [updated buffers...])"""
    results = func.CallOp(forward_loss, list(marked) + list(buffers) + list(inputs) + [target], ip=ip).results
    return results[0], list(results[1:])


def build_training_functions(imported: ImportedModel, optimizer, policies: dict[str, Policy]) -> StepSignature:
    """Add train_step and gradients to the imported module (in its context)."""
    trainable = [p.name for p in imported.params if policies.get(p.name, Policy()).kind != "frozen"]
    if not trainable:
        raise ValueError("every parameter is frozen: there is nothing to train")
    signature = StepSignature(
        params=imported.params, buffers=imported.buffers, updated_buffers=imported.updated_buffers,
        trainable=trainable, state=[],
        inputs=imported.inputs, target=imported.target, output=imported.output, policies=dict(policies))
    signature.state = [
        TensorSpec(f"{name}.{slot}", signature.trainable_shape(name), "float32")
        for name in trainable for slot in optimizer.state_slots]

    module = imported.module
    body = module.body
    forward_loss = next(op for op in body.operations if op.operation.name == "func.func"
                        and ir.StringAttr(op.attributes["sym_name"]).value == "forward_loss")
    forward_loss.attributes["sym_visibility"] = ir.StringAttr.get("private")
    loc = ir.Location.name("train_step")
    param_types = [_tensor_type(p) for p in signature.params]
    buffer_types = [_tensor_type(b) for b in signature.buffers]
    updated_buffer_types = [_tensor_type(b) for name in signature.updated_buffers
                            for b in signature.buffers if b.name == name]
    state_types = [_tensor_type(s) for s in signature.state]
    step_type = ir.Type.parse("!torch.vtensor<[],f32>")
    input_types = [_tensor_type(i) for i in signature.inputs]
    target_type = _tensor_type(signature.target)
    loss_type = ir.Type.parse("!torch.vtensor<[],f32>")
    n_params, n_buffers, n_state = len(param_types), len(buffer_types), len(state_types)
    trainable_specs = [p for p in signature.params if p.name in trainable]

    with ir.InsertionPoint(body), loc:
        train = func.FuncOp("train_step", (
            param_types + buffer_types + state_types + [step_type] + input_types + [target_type],
            [loss_type] + [_tensor_type(p) for p in trainable_specs] + state_types + updated_buffer_types + [step_type]))
        gradients = func.FuncOp("gradients", (
            param_types + buffer_types + input_types + [target_type],
            [loss_type] + [_tensor_type(p, signature.trainable_shape(p.name)) for p in trainable_specs]))

    entry = train.add_entry_block()
    args = list(entry.arguments)
    params, buffers = args[:n_params], args[n_params:n_params + n_buffers]
    state = args[n_params + n_buffers:n_params + n_buffers + n_state]
    step = args[n_params + n_buffers + n_state]
    inputs, target = args[n_params + n_buffers + n_state + 1:-1], args[-1]
    ip = ir.InsertionPoint(entry)
    with loc:
        marked = _mark_params(signature, params, ip, loc)
        loss, new_buffers = _call_forward_loss(forward_loss, marked, buffers, inputs, target, ip)
        grads = _grads(signature, loss, marked, ip, loc)
        new_params, new_state = [], []
        state_iter = iter(state)
        by_name = dict(zip([p.name for p in signature.params], marked))
        for name in trainable:
            param, policy = by_name[name], signature.policies.get(name, Policy())
            slots = [next(state_iter) for _ in optimizer.state_slots]
            if policy.kind == "channels":
                slice_type = _tensor_type(next(p for p in signature.params if p.name == name), signature.trainable_shape(name))
                k = signature.trainable_shape(name)[0]
                sliced = ir.Operation.create("pock.channel_slice", results=[slice_type], operands=[param], attributes={
                    "channels": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), k)}, loc=loc, ip=ip).results[0]
                updated, slot_values = optimizer.emit(ip, loc, sliced, grads[name], slots, step)
                updated = ir.Operation.create("pock.channel_update", results=[param.type], operands=[param, updated],
                                              loc=loc, ip=ip).results[0]
            else:
                updated, slot_values = optimizer.emit(ip, loc, param, grads[name], slots, step)
            new_params.append(updated)
            new_state.extend(slot_values)
        next_step = TorchBuilder(ip, loc).add(step, 1.0)
        func.ReturnOp([loss] + new_params + new_state + new_buffers + [next_step], ip=ip)

    entry = gradients.add_entry_block()
    args = list(entry.arguments)
    params, buffers = args[:n_params], args[n_params:n_params + n_buffers]
    inputs, target = args[n_params + n_buffers:-1], args[-1]
    ip = ir.InsertionPoint(entry)
    with loc:
        marked = _mark_params(signature, params, ip, loc)
        loss, _ = _call_forward_loss(forward_loss, marked, buffers, inputs, target, ip)
        grads = _grads(signature, loss, marked, ip, loc)
        func.ReturnOp([loss] + [grads[n] for n in trainable], ip=ip)
    return signature
