"""Derivative rules for CNN ops, one table row per op spec, against torch.autograd.

Each row applies a small module (a conv with given stride, padding, dilation and groups, a
pooling layer, an activation, a batch norm, ...) to its own input, which is a parameter so that
the input gradient is checked along with the module's weights. The rows of a group are summed,
each weighted by a fixed cotangent, into one scalar: a group compiles once and every row's
gradients are checked separately.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_close_to_norm, torch_gradients

import pock_mlir as pock

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on even kernels

B = 2


class Fn(nn.Module):
    """A function of the row's input as a module."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, 2, 1), nn.Conv2d(2, channels, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


def frozen_batch_norm(channels):
    """Eval-mode BatchNorm2d with running statistics away from their defaults."""
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return bn.eval()


@dataclass(frozen=True)
class Case:
    name: str
    op: Callable[[], nn.Module]
    shape: tuple  # the row's input, batch first
    scale: float = 1.0  # of the input: wide enough to reach every piece of a piecewise activation


GROUPS = {
    "conv2d": [
        Case("conv3x3", lambda: nn.Conv2d(4, 6, 3, padding=1), (B, 4, 7, 7)),
        Case("conv3x3_stride2", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1), (B, 4, 8, 8)),
        Case("conv3x3_stride2_odd_no_padding", lambda: nn.Conv2d(4, 6, 3, stride=2, bias=False), (B, 4, 9, 9)),
        Case("conv1x1_stride2_downsample", lambda: nn.Conv2d(4, 6, 1, stride=2, bias=False), (B, 4, 7, 7)),
        Case("conv7x7_stride2_stem", lambda: nn.Conv2d(3, 4, 7, stride=2, padding=3, bias=False), (B, 3, 12, 12)),
        Case("conv5x5_stride3", lambda: nn.Conv2d(3, 4, 5, stride=3, padding=1), (B, 3, 11, 11)),
        Case("conv_dilation2", lambda: nn.Conv2d(4, 5, 3, padding=2, dilation=2), (B, 4, 9, 9)),
        Case(
            "conv_rectangular",
            lambda: nn.Conv2d(4, 5, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(2, 1)),
            (B, 4, 9, 8),
        ),
        Case("conv_padding_beyond_kernel", lambda: nn.Conv2d(4, 5, 3, padding=3), (B, 4, 5, 5)),
        Case("conv_padding_same_even_kernel", lambda: nn.Conv2d(4, 5, 4, padding="same"), (B, 4, 6, 6)),
        Case("conv_groups2", lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), (B, 4, 7, 7)),
        Case("conv_groups2_stride2", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (B, 4, 7, 7)),
    ],
    "depthwise_and_conv1d": [
        Case("depthwise3x3", lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False), (B, 6, 7, 7)),
        Case("depthwise3x3_stride2", lambda: nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6), (B, 6, 8, 8)),
        Case(
            "depthwise5x5_stride2", lambda: nn.Conv2d(4, 4, 5, stride=2, padding=2, groups=4, bias=False), (B, 4, 9, 9)
        ),
        Case("depthwise7x7_dilation2", lambda: nn.Conv2d(4, 4, 7, padding=6, dilation=2, groups=4), (B, 4, 8, 8)),
        Case("depthwise_multiplier2", lambda: nn.Conv2d(4, 8, 3, padding=1, groups=4), (B, 4, 6, 6)),
        Case("depthwise1x1_stride2", lambda: nn.Conv2d(6, 6, 1, stride=2, groups=6), (B, 6, 7, 7)),  # FastViT's
        Case("conv1d", lambda: nn.Conv1d(4, 6, 3, padding=1), (B, 4, 10)),
        Case("conv1d_stride2_dilation2", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2), (B, 4, 11)),
        Case("conv1d_depthwise", lambda: nn.Conv1d(4, 4, 5, padding=2, groups=4), (B, 4, 10)),
        Case("conv1d_groups2_no_bias", lambda: nn.Conv1d(4, 6, 3, stride=2, groups=2, bias=False), (B, 4, 10)),
        Case(
            "conv_transpose_stride2",
            lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
            (B, 4, 5, 5),
        ),
        Case("conv_transpose_2x2_upsampling", lambda: nn.ConvTranspose2d(4, 3, 2, stride=2, bias=False), (B, 4, 4, 4)),
        Case(
            "conv_transpose_groups_dilation",
            lambda: nn.ConvTranspose2d(4, 6, 3, padding=2, dilation=2, groups=2),
            (B, 4, 5, 6),
        ),
        Case("conv_transpose1d", lambda: nn.ConvTranspose1d(4, 5, 4, stride=2, padding=1), (B, 4, 9)),
    ],
    "pooling": [
        Case("max_pool3x3_stride2", lambda: nn.MaxPool2d(3, 2, 1), (B, 4, 8, 8)),
        Case("max_pool2x2_ceil_mode", lambda: nn.MaxPool2d(2, ceil_mode=True), (B, 4, 7, 7)),
        Case("max_pool_dilation2", lambda: nn.MaxPool2d(3, 1, 1, dilation=2), (B, 3, 6, 6)),
        Case("max_pool1d", lambda: nn.MaxPool1d(3, 2), (B, 4, 11)),
        Case("avg_pool3x3_stride2", lambda: nn.AvgPool2d(3, 2, 1), (B, 4, 8, 8)),
        Case("avg_pool_exclude_padding", lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), (B, 4, 8, 8)),
        Case(
            "avg_pool_ceil_mode", lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (B, 4, 8, 8)
        ),
        Case("avg_pool_divisor_override", lambda: nn.AvgPool2d(2, divisor_override=3), (B, 4, 6, 6)),
        Case("avg_pool1d", lambda: nn.AvgPool1d(2), (B, 4, 9)),
        Case("adaptive_avg_pool_1", lambda: nn.AdaptiveAvgPool2d(1), (B, 4, 5, 5)),
        Case("adaptive_avg_pool_divisible", lambda: nn.AdaptiveAvgPool2d(2), (B, 4, 6, 6)),
        Case("adaptive_max_pool_1", lambda: nn.AdaptiveMaxPool2d(1), (B, 4, 5, 5)),
        Case("adaptive_max_pool_divisible", lambda: nn.AdaptiveMaxPool2d((2, 3)), (B, 4, 4, 6)),
        Case("upsample_nearest_2x", lambda: nn.Upsample(scale_factor=2), (B, 4, 3, 3)),
        Case("upsample_nearest_1_5x", lambda: nn.Upsample(scale_factor=1.5), (B, 4, 4, 4)),
        Case("upsample_nearest_to_size", lambda: nn.Upsample(size=(7, 5)), (B, 4, 4, 4)),
        Case("downsample_nearest_to_size", lambda: nn.Upsample(size=(3, 2)), (B, 4, 7, 5)),
        Case("flatten", lambda: nn.Flatten(), (B, 4, 3, 3)),
        Case("zero_pad_asymmetric", lambda: nn.ZeroPad2d((1, 2, 0, 3)), (B, 4, 5, 5)),
    ],
    "activations_and_blocks": [
        Case("relu", lambda: nn.ReLU(), (B, 4, 5, 5)),
        Case("relu6", lambda: nn.ReLU6(), (B, 4, 5, 5), 4.0),
        Case("hardtanh", lambda: nn.Hardtanh(-1.0, 2.0), (B, 4, 5, 5), 2.0),
        Case("hardswish", lambda: nn.Hardswish(), (B, 4, 5, 5), 4.0),
        Case("hardsigmoid", lambda: nn.Hardsigmoid(), (B, 4, 5, 5), 4.0),
        Case("silu", lambda: nn.SiLU(), (B, 4, 5, 5), 2.0),
        Case("sigmoid", lambda: nn.Sigmoid(), (B, 4, 5, 5), 2.0),
        Case("leaky_relu", lambda: nn.LeakyReLU(0.1), (B, 4, 5, 5)),
        Case("elu", lambda: nn.ELU(0.7), (B, 4, 5, 5), 2.0),
        Case("selu_celu", lambda: Fn(lambda x: F.selu(x) + F.celu(x, 0.5)), (B, 4, 5, 5), 2.0),
        Case("clamp_min_max", lambda: Fn(lambda x: x.clamp(-0.5, 1.0) + x.clamp(min=0.2)), (B, 4, 5, 5)),
        Case("residual_add", lambda: Fn(lambda x: x + F.relu6(x * 3)), (B, 4, 5, 5)),
        Case("concatenation", lambda: Fn(lambda x: torch.cat([x, F.silu(x), x[:, :2] * 2], 1)), (B, 4, 5, 5)),
        Case("squeeze_excitation", lambda: SqueezeExcitation(4), (B, 4, 5, 5)),
    ],
    "batch_norm": [
        Case("batch_norm_train", lambda: nn.BatchNorm2d(4), (B, 4, 5, 5)),
        Case("batch_norm_train_momentum_eps", lambda: nn.BatchNorm2d(4, eps=1e-3, momentum=0.3), (B, 4, 5, 5)),
        Case("batch_norm_no_affine", lambda: nn.BatchNorm2d(4, affine=False), (B, 4, 5, 5)),
        Case("batch_norm_no_running_stats", lambda: nn.BatchNorm2d(4, track_running_stats=False), (B, 4, 5, 5)),
        Case("batch_norm1d_train", lambda: nn.BatchNorm1d(4), (B, 4, 6)),
        Case("batch_norm_eval", lambda: frozen_batch_norm(4), (B, 4, 5, 5)),
        Case(
            "conv_bn_relu6",
            lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU6()),
            (B, 3, 6, 6),
            2.0,
        ),
    ],
}


def cotangent(shape):
    """A fixed, non-uniform weighting of a row's output, built from constants inside the graph."""
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float32) * 0.37).sin().view(shape) + 0.5


class Rows(nn.Module):
    def __init__(self, cases):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.rows = nn.ModuleDict()
        for c in cases:
            row = nn.Module()
            with torch.random.fork_rng():  # module weights: the same whichever rows share the group
                torch.manual_seed(0)
                row.op = c.op()
            row.input = nn.Parameter(torch.randn(*c.shape, generator=g) * c.scale)
            self.rows[c.name] = row

    def forward(self, x):
        total = x.sum() * 0  # the compiled step takes an input; the rows' inputs are parameters
        for row in self.rows.values():
            out = row.op(row.input)
            total = total + (out * cotangent(out.shape)).sum()
        return total


def row_output(output, target):
    return output


@pytest.fixture(scope="module")
def gradients_of_group():
    """group name -> (loss, grads, torch loss, torch grads), compiled once per group."""
    results = {}

    def get(name):
        if name not in results:
            model = Rows(GROUPS[name])
            x, target = torch.ones(1), torch.zeros(())
            program = pock.compile_training(model, x, target, loss=row_output, functions=("gradients",))
            results[name] = (
                *program.trainer().gradients(x, target),
                *torch_gradients(model, x, target, loss=row_output),
            )
        return results[name]

    return get


CASES = [(group, c.name) for group, cases in GROUPS.items() for c in cases]


@pytest.mark.parametrize("group,case", CASES, ids=[case for _, case in CASES])
def test_rule_matches_autograd(gradients_of_group, group, case):
    loss, grads, want_loss, want = gradients_of_group(group)
    assert loss == pytest.approx(want_loss, rel=1e-4)
    names = [n for n in want if n.startswith(f"rows.{case}.")]
    assert f"rows.{case}.input" in names, f"{case}: torch gives no gradient for the row's input"
    for n in names:
        assert_close_to_norm(grads[n], want[n], 1e-4, n)
