"""Rules for the ops transformer encoders and LLaMA-style decoders decompose into: embeddings and
indexing, normalisation statistics, GELU and tanh, softmax, batched matmul, slicing and
concatenation, head repetition. Docstrings name the backward form; docs/supported-ops.md's ops table
shows them. Gathers scatter back with an accumulating index_put, which IREE lowers to one
scatter; matmuls stay (batched) matmuls.
"""

import math

import numpy as np

from pock_mlir.op_facts import bmm_flops, bmm_slices, elementwise

from .base import defrule, reduced_size, scatter_into_zeros, unreduce, zero_where
from .core import routed

# -- embeddings ---------------------------------------------------------------------------


@defrule("aten.embedding")
def embedding(b, g, out, weight, indices, padding_idx, scale_grad_by_freq, sparse):
    """index_put(zeros, [ids], g, accumulate=True); padding_idx rows get no gradient.

    IREE lowers the accumulating index_put to one scatter, many times faster than a one-hot
    matmul over a large vocabulary and as fast as scatter_add.
    """
    vocab, dim = b.shape(weight)
    ids = b.reshape(indices, [-1])
    rows = b.reshape(g, [-1, dim])
    if padding_idx >= 0:
        rows = zero_where(b, b.aten.unsqueeze(b.aten.eq.Scalar(ids, padding_idx), 1), rows)
    grad = b.aten.index_put(b.zeros_like(weight), [ids], rows, True)
    if scale_grad_by_freq:
        ones = b.full(b.shape(ids), 1.0, b.type_of(weight).dtype)
        counts = b.aten.index_put(b.full([vocab], 0.0, b.type_of(weight).dtype), [ids], ones, True)
        grad = b.div(grad, b.aten.unsqueeze(b.aten.clamp_min(counts, 1.0), 1))
    return grad, None, None, None, None


def _without_whole_dims(b, x, indices):
    """Advanced-indexing `indices` with each leading None (a whole dim) replaced by an arange that
    broadcasts against the index tensors: torch-mlir cannot lower an index_put with None indices."""
    lead = next(i for i, t in enumerate(indices) if t is not None)
    if any(t is None for t in indices[lead:]):
        raise NotImplementedError("indexing with a whole dim after an index tensor has no rule")
    rank = max(len(b.shape(t)) for t in indices[lead:])
    dtype = b.type_of(indices[lead]).dtype
    shape = b.shape(x)
    wholes = [
        b.reshape(b.aten.arange(shape[d], dtype, None, None, None), [shape[d]] + [1] * (lead - 1 - d + rank))
        for d in range(lead)
    ]
    return wholes + list(indices[lead:])


@defrule("aten.index.Tensor")
def index(b, g, out, x, indices):
    """index_put(zeros, indices, g, accumulate=True), as for embeddings."""
    return b.aten.index_put(b.zeros_like(x), _without_whole_dims(b, x, indices), g, True), None


@defrule("aten.index_select")
def index_select(b, g, out, x, dim, index):
    """index_put(zeros, [:, ..., index], g, accumulate=True) along `dim`."""
    indices = _without_whole_dims(b, x, [None] * (dim % len(b.shape(x))) + [index])
    return b.aten.index_put(b.zeros_like(x), indices, g, True), None, None


# -- normalisation ------------------------------------------------------------------------


def _var_input_grad(b, g_var, x, mean, dims, correction, keepdim):
    """d var / dx = 2 (x - mean) / (N - correction), with `mean` kept over `dims`."""
    shape = b.shape(x)
    correction = 1 if correction is None else correction
    scale = 2.0 / (reduced_size(shape, dims) - correction)
    return b.mul(b.mul(b.sub(x, mean), unreduce(b, g_var, dims, keepdim, shape)), scale)


@defrule("aten.var_mean.correction")
def var_mean(b, g, out, x, dims, correction, keepdim):
    """2 g_var (x - mean) / (N - correction) + g_mean / N."""
    g_var, g_mean = g
    shape = b.shape(x)
    mean = unreduce(b, out[1], dims, keepdim, shape)
    gx_mean = b.div(unreduce(b, g_mean, dims, keepdim, shape), float(reduced_size(shape, dims)))
    return b.add(_var_input_grad(b, g_var, x, mean, dims, correction, keepdim), gx_mean), None, None, None


@defrule("aten.var.correction")
def var(b, g, out, x, dims, correction, keepdim):
    """2 g (x - mean) / (N - correction)."""
    mean = b.aten.mean.dim(x, dims, True, None)
    return _var_input_grad(b, g, x, mean, dims, correction, keepdim), None, None, None


@defrule("aten.rsqrt", slices=elementwise)
def rsqrt(b, g, out, x):
    """-g y^3 / 2."""
    return (b.mul(b.mul(g, b.mul(b.mul(out, out), out)), -0.5),)


@defrule("aten.sqrt", slices=elementwise)
def sqrt(b, g, out, x):
    """g / (2 y)."""
    return (b.div(b.mul(g, 0.5), out),)


@defrule("aten.rms_norm")
def rms_norm(b, g, out, x, normalized_shape, weight, eps):
    """With r = rsqrt(mean(x^2) + eps) over the normalized dims and h = g w:
    dx = r (h - x r^2 mean(h x)), dw = sum over the leading dims of g x r."""
    dims = list(range(-len(normalized_shape), 0))
    if eps is None:
        import torch  # here, not at the top: pock-opt loads the rule table without PyTorch (torch_types.py)

        eps = torch.finfo(b.type_of(x).dtype).eps
    r = b.aten.rsqrt(b.add(b.aten.mean.dim(b.mul(x, x), dims, True, None), eps))
    h = b.mul(g, weight) if weight is not None else g
    mean_hx = b.aten.mean.dim(b.mul(h, x), dims, True, None)
    gx = b.mul(r, b.sub(h, b.mul(x, b.mul(b.mul(r, r), mean_hx))))
    gw = b.sum_to(b.mul(g, b.mul(x, r)), b.shape(weight)) if weight is not None else None
    return gx, None, gw, None


# -- activations and softmax --------------------------------------------------------------


@defrule("aten.tanh", slices=elementwise)
def tanh(b, g, out, x):
    """g (1 - y^2)."""
    return (b.mul(g, b.aten.rsub.Scalar(b.mul(out, out), 1.0, 1)),)


@defrule("aten.erf", slices=elementwise)
def erf(b, g, out, x):
    """g 2 / sqrt(pi) exp(-x^2) (ONNX's Erf, as the dynamo exporter writes GELU)."""
    return (b.mul(g, b.mul(b.aten.exp(b.neg(b.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


@defrule("aten.gelu")
def gelu(b, g, out, x, approximate):
    """Elementwise erf/exp (approximate='none') or tanh (approximate='tanh') forms of GELU'."""
    if approximate == "tanh":
        beta, kappa = math.sqrt(2.0 / math.pi), 0.044715
        x2 = b.mul(x, x)
        t = b.aten.tanh(b.mul(b.add(x, b.mul(b.mul(x2, x), kappa)), beta))
        d_inner = b.mul(b.add(b.mul(x2, 3.0 * kappa), 1.0), beta)
        d_tanh = b.mul(b.mul(b.aten.rsub.Scalar(b.mul(t, t), 1.0, 1), d_inner), b.mul(x, 0.5))
        slope = b.add(b.mul(b.add(t, 1.0), 0.5), d_tanh)
    else:
        cdf = b.mul(b.add(b.aten.erf(b.mul(x, math.sqrt(0.5))), 1.0), 0.5)
        pdf = b.mul(b.aten.exp(b.mul(b.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
        slope = b.add(cdf, b.mul(x, pdf))
    return b.mul(g, slope), None


@defrule("aten._softmax")
def softmax(b, g, out, x, dim, half_to_float):
    """y (g - sum(g y, dim))."""
    return b.mul(out, b.sub(g, b.sum(b.mul(g, out), [dim], keepdim=True))), None, None


@defrule("aten._log_softmax")
def log_softmax(b, g, out, x, dim, half_to_float):
    """g - exp(y) sum(g, dim); for a cross-entropy's one-hot g, sum(g, dim) without a reduction (routed).

    Kept whole by the frontend: through its decomposition the gradient would also flow into the
    max it subtracts, which cancels, at the cost of full-size masks (pock_mlir.frontend.decompositions)."""
    dim = dim % len(b.shape(out))
    total = routed(b, g, dim)
    return b.sub(g, b.mul(b.aten.exp(out), total if total is not None else b.sum(g, [dim], keepdim=True))), None, None


# -- batched matmul -----------------------------------------------------------------------


@defrule("aten.bmm", slices=bmm_slices, flops=bmm_flops)
def bmm(b, g, out, x, y):
    """bmm(g, y^T), bmm(x^T, g)."""
    return b.aten.bmm(g, b.transpose(y)), b.aten.bmm(b.transpose(x), g)


# -- slicing, concatenation, repetition ---------------------------------------------------


@defrule("aten.slice.Tensor", free=True)
def slice_tensor(b, g, out, x, dim, start, end, step):
    """slice_scatter of g into zeros."""
    return b.aten.slice_scatter(b.zeros_like(x), g, dim, start, end, step), None, None, None, None


@defrule("aten.select.int", free=True)
def select(b, g, out, x, dim, index):
    """select_scatter of g into zeros, at the index counted from the front.

    torch-mlir decomposes select_scatter into slice_scatter over [index, index + 1), an empty slice
    for index -1; behind a permute IREE 3.13 then scattered nothing, and an RNN's weights, whose
    loss reads its last output, got zero gradients."""
    return b.aten.select_scatter(b.zeros_like(x), g, dim, index % b.shape(x)[dim]), None, None


@defrule("aten.slice_scatter", free=True)
def slice_scatter(b, g, out, x, src, dim, start, end, step):
    """g with the slice zeroed for x, the slice of g for src (`x[:, a:b] = src`, functionalized)."""
    return (
        b.aten.slice_scatter(g, b.zeros_like(src), dim, start, end, step),
        b.aten.slice.Tensor(g, dim, start, end, step),
        None,
        None,
        None,
        None,
    )


@defrule("aten.copy", free=True)
def copy(b, g, out, x, src, non_blocking):
    """All of g to src, summed to its shape: the result is src broadcast to x's shape, none of x
    (an in-place assignment `x[i] = src`, functionalized)."""
    if not b.type_of(src).is_float:
        return None, None, None
    return None, b.sum_to(b.cast(g, b.type_of(src).dtype), b.shape(src)), None


@defrule("aten.flip", free=True)
def flip(b, g, out, x, dims):
    """g flipped back (a bidirectional RNN's reverse direction reads its input flipped)."""
    return b.aten.flip(g, dims), None


@defrule("aten.roll", free=True)
def roll(b, g, out, x, shifts, dims):
    """g rolled back (a Swin block's shifted windows)."""
    return b.aten.roll(g, [-s for s in shifts], dims), None, None


@defrule("aten.diagonal", free=True)
def diagonal(b, g, out, x, offset, dim1, dim2):
    """g on the diagonal of zeros: g padded to dim1's length, broadcast along dim2 and kept where
    column - row == offset (a loss over a correlation matrix's diagonal). torch-mlir's
    diagonal_scatter did not compile: IREE failed to legalize a constant it made."""
    shape = b.shape(x)
    dim1, dim2 = dim1 % len(shape), dim2 % len(shape)
    rows, columns = shape[dim1], shape[dim2]
    before = max(-offset, 0)
    along_rows = b.aten.constant_pad_nd(g, [before, rows - b.shape(out)[-1] - before], 0.0)
    rest = [d for d in range(len(shape)) if d not in (dim1, dim2)]
    planes = b.expand_to(b.aten.unsqueeze(along_rows, -1), [*(shape[d] for d in rest), rows, columns])
    # int32, as to_index's positions: GPUs without 64-bit integers cannot compare int64
    column_minus_row = b.literal(np.arange(columns, dtype=np.int32) - np.arange(rows, dtype=np.int32)[:, None])
    planes = zero_where(b, b.aten.ne.Scalar(column_minus_row, offset), planes)
    at = {d: i for i, d in enumerate(rest)} | {dim1: len(rest), dim2: len(rest) + 1}
    return b.aten.permute(planes, [at[d] for d in range(len(shape))]), None, None, None


@defrule("aten.unfold", free=True)
def unfold(b, g, out, x, dim, size, step):
    """Windows of g put back along `dim` (Tensor.unfold: sliding windows, patches). Windows that
    tile the dim are g's window index and offset merged into one dim; overlapping or gapped ones
    are one strided slice_scatter per offset in the window, summed. (The frontend unfolds only the
    part of a dim its windows cover.)"""
    shape = b.shape(x)
    dim %= len(shape)
    windows, last = b.shape(out)[dim], len(b.shape(out)) - 1
    if step == size and windows * size == shape[dim]:
        offset_after_window = [*range(dim + 1), last, *range(dim + 1, last)]
        return b.reshape(b.aten.permute(g, offset_after_window), shape), None, None, None
    grad = None
    for k in range(size):
        part = b.aten.slice_scatter(
            b.zeros_like(x), b.aten.select.int(g, last, k), dim, k, k + step * (windows - 1) + 1, step
        )
        grad = part if grad is None else b.add(grad, part)
    return grad, None, None, None


@defrule("aten.topk")
def topk(b, g, out, x, k, dim, largest, sorted_):
    """scatter_add of g into zeros at the indices the forward returned (a mixture of experts'
    routing weights)."""
    return scatter_into_zeros(b, x, dim, out[1], g[0]), None, None, None, None


@defrule("aten.sort")
def sort(b, g, out, x, dim, descending):
    """g put back where each sorted element came from."""
    return scatter_into_zeros(b, x, dim, out[1], g[0]), None, None


@defrule("aten.cat")
def cat(b, g, out, tensors, dim):
    """Slices of g, one per input."""
    grads, start = [], 0
    for t in tensors:
        size = b.shape(t)[dim]
        grads.append(b.aten.slice.Tensor(g, dim, start, start + size, 1))
        start += size
    return grads, None


@defrule("aten.repeat")
def repeat(b, g, out, x, repeats):
    """g viewed as (r0, s0, r1, s1, ...) and summed over the repeat counts r."""
    shape = b.shape(x)
    shape = (1,) * (len(repeats) - len(shape)) + shape
    tiled = [d for r, s in zip(repeats, shape) for d in (r, s)]
    summed = b.sum(b.reshape(g, tiled), list(range(0, len(tiled), 2)))
    return b.reshape(summed, b.shape(x)), None


# -- ops whose result does not change with their tensor operand ----------------------------


@defrule("aten.full_like", "aten.zeros_like", "aten.ones_like", "aten.empty_like", free=True)
def constant_valued(b, g, out, *args):
    """No gradient: the result's values do not depend on the operand's."""
    return (None,) * len(args)
