"""Small CNNs built from stock PyTorch layers, for tests, benchmarks and examples.

The architectures are written out here, so that the examples need nothing beyond PyTorch, with
torchvision's module names (`features.3.conv.1.0.weight`, `layer2.0.downsample.0.weight`, ...)
so that state dicts and sparse-update patterns carry over.

`MobileNetV2Like`: inverted residual blocks (1x1 expand, depthwise kxk, 1x1 project) with
BatchNorm and ReLU6, a width multiplier, and a configurable stage list; per-stage kernel sizes
and expansion ratios make it an MCUNet-style net. `MobileNetV3Like`: MobileNetV3-Small, with
Hardswish and squeeze-excitation (Hardsigmoid gates). `ResNetLike`: a BasicBlock ResNet
(ResNet-18 by default) with configurable blocks per stage, width and stem.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels to a multiple of `divisor`, never below 90% of `value` (as torchvision)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias), BatchNorm2d, then an activation (none when `activation` is None)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        activation: type[nn.Module] | None = nn.ReLU6,
    ):
        layers = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if activation is not None:
            layers.append(activation())
        super().__init__(*layers)


# -- MobileNetV2 (and MCUNet-style variants) -------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """`repeats` inverted residual blocks with `channels` outputs; the first has `stride`."""

    expand: int
    channels: int
    repeats: int
    stride: int
    kernel: int = 3


MOBILENET_V2_STAGES = (
    Stage(1, 16, 1, 1),
    Stage(6, 24, 2, 2),
    Stage(6, 32, 3, 2),
    Stage(6, 64, 4, 2),
    Stage(6, 96, 3, 1),
    Stage(6, 160, 3, 2),
    Stage(6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int, kernel: int = 3):
        super().__init__()
        hidden = cin * expand
        layers = [ConvBNAct(cin, hidden, 1)] if expand != 1 else []
        layers += [
            ConvBNAct(hidden, hidden, kernel, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2Like(nn.Module):
    """Images (B, 3, H, W) -> logits (B, num_classes); `width` scales every layer's channels."""

    def __init__(
        self,
        width: float = 1.0,
        num_classes: int = 1000,
        stages: tuple[Stage, ...] = MOBILENET_V2_STAGES,
        stem: int = 32,
        head: int = 1280,
        dropout: float = 0.0,
    ):
        super().__init__()
        channels = make_divisible(stem * width)
        features = [ConvBNAct(3, channels, 3, 2)]
        for stage in stages:
            cout = make_divisible(stage.channels * width)
            for i in range(stage.repeats):
                features.append(
                    InvertedResidual(channels, cout, stage.stride if i == 0 else 1, stage.expand, stage.kernel)
                )
                channels = cout
        last = make_divisible(head * max(1.0, width))
        features.append(ConvBNAct(channels, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


# -- MobileNetV3-Small ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bneck:
    """One MobileNetV3 block: kernel, expanded and output channels, squeeze-excitation,
    Hardswish (else ReLU), stride."""

    kernel: int
    expanded: int
    channels: int
    se: bool
    hardswish: bool
    stride: int


MOBILENET_V3_SMALL = (
    Bneck(3, 16, 16, True, False, 2),
    Bneck(3, 72, 24, False, False, 2),
    Bneck(3, 88, 24, False, False, 1),
    Bneck(5, 96, 40, True, True, 2),
    Bneck(5, 240, 40, True, True, 1),
    Bneck(5, 240, 40, True, True, 1),
    Bneck(5, 120, 48, True, True, 1),
    Bneck(5, 144, 48, True, True, 1),
    Bneck(5, 288, 96, True, True, 2),
    Bneck(5, 576, 96, True, True, 1),
    Bneck(5, 576, 96, True, True, 1),
)


class SqueezeExcitation(nn.Module):
    """x scaled per channel by hardsigmoid(fc2(relu(fc1(mean of x over positions))))."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(scale))))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, spec: Bneck, width: float):
        super().__init__()
        expanded, cout = make_divisible(spec.expanded * width), make_divisible(spec.channels * width)
        activation = nn.Hardswish if spec.hardswish else nn.ReLU
        layers = [ConvBNAct(cin, expanded, 1, activation=activation)] if expanded != cin else []
        layers.append(ConvBNAct(expanded, expanded, spec.kernel, spec.stride, groups=expanded, activation=activation))
        if spec.se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers.append(ConvBNAct(expanded, cout, 1, activation=None))
        self.block = nn.Sequential(*layers)
        self.residual = spec.stride == 1 and cin == cout
        self.channels = cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3Like(nn.Module):
    """Images (B, 3, H, W) -> logits (B, num_classes): MobileNetV3-Small by default."""

    def __init__(
        self,
        width: float = 1.0,
        num_classes: int = 1000,
        blocks: tuple[Bneck, ...] = MOBILENET_V3_SMALL,
        head: int = 1024,
        dropout: float = 0.0,
    ):
        super().__init__()
        channels = make_divisible(16 * width)
        features = [ConvBNAct(3, channels, 3, 2, activation=nn.Hardswish)]
        for spec in blocks:
            features.append(Bottleneck(channels, spec, width))
            channels = features[-1].channels
        features.append(ConvBNAct(channels, 6 * channels, 1, activation=nn.Hardswish))
        self.features = nn.Sequential(*features)
        last = make_divisible(head * width)
        self.classifier = nn.Sequential(
            nn.Linear(6 * channels, last), nn.Hardswish(), nn.Dropout(dropout), nn.Linear(last, num_classes)
        )

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


# -- ResNet --------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNetLike(nn.Module):
    """Images (B, 3, H, W) -> logits (B, num_classes). `blocks` per stage (ResNet-18: 2, 2, 2, 2),
    `width` channels in the first stage (doubling per stage); stem "imagenet" is a 7x7 stride-2
    conv and a 3x3 stride-2 max pool, "cifar" a 3x3 stride-1 conv."""

    def __init__(
        self, num_classes: int = 1000, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 64, stem: str = "imagenet"
    ):
        super().__init__()
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        imagenet = stem == "imagenet"
        self.conv1 = nn.Conv2d(3, width, 7 if imagenet else 3, 2 if imagenet else 1, 3 if imagenet else 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if imagenet else nn.Identity()
        channels = width
        for index, repeats in enumerate(blocks):
            cout = width * 2**index
            stage = [
                BasicBlock(channels if i == 0 else cout, cout, 2 if index > 0 and i == 0 else 1) for i in range(repeats)
            ]
            self.add_module(f"layer{index + 1}", nn.Sequential(*stage))
            channels = cout
        self.stages = len(blocks)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(self.stages):
            x = getattr(self, f"layer{index + 1}")(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
