"""Losses written as for PyTorch compile unchanged: the model and the loss see the batch in the
dtypes the user gave (int64 class indices and token ids), the device takes int32 (#18)."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pock_mlir as pock
from oracle import assert_close_to_norm


class TokenModel(nn.Module):
    """Embedding lookup of int64 token ids, as language models do."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, ids):
        assert ids.dtype == torch.int64  # what eager PyTorch would give it
        return self.head(torch.tanh(self.embed(ids)))


def class_loss(out, y):
    return F.cross_entropy(out, y)  # no .long(): y is the user's int64


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100)


CASES = {
    "classes": (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)),
                lambda g: (torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)), class_loss),
    "tokens": (TokenModel,
               lambda g: (torch.randint(0, 11, (2, 5), generator=g), torch.randint(0, 11, (2, 5), generator=g)),
               token_loss),
}


@pytest.mark.parametrize("case", CASES)
def test_a_pytorch_loss_on_int64_targets_compiles_and_matches_autograd(case):
    make_model, make_batch, loss = CASES[case]
    torch.manual_seed(0)
    model = make_model()
    x, y = make_batch(torch.Generator().manual_seed(1))
    assert y.dtype == torch.int64
    program = pock.compile_training(model, x, y, loss=loss)
    assert program.signature.target.dtype == "int32"  # the device's side of the boundary
    got_loss, grads = program.trainer().gradients(x, y)
    want = loss(model(x), y)
    want.backward()
    assert got_loss == pytest.approx(want.item(), rel=1e-5)
    for name, p in model.named_parameters():
        assert_close_to_norm(grads[name], p.grad.numpy(), 1e-5, name)
    assert np.isfinite(program.trainer().step(x.numpy(), y.numpy()))  # numpy's int64 too
