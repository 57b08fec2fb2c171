"""pock_mlir.abi is the one statement of the module's ABI: the compiled functions have exactly the
arguments and results its layout gives, and the device side loads without PyTorch."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch_mlir import ir

import pock_mlir as pock
from pock_mlir.abi import FUNCTIONS, TRAIN_STEP_INTO, layout
from pock_mlir.context import make_context

DTYPES = {"f32": "float32", "si32": "int32", "si64": "int64", "i1": "bool"}


class Net(nn.Module):
    """Buffers that train_step updates (train-mode BatchNorm), dropout (the seed input) and a
    channel-sparse parameter: every kind of argument the ABI has."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).mean((2, 3)))


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([1, 3])
    return pock.compile_training(
        Net().train(),
        x,
        y,
        optimizer=pock.AdamW(lr=1e-3),
        sparse={"conv.weight": 0.5, "default": "full", "fc.bias": "frozen"},
    )


def _spec(type_: ir.Type) -> tuple[tuple[int, ...], str]:
    shape, dtype = re.fullmatch(r"!torch\.v?tensor<\[([\d,]*)\],(\w+)>", str(type_)).groups()
    return tuple(int(d) for d in shape.split(",") if d), DTYPES[dtype]


def test_compiled_functions_have_the_layout(program):
    sig = program.signature
    assert sig.seeded and sig.updated_buffers and sig.trainable_shape("conv.weight") == (4, 3, 3, 3)
    assert "fc.bias" not in sig.trainable
    with make_context():
        module = ir.Module.parse(program.ir("lowered"))
        types = {
            ir.StringAttr(op.attributes["sym_name"]).value: ir.FunctionType(
                ir.TypeAttr(op.attributes["function_type"]).value
            )
            for op in module.body.operations
            if op.operation.name == "func.func"
        }
        for function in FUNCTIONS:
            arguments, results = layout(sig, function)
            assert [_spec(t) for t in types[function].inputs] == [(s.spec.shape, s.spec.dtype) for s in arguments], (
                function
            )
            assert [_spec(t) for t in types[function].results] == [(s.spec.shape, s.spec.dtype) for s in results], (
                function
            )


def test_written_argument_pairs_point_at_what_a_step_updates(program):
    """Each (read, written) pair of train_step_into names one tensor twice: as its role's argument
    and as the buffer its new value goes into."""
    sig = program.signature
    arguments, _ = layout(sig, TRAIN_STEP_INTO)
    pairs = sig.written_argument_pairs()
    assert len(pairs["optimizer"]) == len(sig.state) == 2 * len(sig.trainable)  # AdamW: two slots
    assert len(pairs["params"]) == len(sig.trainable) and len(pairs["buffers"]) == len(sig.updated_buffers)
    for role, role_pairs in pairs.items():
        for read, written in role_pairs:
            assert arguments[read].role == role and arguments[written].role == "into"
            assert arguments[read].spec == arguments[written].spec


def test_train_mode_loss_function_is_the_forward_loss(program):
    """Trainer.loss(train_mode=True) runs the forward-only `loss_train` function: the loss gradients
    computes (dropout masks of the same seed, batch statistics), no update."""
    trainer = program.trainer()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 3, 6, 6, generator=g), torch.tensor([0, 2])
    trainer.seed = 5
    want, _ = trainer.gradients(x, y)
    trainer.seed = 5
    before = trainer.state_dict()
    assert trainer.loss(x, y, train_mode=True) == pytest.approx(want, rel=1e-6)
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_device_side_loads_without_torch():
    code = (
        "import sys; import pock_mlir.runtime, pock_mlir.bundle, pock_mlir.checkpoint, pock_mlir.abi, "
        "pock_mlir.tools.pock_train; print(sorted(m for m in ('torch', 'torch_mlir') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
