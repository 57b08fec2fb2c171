"""An op without a derivative rule: the error names the op, the model's source line and the
parameters whose gradients need it, and freezing those parameters makes the model compile."""

import pytest
import torch
import torch.nn as nn
from oracle import assert_close_to_norm, torch_gradients

import pock_mlir as pock


class AtanEncoder(nn.Module):
    """aten.atan has no rule: only the encoder's gradients pass through it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.atan(self.encoder(x))  # the op without a rule
        return self.head(h)


ATAN_LINE = AtanEncoder.forward.__code__.co_firstlineno + 1


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=g), torch.tensor([0, 1, 2, 0, 1, 2])


def test_missing_rule_names_op_model_line_and_parameters():
    x, y = batch()
    with pytest.raises(pock.CompileError) as info:
        pock.compile_training(AtanEncoder(), x, y)
    message = str(info.value)
    assert "no derivative rule for torch.aten.atan" in message
    assert f"test_autodiff_errors.py:{ATAN_LINE}" in message
    assert "the gradients of encoder.weight, encoder.bias need it" in message
    assert "head." not in message
    assert "Freeze these parameters" in message


def test_model_compiles_with_those_parameters_frozen():
    x, y = batch()
    model = AtanEncoder()
    program = pock.compile_training(
        model,
        x,
        y,
        sparse={"head": "full"},  # unnamed parameters stay frozen
        functions=("gradients",),
    )
    assert program.signature.trainable == ["head.weight", "head.bias"]
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y, trainable={"head.weight", "head.bias"})
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)
