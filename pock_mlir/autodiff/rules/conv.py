"""Rules for convolutions, pooling and padding.

A convolution's rule emits the abstract backward (aten.convolution_backward, one per gradient);
pock-backend-switch gives each the form measured fastest on the target (pock_mlir/conv_forms.py
has the forms and why they exist). Batch norm needs no rule of its own: the core ATen
decomposition leaves var_mean, rsqrt and elementwise ops (train mode) or elementwise ops on the
running statistics (eval mode). Max pooling's backward is aten.max_pool2d_with_indices_backward
(IREE lowers it, faster than scatter_add or a dense fold); average pooling's is g over each
window's divisor, folded back with col2im.
"""

from __future__ import annotations

import numpy as np

from pock_mlir.conv_forms import Window, convolution_gradient, fold
from pock_mlir.op_facts import (
    convolution_backward_flops,
    convolution_backward_shape_only,
    convolution_backward_slices,
    convolution_flops,
    convolution_slices,
    declare,
)

from .base import defrule, scatter_into_zeros


@defrule("aten.convolution", slices=convolution_slices, flops=convolution_flops)
def convolution(b, g, out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """One abstract aten.convolution_backward per gradient; pock-backend-switch gives each the
    form measured fastest (pock_mlir/conv_forms.py). Conv1d runs as a Conv2d of height 1.

    A transposed convolution is the input gradient of the plain convolution with the same weight,
    from its output's shape back to its input's: its input gradient is that plain convolution of g,
    and its weight gradient that convolution's weight gradient, for input g and output gradient x."""
    spatial = len(b.shape(x)) - 2
    if spatial not in (1, 2):
        raise NotImplementedError(f"{spatial}-D convolutions have no derivative rule yet (1-D and 2-D do)")
    x_shape, w_shape = b.shape(x), b.shape(w)
    if spatial == 1:
        x, w, g = (b.aten.unsqueeze(v, 2) for v in (x, w, g))
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    if transposed:
        gx = b.aten.convolution(g, w, None, stride, padding, dilation, False, [0, 0], groups)
        gw = convolution_gradient(b, "weight_grad", x, g, w, stride, padding, dilation, groups)
        gx, gw = b.reshape(gx, x_shape), b.reshape(gw, w_shape)
    else:
        gx, gw = (
            b.reshape(convolution_gradient(b, op, g, x, w, stride, padding, dilation, groups), shape)
            for op, shape in (("input_grad", x_shape), ("weight_grad", w_shape))
        )
    gb = b.sum(g, [0, 2, 3]) if bias is not None else None
    return gx, gw, gb, None, None, None, None, None, None


declare(
    "aten.convolution_backward",
    slices=convolution_backward_slices,
    flops=convolution_backward_flops,
    shape_only=convolution_backward_shape_only,
)


# -- pooling ------------------------------------------------------------------------------


@defrule("aten.max_pool2d_with_indices")
def max_pool2d_with_indices(b, g, out, x, kernel, stride, padding, dilation, ceil_mode):
    """g routed to each window's argmax, from the forward's indices (torch's pick among ties)."""
    g_out, _ = g
    gx = b.aten.max_pool2d_with_indices_backward(
        g_out, x, kernel, stride or kernel, padding, dilation, ceil_mode, out[1]
    )
    return gx, None, None, None, None, None


@defrule("aten.max_pool2d")
def max_pool2d(b, g, out, x, kernel, stride, padding, dilation, ceil_mode):
    """As max_pool2d_with_indices, recomputing the indices: the inliner's canonicalisation
    turns max_pool2d_with_indices into this op while nothing uses the indices yet, before
    autodiff runs."""
    pooled = b.aten.max_pool2d_with_indices(x, kernel, stride or kernel, padding, dilation, ceil_mode)
    return max_pool2d_with_indices(b, (g, None), pooled, x, kernel, stride, padding, dilation, ceil_mode)


def avg_pool_divisors(window: Window, count_include_pad: bool) -> np.ndarray:
    """Each output position's divisor as torch's avg_pool2d computes it: the window clipped to
    the padded input, or to the input itself when padding does not count."""
    per_dim = []
    for size, k, s, p, out in zip(window.in_size, window.kernel, window.stride, window.padding, window.out_size):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        per_dim.append(end - start if count_include_pad else np.minimum(end, size) - np.maximum(start, 0))
    return np.outer(*per_dim)


@defrule("aten.avg_pool2d")
def avg_pool2d(b, g, out, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """g over each window's divisor, folded back (col2im) onto every position of its window."""
    if min(kernel) < 1 or min(stride or kernel) < 1 or (divisor_override is not None and divisor_override < 1):
        raise ValueError(f"kernel {kernel}, stride {stride} and divisor_override {divisor_override} must be positive")
    expected = Window.of(kernel, stride or kernel, padding, (1, 1), b.shape(x)[2:]).out_size
    if not ceil_mode and expected != b.shape(out)[2:]:
        raise ValueError(
            f"a {list(kernel)} window over {list(b.shape(x)[2:])} gives {list(expected)}, not the "
            f"declared {list(b.shape(out)[2:])}"
        )
    window = Window(
        tuple(kernel), tuple(stride or kernel), tuple(padding), (1, 1), tuple(b.shape(x)[2:]), tuple(b.shape(out)[2:])
    )
    if divisor_override:
        share = b.div(g, float(divisor_override))
    else:
        divisors = avg_pool_divisors(window, count_include_pad)
        if (divisors == divisors.flat[0]).all():
            share = b.div(g, float(divisors.flat[0]))
        else:
            share = b.mul(g, b.literal((1.0 / divisors).astype(np.float32)))
    n, c, ho, wo = b.shape(g)
    cols = b.expand_to(b.aten.unsqueeze(share, 2), [n, c, len(window.offsets), ho, wo])
    return fold(b, cols, window), None, None, None, None, None, None


@defrule("aten.adaptive_max_pool2d")
def adaptive_max_pool2d(b, g, out, x, output_size):
    """g added onto each window's argmax, from the forward's indices (flat within each channel)."""
    n, c, h, w = b.shape(x)
    flat = [n, c, -1]
    gx = scatter_into_zeros(b, b.reshape(x, flat), 2, b.reshape(out[1], flat), b.reshape(g[0], flat))
    return b.reshape(gx, [n, c, h, w]), None


# -- upsampling ---------------------------------------------------------------------------


def nearest_sources(size: int, out_size: int, factor: float | None) -> np.ndarray:
    """The input index each output index copies in torch's nearest upsampling, computed as torch
    does in float32: min(floor(index * scale), size - 1), scale 1 / factor if given, else size / out."""
    scale = np.float32(1.0 / factor) if factor else np.float32(size) / np.float32(out_size)
    return np.minimum(np.floor(np.arange(out_size, dtype=np.float32) * scale).astype(np.int64), size - 1)


def _one_hot(sources: np.ndarray, size: int) -> np.ndarray:
    """[len(sources), size], 1.0 where column j is sources[i]."""
    return (sources[:, None] == np.arange(size)).astype(np.float32)


@defrule("aten.upsample_nearest2d.vec")
def upsample_nearest2d(b, g, out, x, output_size, scale_factors):
    """Each output pixel's g summed onto the input pixel it copies: over each block of an integer
    factor, else as matmuls with the 0/1 matrices of which input row and column each output copies."""
    n, c, h, w = b.shape(x)
    ho, wo = b.shape(out)[2:]
    factors = scale_factors or (None, None)
    rows, cols = nearest_sources(h, ho, factors[0]), nearest_sources(w, wo, factors[1])
    if (
        ho % h == 0
        and wo % w == 0
        and np.array_equal(rows, np.arange(ho) // (ho // h))
        and np.array_equal(cols, np.arange(wo) // (wo // w))
    ):
        return b.sum(b.reshape(g, [n, c, h, ho // h, w, wo // w]), [3, 5]), None, None
    gw = b.aten.mm(b.reshape(g, [n * c * ho, wo]), b.literal(_one_hot(cols, w)))  # (n c ho, w)
    gt = b.reshape(b.transpose(b.reshape(gw, [n * c, ho, w])), [n * c * w, ho])
    gx = b.aten.mm(gt, b.literal(_one_hot(rows, h)))  # (n c w, h)
    return b.transpose(b.reshape(gx, [n, c, w, h])), None, None


# -- padding ------------------------------------------------------------------------------


@defrule("aten.constant_pad_nd")
def constant_pad_nd(b, g, out, x, pad, value):
    """g cropped back to x's extent (padding='same', F.pad); where a negative pad cropped x,
    g is zero-padded instead."""
    rank = len(b.shape(x))
    for k in range(len(pad) // 2):
        dim, before, after = rank - 1 - k, pad[2 * k], pad[2 * k + 1]
        if before > 0 or after > 0:
            size = b.shape(g)[dim]
            g = b.aten.slice.Tensor(g, dim, max(before, 0), size - max(after, 0), 1)
    cropped = [max(-p, 0) for p in pad]
    if any(cropped):
        g = b.aten.constant_pad_nd(g, cropped, 0.0)
    return g, None, None
