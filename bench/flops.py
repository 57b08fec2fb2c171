"""The FLOPs of a PyTorch training step: torch's FlopCounterMode, with a grouped convolution's
backward counted per group.

torch 2.13 counts a convolution's weight gradient as one convolution over all input channels,
ignoring `groups`: a depthwise convolution's is counted once per channel too many (torchvision's
MobileNetV2 step: 18.0 GFLOP counted, 2.6 done). Each gradient of a convolution is a convolution
of the forward's size (the weight's elements times the output's, or the input's when transposed),
so that is what the backward adds per gradient it computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def convolution_backward_flops(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    out_shape=None,
    **kwargs,
) -> int:
    """aten.convolution_backward's FLOPs: the forward's, once per gradient asked for (input, weight).
    The weight is (out, in / groups, *kernel), or (in, out / groups, *kernel) when transposed, so the
    forward multiplies each output element (each input element when transposed) by w_shape[1:]."""
    per_element = math.prod(w_shape[1:])
    forward = 2 * math.prod(x_shape if transposed else grad_out_shape) * per_element
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def step_flops(run: Callable[[], object]) -> int:
    """The FLOPs `run` (a forward and backward) performs."""
    counter = FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: convolution_backward_flops}
    )
    with counter:
        run()
    return counter.get_total_flops()
