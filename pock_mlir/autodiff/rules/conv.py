"""Rules for convolutions, pooling and padding, in backward forms IREE compiles well.

Batch norm needs no rule of its own: the core ATen decomposition leaves var_mean, rsqrt and
elementwise ops (train mode) or elementwise ops on the running statistics (eval mode).

The forms were chosen by timing alternatives under IREE on the host CPU:
- weight gradient: im2col (aten.unfold) and one matmul per group over all images and
  positions. torch's form, a convolution of the input with g as a huge kernel, compiled on its
  own to a direct convolution 15-50x slower on ResNet-18 layers (inside a whole model IREE
  sometimes rewrites it to a matmul itself; this form does not depend on that); per-image
  batched matmuls materialised N weight-sized products. Depthwise: a multiply-and-sum over
  images and positions per kernel offset (torch's batch-grouped form was the slowest
  MobileNetV2 dispatch).
- input gradient: col2im of g W (the weight as stored: transposing or flipping it costs a
  weight-sized copy per step), folded by stride phase with slices instead of scatters. A
  transposed convolution ran 2-10x slower strided and does not compile grouped.
- max pooling: aten.max_pool2d_with_indices_backward (IREE lowers it, faster than
  scatter_add or a dense fold); average pooling: g over each window's divisor, folded back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pock_mlir.op_facts import convolution_flops, convolution_slices

from .base import defrule


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window over [N, C, H, W]: per spatial dim its kernel size, stride, padding
    and dilation, and the input and output sizes."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    in_size: tuple[int, int]
    out_size: tuple[int, int]

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """The kernel positions (i, j), row-major: the order of weight[..., i, j]."""
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]


def pad_spatial(b, x, top, bottom, left, right):
    if top == bottom == left == right == 0:
        return x
    return b.aten.constant_pad_nd(x, [left, right, top, bottom], 0.0)


def unfold(b, x, window: Window):
    """im2col: [N, C, Ho, Wo, kh, kw], the zero-padded input values each output position
    multiplies with weight[..., i, j]. aten.unfold per spatial dim lowers to a single IREE
    dispatch (one strided slice per offset took one dispatch each)."""
    x = pad_spatial(b, x, window.padding[0], window.padding[0], window.padding[1], window.padding[1])
    for dim, k, s, d in zip((2, 3), window.kernel, window.stride, window.dilation):
        span = d * (k - 1) + 1
        x = b.aten.unfold(x, dim, span, s)
        if d > 1:
            x = b.aten.slice.Tensor(x, -1, 0, span, d)
    return x


def fold(b, cols, window: Window, tap_weights=None):
    """col2im, the transpose of `unfold`: cols [N, C, kh*kw, Ho, Wo] summed into the input
    positions each offset was read from. With tap_weights [C, kh*kw], cols is one [N, C, Ho, Wo]
    map that every offset reads, times that offset's per-channel weight (the depthwise input
    gradient, without a k*k times larger cols tensor: faster under IREE, pock_mlir/tuning/host.json).

    Padded row i*d + s*t is row (i*d)//s + t of phase (i*d)%s once the rows are split into s
    interleaved phases, so each phase is a sum of shifted slices of cols, padded once (no
    scatter, no zero-inserted tensors); one stack and reshape interleave the phases back."""
    n, c = b.shape(cols)[:2]
    (sh, sw), (ph, pw), (dh, dw) = window.stride, window.padding, window.dilation
    (h, w), (ho, wo), (kh, kw) = window.in_size, window.out_size, window.kernel
    # Blocks per phase: enough for the padded input and for every window (ceil_mode pooling
    # windows may run past the padding; what lands there is cropped away).
    hb = -(-max(h + 2 * ph, dh * (kh - 1) + sh * (ho - 1) + 1) // sh)
    wb = -(-max(w + 2 * pw, dw * (kw - 1) + sw * (wo - 1) + 1) // sw)
    top, left = dh * (kh - 1) // sh, dw * (kw - 1) // sw  # the largest block shifts
    padded = pad_spatial(b, cols, top, hb - ho, left, wb - wo)
    phases = {}
    for o, (i, j) in enumerate(window.offsets):
        (bi, a), (bj, e) = divmod(i * dh, sh), divmod(j * dw, sw)
        tap = padded if tap_weights is not None else b.aten.select.int(padded, 2, o)
        rows = b.aten.slice.Tensor(tap, 2, top - bi, top - bi + hb, 1)
        placed = b.aten.slice.Tensor(rows, 3, left - bj, left - bj + wb, 1)
        if tap_weights is not None:
            placed = b.mul(placed, b.reshape(b.aten.select.int(tap_weights, 1, o), [1, c, 1, 1]))
        phases[a, e] = b.add(phases[a, e], placed) if (a, e) in phases else placed
    if (sh, sw) == (1, 1):
        interleaved = phases[0, 0]
    else:
        zeros = b.full([n, c, hb, wb], 0.0, b.type_of(cols).dtype)
        rows = [b.aten.stack([phases.get((a, e), zeros) for e in range(sw)], 4) for a in range(sh)]
        interleaved = b.reshape(b.aten.stack(rows, 3), [n, c, hb * sh, wb * sw])
    if b.shape(interleaved)[2:] != (h, w):
        interleaved = b.aten.slice.Tensor(b.aten.slice.Tensor(interleaved, 2, ph, ph + h, 1), 3, pw, pw + w, 1)
    return interleaved


# -- convolution --------------------------------------------------------------------------

def is_depthwise(w_shape, groups) -> bool:
    """One input and one output channel per group (MobileNet's depthwise convs)."""
    return groups > 1 and w_shape[0] == groups and w_shape[1] == 1


def positions_by_group(b, value, groups: int):
    """[N, G*k, Ho, Wo] as [G, N*Ho*Wo, k]: per group, one row per image position."""
    n, channels, ho, wo = b.shape(value)
    rows = b.reshape(b.aten.permute(value, [0, 2, 3, 1]), [n * ho * wo, groups, channels // groups])
    return b.aten.permute(rows, [1, 0, 2])


def conv_weight_grad(b, g, x, w_shape, window: Window, groups: int):
    """dW[o, c, i, j] = sum over images and positions of g[n, o] x_padded[n, c, offset (i, j)]:
    im2col, then one matmul per group contracting images and positions together (a matmul per
    image would materialise N weight-sized partial products)."""
    n, cout, ho, wo = b.shape(g)
    patches = unfold(b, x, window)  # [N, Cin, Ho, Wo, kh, kw]
    if is_depthwise(w_shape, groups):
        per_channel = b.aten.permute(patches, [1, 4, 5, 0, 2, 3])  # [C, kh, kw, N, Ho, Wo]
        g_per_channel = b.reshape(b.aten.permute(g, [1, 0, 2, 3]), [cout, 1, 1, n, ho, wo])
        return b.reshape(b.sum(b.mul(per_channel, g_per_channel), [3, 4, 5]), w_shape)
    taps = w_shape[1] * w_shape[2] * w_shape[3]
    cols = b.reshape(b.aten.permute(patches, [0, 2, 3, 1, 4, 5]), [n * ho * wo, groups, taps])
    g_t = b.aten.permute(b.reshape(g, [n, groups, cout // groups, ho * wo]), [1, 2, 0, 3])  # [G, Cout/G, N, Ho*Wo]
    g_t = b.reshape(g_t, [groups, cout // groups, n * ho * wo])
    return b.reshape(b.aten.bmm(g_t, b.aten.permute(cols, [1, 0, 2])), w_shape)


def conv_input_grad(b, g, w, window: Window, groups: int):
    """dX = col2im(g W), the weight used as stored (a transposed weight costs a weight-sized
    transpose per step)."""
    cout, cin_per_group, kh, kw = b.shape(w)
    n, _, ho, wo = b.shape(g)
    if is_depthwise(b.shape(w), groups):
        return fold(b, g, window, tap_weights=b.reshape(w, [cout, kh * kw]))
    w_rows = b.reshape(w, [groups, cout // groups, cin_per_group * kh * kw])
    cols = b.aten.bmm(positions_by_group(b, g, groups), w_rows)  # [G, N*Ho*Wo, Cin/G*KK]
    cols = b.reshape(cols, [groups, n, ho, wo, cin_per_group, kh * kw])
    cols = b.reshape(b.aten.permute(cols, [1, 0, 4, 5, 2, 3]), [n, groups * cin_per_group, kh * kw, ho, wo])
    return fold(b, cols, window)


@defrule("aten.convolution", slices=convolution_slices, flops=convolution_flops)
def convolution(b, g, out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Conv1d runs as a Conv2d of height 1; see the module docstring for the forms."""
    if transposed:
        raise NotImplementedError("transposed convolutions (nn.ConvTranspose*) have no derivative rule yet")
    spatial = len(b.shape(x)) - 2
    if spatial not in (1, 2):
        raise NotImplementedError(f"{spatial}-D convolutions have no derivative rule yet (1-D and 2-D do)")
    x_shape, w_shape = b.shape(x), b.shape(w)
    if spatial == 1:
        x, w, g = (b.aten.unsqueeze(v, 2) for v in (x, w, g))
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    window = Window(tuple(b.shape(w)[2:]), tuple(stride), tuple(padding), tuple(dilation),
                    tuple(b.shape(x)[2:]), tuple(b.shape(g)[2:]))
    gx = b.reshape(conv_input_grad(b, g, w, window, groups), x_shape)
    gw = b.reshape(conv_weight_grad(b, g, x, b.shape(w), window, groups), w_shape)
    gb = b.sum(g, [0, 2, 3]) if bias is not None else None
    return gx, gw, gb, None, None, None, None, None, None


# -- pooling ------------------------------------------------------------------------------

@defrule("aten.max_pool2d_with_indices")
def max_pool2d_with_indices(b, g, out, x, kernel, stride, padding, dilation, ceil_mode):
    """g routed to each window's argmax, from the forward's indices (torch's pick among ties)."""
    g_out, _ = g
    gx = b.aten.max_pool2d_with_indices_backward(g_out, x, kernel, stride or kernel, padding, dilation,
                                                 ceil_mode, out[1])
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
    window = Window(tuple(kernel), tuple(stride or kernel), tuple(padding), (1, 1),
                    tuple(b.shape(x)[2:]), tuple(b.shape(out)[2:]))
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
