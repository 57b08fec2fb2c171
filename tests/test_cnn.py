"""CNN derivative rules and whole CNNs against torch.autograd and torch.optim.

A table of op specs (each a tiny module with its attributes) is grouped into one compiled
model per row, and two whole models (a MobileNetV2-like net with depthwise convs and BatchNorm
in train and eval mode, and a small ResNet) are checked for gradients and 10-step loss curves.
"""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from oracle import assert_close_to_norm, assert_gradients_close, torch_gradients, torch_trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.cnn import MobileNetV2Like, ResNetLike, Stage  # noqa: E402


class Head(nn.Module):
    """features -> global average pool -> linear, so every op spec ends in class logits."""

    def __init__(self, features: nn.Module, channels: int, classes: int = 3):
        super().__init__()
        self.features, self.fc = features, nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class Conv1dHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 6, 3, stride=2, padding=1, dilation=1)
        self.depthwise = nn.Conv1d(6, 6, 5, padding=2, groups=6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.depthwise(torch.relu(self.conv(x))).mean(-1))


class ConcatResidual(nn.Module):
    """concatenation and a residual add"""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.mix = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.cat([torch.relu(self.a(x)), torch.sigmoid(self.b(x))], dim=1)
        return y + self.mix(y)


def se_gate(channels):
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, 2, 1), nn.SiLU(), nn.Conv2d(2, channels, 1),
                         nn.Hardsigmoid())


class SqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.gate = se_gate(channels)

    def forward(self, x):
        return x * self.gate(x)


# name -> (module factory, input shape)
OP_SPECS = {
    "conv2d stride/padding/dilation + relu": (lambda: Head(nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=2, dilation=2)), 6), (2, 3, 12, 12)),
    "grouped and depthwise conv + relu6": (lambda: Head(nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1, groups=2), nn.ReLU6(), nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),
        nn.Hardswish()), 8), (2, 4, 10, 10)),
    "batchnorm train mode + maxpool": (lambda: Head(nn.Sequential(
        nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2, 2)), 6), (4, 3, 10, 10)),
    "avgpool + squeeze-excitation": (lambda: Head(nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.AvgPool2d(3, stride=2, padding=1), SqueezeExcite(6)), 6), (2, 3, 9, 9)),
    "conv1d + depthwise conv1d": (Conv1dHead, (2, 3, 16)),
    "concatenation + residual": (lambda: Head(ConcatResidual(), 8), (2, 3, 8, 8)),
}


def batch(shape, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)


@pytest.mark.parametrize("spec", list(OP_SPECS))
def test_rule_gradients_match_autograd(spec):
    factory, shape = OP_SPECS[spec]
    torch.manual_seed(0)
    model = factory()
    x, y = batch(shape)
    program = pock.compile_training(copy.deepcopy(model), x, y, optimizer=pock.SGD(lr=0.1))
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, f"{spec}: {name}")


def small_mobilenet():
    torch.manual_seed(1)
    return MobileNetV2Like(width=0.5, num_classes=4, stages=(Stage(1, 16, 1, 1), Stage(4, 24, 2, 2), Stage(4, 32, 1, 2)),
                           stem=16, head=64)


def small_resnet():
    torch.manual_seed(2)
    return ResNetLike(num_classes=4, blocks=(1, 1), width=8)


MODELS = {
    "mobilenetv2 train-mode BN": (small_mobilenet, True),
    "mobilenetv2 eval-mode BN": (small_mobilenet, False),
    "resnet": (small_resnet, True),
}
STEPS = 10
OPTIMIZER = pock.SGD(lr=0.05, momentum=0.9)


@pytest.fixture(scope="module", params=list(MODELS))
def compiled_model(request):
    factory, train_mode = MODELS[request.param]
    model = factory().train(train_mode)
    x, y = batch((4, 3, 32, 32), classes=4, seed=3)
    program = pock.compile_training(copy.deepcopy(model), x, y, optimizer=OPTIMIZER)
    return request.param, model, program, x, y


def test_model_gradients_match_autograd(compiled_model):
    name, model, program, x, y = compiled_model
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-4)
    assert_gradients_close(grads, want, 1e-4, f"{name} gradient")


def test_model_training_matches_torch_optim(compiled_model):
    name, model, program, x, y = compiled_model
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    reference = copy.deepcopy(model)
    want_losses, want_params = torch_trajectory(reference, x, y, OPTIMIZER, STEPS)
    np.testing.assert_allclose(losses, want_losses, rtol=2e-4)
    assert_gradients_close(trainer.state_dict(), want_params, 1e-4, f"{name} final value")


def test_batchnorm_running_statistics_follow_pytorch(compiled_model):
    name, model, program, x, y = compiled_model
    trainer = program.trainer()
    for _ in range(3):
        trainer.step(x, y)
    reference = copy.deepcopy(model)
    opt = OPTIMIZER.torch_optimizer(reference.parameters())
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        opt.step()
    state = trainer.state_dict()
    buffers = dict(reference.named_buffers())
    assert buffers, "the model has BatchNorm buffers"
    for buffer, value in buffers.items():
        np.testing.assert_allclose(state[buffer], value.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{name}: {buffer}")
