"""Each optimizer is one file registering its update op's state slots and lowering; the passes
ask that registry. Every optimizer's emitted op is registered with the slots it declares, and
pock-lower-optimizers then leaves plain torch dialect. (The trajectories against torch.optim are
in test_mlp.py and test_sparse.py.)"""

import dataclasses
import math
import struct

import pytest
import torch
from pock_mlir.passes import run_pipeline
from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.context import make_context
from pock_mlir.optim import OPTIMIZERS, SGD, UPDATE_OPS, AdamW, OrtAdamW, parse_optimizer

TENSOR = "!torch.vtensor<[4,3],f32>"


@pytest.mark.parametrize(
    "optimizer",
    [SGD(lr=0.1), SGD(lr=0.1, momentum=0.9, nesterov=True), AdamW(lr=1e-3), OrtAdamW(lr=1e-3)],
    ids=["sgd", "sgd_momentum", "adamw", "ort_adamw"],
)
def test_each_update_op_is_registered_with_its_slots_and_lowers(optimizer):
    slots = len(optimizer.state_slots)
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        tensor, step = ir.Type.parse(TENSOR), ir.Type.parse("!torch.vtensor<[],f32>")
        with ir.InsertionPoint(module.body):
            function = func.FuncOp("update", ([tensor] * (2 + slots) + [step], [tensor] * (1 + slots)))
        entry = function.add_entry_block()
        param, grad, *state, count = entry.arguments
        ip = ir.InsertionPoint(entry)
        new_param, new_state = optimizer.emit(ip, ir.Location.unknown(), param, grad, list(state), count)
        func.ReturnOp([new_param, *new_state], ip=ip)
        (update,) = [op.operation for op in entry.operations if op.operation.name.startswith("pock.")]
        assert UPDATE_OPS[update.name].state_slots == slots == len(new_state)
        assert module.operation.verify()
        run_pipeline(module, "pock-lower-optimizers,pock-strip-params,canonicalize")
        assert "pock." not in str(module)


def test_parse_optimizer_knows_every_registered_optimizer():
    assert set(OPTIMIZERS) == {"sgd", "adamw", "ort_adamw"}
    assert parse_optimizer("sgd:lr=0.5,momentum=0.9") == SGD(lr=0.5, momentum=0.9)
    assert parse_optimizer("adamw:lr=1e-3,betas=0.8/0.9") == AdamW(lr=1e-3, betas=(0.8, 0.9))
    with pytest.raises(
        ValueError, match="unknown optimizer 'rmsprop'; use sgd:lr=... or adamw:lr=... or ort_adamw:lr=..."
    ):
        parse_optimizer("rmsprop:lr=1")


def update_op_text(optimizer_class, **hyperparameters) -> str:
    """A function of the update op the optimizer's emit() would create for `hyperparameters`
    (unchecked: written as a user of pock-opt writes IR)."""
    fields = {f.name: f.default for f in dataclasses.fields(optimizer_class)} | hyperparameters

    def f64(name):  # the same double in MLIR's syntax: decimal, or its bits where it is not finite
        value = float(fields[name])
        literal = f"{value:.17e}" if math.isfinite(value) else f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:X}"
        return f"{name} = {literal} : f64"

    step = "!torch.vtensor<[],f32>"
    if optimizer_class in (AdamW, OrtAdamW):
        fields["beta1"], fields["beta2"] = fields["betas"]
        name, operands, results = "pock.adamw" if optimizer_class is AdamW else "pock.ort_adamw", 4, 3
        attributes = [f64(n) for n in ("lr", "beta1", "beta2", "eps", "weight_decay")]
    elif fields["momentum"]:
        name, operands, results = "pock.sgd_momentum", 3, 2
        attributes = [
            *(f64(n) for n in ("lr", "momentum", "dampening", "weight_decay")),
            f"nesterov = {str(fields['nesterov']).lower()}",
        ]
    else:
        name, operands, results = "pock.sgd", 2, 1
        attributes = [f64("lr"), f64("weight_decay")]
    stepped = name != "pock.sgd"
    arguments = ", ".join(["%w"] * operands + ["%step"] * stepped)
    types = ", ".join([TENSOR] * operands + [step] * stepped)
    return (
        f"func.func @update(%w: {TENSOR}, %step: {step}) {{\n"
        f'  %n:{results} = "{name}"({arguments}) {{{", ".join(attributes)}}} : ({types}) -> '
        f"({', '.join([TENSOR] * results)})\n  return\n}}"
    )


def verifier_errors(text: str) -> list[str]:
    """What the pock dialect's verifiers say of `text` (none when it verifies)."""
    with make_context():
        try:
            ir.Module.parse(text)
        except ir.MLIRError as e:
            return [str(d.message) for d in e.error_diagnostics]
    return []


@pytest.mark.parametrize(
    "optimizer_class, hyperparameters",
    [
        (SGD, dict(lr=0.0)),
        (SGD, dict(lr=0.1, weight_decay=-0.01)),
        (SGD, dict(lr=-0.1, momentum=0.9)),
        (SGD, dict(lr=0.1, momentum=-0.5)),
        (SGD, dict(lr=0.1, momentum=0.9, weight_decay=-1.0)),
        (SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)),
        (SGD, dict(lr=math.inf)),
        (AdamW, dict(lr=0.0)),
        (AdamW, dict(eps=0.0)),
        (AdamW, dict(betas=(1.0, 0.999))),
        (AdamW, dict(betas=(0.9, -0.5))),
        (AdamW, dict(weight_decay=-0.01)),
        (OrtAdamW, dict(eps=0.0)),
        (OrtAdamW, dict(betas=(0.9, 1.0))),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else ",".join(f"{k}={x}" for k, x in v.items()),
)
def test_a_hyperparameter_out_of_range_is_refused_alike_by_the_python_api_and_the_verifier(
    optimizer_class, hyperparameters
):
    """One check per optimizer (its constructor), which the update op's verifier calls: the
    message pock-opt gives for the op is the one the Python API raises."""
    with pytest.raises(ValueError) as refused:
        optimizer_class(**hyperparameters)
    op = update_op_text(optimizer_class, **hyperparameters).split('"')[1]
    assert verifier_errors(update_op_text(optimizer_class, **hyperparameters)) == [f"'{op}' op {refused.value}"]


@pytest.mark.parametrize(
    "hyperparameters",
    [dict(momentum=1.5), dict(momentum=0.9, dampening=1.5), dict(momentum=0.9, dampening=-0.5)],
    ids=str,
)
def test_momentum_and_dampening_take_what_torch_optim_sgd_takes(hyperparameters):
    """torch.optim.SGD checks momentum >= 0 and not dampening; the lowering computes its update for
    any (test_mlp.py compares the trajectories): the Python API, the verifier and torch agree."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, **hyperparameters)
    SGD(lr=0.1, **hyperparameters)
    assert verifier_errors(update_op_text(SGD, lr=0.1, **hyperparameters)) == []
