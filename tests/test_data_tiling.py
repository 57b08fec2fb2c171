"""IREE's data tiling, chosen per program by pock-backend-switch from the host's measured flag
study: a step without convolutions whose matmuls are large is data-tiled, and trains as
torch.optim does; so is one whose matmuls do not fit the plain code's tile (260 rows, a ViT's
4 x 65 tokens); a small aligned one stays plain. The rule's cases are in
lit_tests/passes/pock-backend-switch.mlir."""

import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from oracle import assert_gradients_close, assert_trajectory_close, torch_gradients
from pock_mlir.targets import DATA_TILING

STEPS = 5
OPTIMIZER = pock.AdamW(lr=1e-3, weight_decay=0.01)


def make_mlp(width: int):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, 10))


def make_batch(rows: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 256, generator=g), torch.randint(0, 10, (rows,), generator=g)


@pytest.fixture(scope="module")
def wide():
    """Its first matmul is 2 x 1024 x 256 x 512 = 268 MFLOP, over the rule's 100."""
    model, (x, y) = make_mlp(512), make_batch(1024)
    return model, x, y, pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER)


def test_a_large_matmul_step_is_data_tiled(wide):
    *_, program = wide
    form, reason = program.data_tiling
    assert form == "data-tiled" and "matmuls carry most of the FLOPs, largest matmul 268 MFLOP" in reason, reason
    assert DATA_TILING in program.iree_flags()
    assert "matmuls: data-tiled (matmuls carry most of the FLOPs" in program.backend_report()


def test_data_tiled_step_matches_autograd_and_torch_optim(wide):
    model, x, y, program = wide
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, want)
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    assert_trajectory_close(losses, trainer.state_dict(), model, x, y, OPTIMIZER, STEPS)


def test_a_small_matmul_step_stays_plain():
    model, (x, y) = make_mlp(32), make_batch(8)
    program = pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, functions=())
    form, reason = program.data_tiling
    assert form == "plain" and "under 100" in reason, reason
    assert not any(flag.startswith(DATA_TILING) for flag in program.iree_flags())



def test_a_step_of_untiled_rows_is_data_tiled_and_matches_autograd():
    model, (x, y) = make_mlp(32), make_batch(260)
    program = pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, functions=())
    form, reason = program.data_tiling
    assert form == "data-tiled" and "100% of matmul FLOPs have a dimension not a multiple of 8" in reason, reason
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, want)
