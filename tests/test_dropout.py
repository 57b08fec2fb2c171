"""Dropout in compiled training steps: masks from the step's seed (pock_mlir/dropout.py), with
torch's statistics (keep probability 1 - p, kept values scaled by 1 / (1 - p)), fresh masks per
seed and per call, bit-identical to the same scheme run eagerly, and exact gradients."""

import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_close_to_norm, torch_gradients

import pock_mlir as pock
from pock_mlir.dropout import SeededDropout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models.transformer import BertConfig, BertLike  # noqa: E402

P, P2D = 0.2, 0.5
SHAPE = (64, 512)


class Dropouts(nn.Module):
    """Two element-wise dropouts and a channel dropout on the same values, side by side."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(SHAPE))
        self.first, self.second = nn.Dropout(P), nn.Dropout(P)
        self.channels = nn.Dropout2d(P2D)

    def forward(self, x):
        h = self.w * x
        return torch.cat([self.first(h), self.second(h), self.channels(h.view(16, 128, 4, 4)).view(SHAPE)])


def within(observed, expected, n, what):
    """`observed` is a frequency of n Bernoulli trials with mean `expected`: 5 standard deviations."""
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert abs(observed - expected) <= 5 * sigma, f"{what}: {observed:.4f}, expected {expected:.4f} +- {5 * sigma:.4f}"


@pytest.fixture(scope="module")
def dropouts():
    model = Dropouts()
    x = torch.ones(SHAPE)
    program = pock.compile_training(
        model, x, torch.zeros(3 * SHAPE[0], SHAPE[1]), loss="mse", functions=("step", "gradients")
    )  # one IREE module for both
    trainer = program.trainer()

    def masks(seed):
        trainer.seed = seed
        out = trainer.evaluate(x, train_mode=True)
        return out[: SHAPE[0]], out[SHAPE[0] : 2 * SHAPE[0]], out[2 * SHAPE[0] :]

    return model, x, program, trainer, masks


def test_seed_is_the_last_input(dropouts):
    _, _, program, _, _ = dropouts
    assert [(s.name, s.shape, s.dtype) for s in program.signature.inputs] == [
        ("input0", SHAPE, "float32"),
        ("seed", (), "int32"),
    ]


def test_keep_probability_and_scale_match_torch(dropouts):
    _, x, _, _, masks = dropouts
    torch_kept = F.dropout(x, P)  # torch's own dropout, for its scale
    scale = torch_kept[torch_kept != 0][0].item()
    n = int(np.prod(SHAPE))
    for seed in (0, 1, 12345):
        first, second, _ = masks(seed)
        for out in (first, second):
            kept = out != 0
            np.testing.assert_allclose(out[kept], scale, rtol=1e-6)
            within(kept.mean(), 1 - P, n, f"keep fraction, seed {seed}")
        assert out.mean() == pytest.approx(1.0, abs=5 * np.sqrt(P / (1 - P) / n))  # unbiased, as in torch


def test_masks_are_independent_across_seeds_and_calls(dropouts):
    _, _, _, _, masks = dropouts
    n = int(np.prod(SHAPE))
    agree = P * P + (1 - P) * (1 - P)  # how often two independent masks agree
    first0, second0, _ = masks(0)
    first1, _, _ = masks(1)
    firstbig, _, _ = masks(2**31 + 7)
    within(((first0 != 0) == (first1 != 0)).mean(), agree, n, "seeds 0 and 1")
    within(((first0 != 0) == (firstbig != 0)).mean(), agree, n, "seeds 0 and 2**31 + 7")
    within(((first0 != 0) == (second0 != 0)).mean(), agree, n, "two dropouts in one step")
    np.testing.assert_array_equal(masks(0)[0], first0)  # the same seed gives the same masks


def test_channel_dropout_drops_whole_channels(dropouts):
    _, _, _, _, masks = dropouts
    channels = masks(3)[2].reshape(16, 128, 16)
    assert np.all(channels.min(-1) == channels.max(-1))  # one decision per (sample, channel)
    within((channels[..., 0] != 0).mean(), 1 - P2D, 16 * 128, "channel keep fraction")


def test_compiled_masks_equal_the_eager_scheme(dropouts):
    model, x, _, _, masks = dropouts
    with SeededDropout(torch.tensor(77, dtype=torch.int32)):
        want = model(x).detach().numpy()
    got = np.concatenate(masks(77))
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_each_step_draws_fresh_masks(dropouts):
    _, x, _, trainer, _ = dropouts
    target = np.zeros((3 * SHAPE[0], SHAPE[1]), np.float32)
    trainer.seed = 5
    _, before = trainer.gradients(x, target)
    trainer.step(x, target)
    assert trainer.seed == 6
    trainer.seed = 5
    _, again = trainer.gradients(x, target)
    np.testing.assert_array_equal(before["w"] == 0, again["w"] == 0)  # w itself moved: compare the masks
    trainer.seed = 6
    _, after = trainer.gradients(x, target)
    assert not np.array_equal(before["w"] == 0, after["w"] == 0)


class StochasticDepths(nn.Module):
    """Stochastic depth as the libraries draw it (Tensor.bernoulli_ on a fresh tensor): torchvision's
    per-sample and per-batch StochasticDepth and timm's DropPath, on ROWS samples side by side."""

    def __init__(self):
        import timm
        import torchvision

        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.drops = nn.ModuleList(
            [
                torchvision.ops.StochasticDepth(P, "row"),
                torchvision.ops.StochasticDepth(P, "batch"),
                timm.layers.DropPath(P),
            ]
        )

    def forward(self, x):
        return torch.cat([drop(self.w * x) for drop in self.drops])


ROWS = 4096


@pytest.fixture(scope="module")
def stochastic_depths():
    model, x = StochasticDepths(), torch.ones(ROWS, 4)
    program = pock.compile_training(model, x, torch.zeros(3 * ROWS, 4), loss="mse", functions=("gradients",))
    return model, x, program.trainer()


def test_stochastic_depth_drops_whole_samples_with_torchs_probability_and_scale(stochastic_depths):
    _, x, trainer = stochastic_depths
    for seed in (0, 1):
        trainer.seed = seed
        row, batch, drop_path = np.split(trainer.evaluate(x, train_mode=True), 3)
        for out in (row, drop_path):
            assert np.all(out.min(-1) == out.max(-1))  # one decision per sample
            kept = out[:, 0] != 0
            np.testing.assert_allclose(out[kept], 1 / (1 - P), rtol=1e-6)  # torch's scale
            within(kept.mean(), 1 - P, ROWS, f"sample keep fraction, seed {seed}")
        assert np.all(batch == 0) or np.allclose(batch, 1 / (1 - P), rtol=1e-6)  # all or nothing
    trainer.seed = 0
    first = np.split(trainer.evaluate(x, train_mode=True), 3)
    trainer.seed = 1
    second = np.split(trainer.evaluate(x, train_mode=True), 3)
    within(((first[0] != 0) == (second[0] != 0))[:, 0].mean(), P * P + (1 - P) ** 2, ROWS, "seeds 0 and 1")
    within(((first[0] != 0) == (first[2] != 0))[:, 0].mean(), P * P + (1 - P) ** 2, ROWS, "two calls in one step")


def test_stochastic_depth_masks_equal_the_eager_scheme(stochastic_depths):
    model, x, trainer = stochastic_depths
    trainer.seed = 77
    with SeededDropout(torch.tensor(77, dtype=torch.int32)) as dropout:
        want = model(x).detach().numpy()
    assert dropout.calls == 3
    got = trainer.evaluate(x, train_mode=True)
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_eval_mode_has_no_dropout_and_no_seed():
    model = Dropouts().eval()
    x = torch.randn(SHAPE)
    program = pock.compile_training(model, x, torch.zeros(3 * SHAPE[0], SHAPE[1]), loss="mse")
    assert [s.name for s in program.signature.inputs] == ["input0"]
    np.testing.assert_allclose(program.trainer().evaluate(x), model(x).detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "op,noise",
    [
        ("randn", lambda x: torch.randn_like(x)),
        ("bernoulli", lambda x: torch.empty_like(x).bernoulli_(torch.full_like(x, 0.5))),
    ],
    ids=["randn_like", "bernoulli_of_a_probability_tensor"],
)
def test_other_random_ops_are_an_error_naming_the_line(op, noise):
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x + noise(x))  # the line the error names

    line = Noisy.forward.__code__.co_firstlineno + 1
    with pytest.raises(pock.FrontendError, match=rf"{op}.*test_dropout.py:{line}\).*draws random numbers"):
        pock.compile_training(Noisy(), torch.randn(3, 4), torch.tensor([0, 1, 0]))


def bert_with_dropout():
    """SDPA's dropout_p and nn.Dropout."""
    torch.manual_seed(0)
    model = BertLike(BertConfig(vocab=32, max_len=8, dim=16, heads=2, layers=1, hidden=32, classes=3, dropout=0.2))
    ids = torch.randint(1, 32, (4, 8), generator=torch.Generator().manual_seed(1))
    ids[1, 5:] = 0
    return model, ids, torch.tensor([0, 2, 1, 1]), "cross_entropy"


def torch_encoder_layer():
    """nn.MultiheadAttention's internal dropout, reached through torch.nn.functional."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g), "mse"


def swin_with_drop_path():
    """timm's Swin Transformer with stochastic depth (drop_path_rate, 0.1 by default) and shifted
    windows (torch.roll) in each stage's second block."""
    import timm

    torch.manual_seed(0)
    model = timm.models.SwinTransformer(
        img_size=32,
        patch_size=4,
        window_size=4,
        embed_dim=16,
        depths=(2, 2),
        num_heads=(2, 2),
        num_classes=3,
        drop_path_rate=0.3,
    )
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(2, 3, 32, 32, generator=g), torch.tensor([0, 2]), "cross_entropy"


@pytest.mark.parametrize(
    "make", [bert_with_dropout, torch_encoder_layer, swin_with_drop_path], ids=lambda f: f.__name__
)
def test_gradients_with_dropout_match_autograd(make):
    model, x, target, loss_fn = make()
    trainer = pock.compile_training(model, x, target, loss=loss_fn, functions=("gradients",)).trainer()
    trainer.seed = 9
    loss, grads = trainer.gradients(x, target)
    with SeededDropout(torch.tensor(9, dtype=torch.int32)) as dropout:
        want_loss, want = torch_gradients(model, x, target, loss=loss_fn)
    assert dropout.calls > 0
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for n in want:
        assert_close_to_norm(grads[n], want[n], 1e-4, n)
