"""Each optimizer is one file registering its update op's state slots and lowering; the passes
ask that registry. Every optimizer's emitted op is registered with the slots it declares, and
pock-lower-optimizers then leaves plain torch dialect. (The trajectories against torch.optim are
in test_mlp.py and test_sparse.py.)"""

import pytest
from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.context import make_context
from pock_mlir.optim import OPTIMIZERS, UPDATE_OPS, AdamW, SGD, parse_optimizer
from pock_mlir.passes import run_pipeline

TENSOR = "!torch.vtensor<[4,3],f32>"


@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), SGD(lr=0.1, momentum=0.9, nesterov=True), AdamW(lr=1e-3)],
                         ids=["sgd", "sgd_momentum", "adamw"])
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
    assert set(OPTIMIZERS) == {"sgd", "adamw"}
    assert parse_optimizer("sgd:lr=0.5,momentum=0.9") == SGD(lr=0.5, momentum=0.9)
    assert parse_optimizer("adamw:lr=1e-3,betas=0.8/0.9") == AdamW(lr=1e-3, betas=(0.8, 0.9))
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'; use sgd:lr=... or adamw:lr=..."):
        parse_optimizer("rmsprop:lr=1")
