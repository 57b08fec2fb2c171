"""Core rules: elementwise arithmetic, reductions, matmul, shapes and selection."""

import numpy as np
from torch_mlir import ir

from pock_mlir.op_facts import (
    declare,
    elementwise,
    expand_slices,
    matmul_flops,
    mm_flops,
    mm_slices,
    permute_slices,
    reshape_slices,
    sum_dims_slices,
    t_slices,
    transpose_slices,
)
from pock_mlir.torch_builder import constant_value

from .base import defrule, scatter_into_zeros, unreduce, zero_where

# -- elementwise arithmetic -------------------------------------------------------------


@defrule("aten.add.Tensor", slices=elementwise)
def add_tensor(b, g, out, x, y, alpha):
    return b.sum_to(g, b.shape(x)), b.sum_to(b.mul(g, alpha) if alpha != 1 else g, b.shape(y)), None


@defrule("aten.sub.Tensor", slices=elementwise)
def sub_tensor(b, g, out, x, y, alpha):
    return b.sum_to(g, b.shape(x)), b.sum_to(b.mul(g, -alpha), b.shape(y)), None


@defrule("aten.add.Scalar", "aten.sub.Scalar", slices=elementwise)
def add_scalar(b, g, out, x, y, alpha):
    return g, None, None


@defrule("aten.rsub.Scalar", slices=elementwise)
def rsub_scalar(b, g, out, x, y, alpha):
    return b.mul(g, -alpha), None, None


@defrule("aten.mul.Tensor", slices=elementwise)
def mul_tensor(b, g, out, x, y):
    return b.sum_to(b.mul(g, y), b.shape(x)), b.sum_to(b.mul(g, x), b.shape(y))


@defrule("aten.mul.Scalar", slices=elementwise)
def mul_scalar(b, g, out, x, s):
    return b.mul(g, s), None


@defrule("aten.div.Tensor", slices=elementwise)
def div_tensor(b, g, out, x, y):
    gx = b.div(g, y)
    return b.sum_to(gx, b.shape(x)), b.sum_to(b.neg(b.mul(gx, out)), b.shape(y))


@defrule("aten.div.Scalar", slices=elementwise)
def div_scalar(b, g, out, x, s):
    return b.div(g, s), None


@defrule("aten.neg", slices=elementwise)
def neg(b, g, out, x):
    return (b.neg(g),)


@defrule("aten.pow.Tensor_Scalar", slices=elementwise)
def pow_tensor_scalar(b, g, out, x, p):
    return b.mul(b.mul(g, b.aten.pow.Tensor_Scalar(x, p - 1)), p), None


# -- unary maths --------------------------------------------------------------------------


@defrule("aten.exp", slices=elementwise)
def exp(b, g, out, x):
    return (b.mul(g, out),)


@defrule("aten.log", slices=elementwise)
def log(b, g, out, x):
    return (b.div(g, x),)


@defrule("aten.relu", slices=elementwise)
def relu(b, g, out, x):
    return (b.aten.threshold_backward(g, out, 0),)


declare("aten.threshold_backward", slices=elementwise)  # relu's backward, channel-sliced in turn


@defrule("aten.expm1", slices=elementwise)
def expm1(b, g, out, x):
    """g (y + 1)."""
    return (b.mul(g, b.aten.add.Scalar(out, 1.0, 1)),)


@defrule("aten.reciprocal", slices=elementwise)
def reciprocal(b, g, out, x):
    """-g y^2."""
    return (b.neg(b.mul(g, b.mul(out, out))),)


@defrule("aten.sin", slices=elementwise)
def sin(b, g, out, x):
    """g cos(x)."""
    return (b.mul(g, b.aten.cos(x)),)


@defrule("aten.cos", slices=elementwise)
def cos(b, g, out, x):
    """-g sin(x)."""
    return (b.neg(b.mul(g, b.aten.sin(x))),)


# -- reductions ---------------------------------------------------------------------------


@defrule("aten.sum.dim_IntList", slices=sum_dims_slices)
def sum_dim(b, g, out, x, dims, keepdim, dtype):
    return unreduce(b, g, dims, keepdim, b.shape(x)), None, None, None


@defrule("aten.sum")
def sum_all(b, g, out, x, dtype):
    return b.expand_to(b.reshape(g, [1] * len(b.shape(x))), b.shape(x)), None


@defrule("aten.mean")
def mean_all(b, g, out, x, dtype):
    shape = b.shape(x)
    count = 1
    for d in shape:
        count *= d
    return b.div(b.expand_to(b.reshape(g, [1] * len(shape)), shape), float(count)), None


@defrule("aten.mean.dim")
def mean_dim(b, g, out, x, dims, keepdim, dtype):
    shape = b.shape(x)
    count = 1
    for d in range(len(shape)) if not dims else dims:
        count *= shape[d]
    return b.div(unreduce(b, g, dims, keepdim, shape), float(count)), None, None, None


@defrule("aten.amax")
def amax(b, g, out, x, dims, keepdim):
    # Ties share the gradient equally, as in torch.
    shape = b.shape(x)
    hit = b.cast(b.aten.eq.Tensor(x, unreduce(b, out, dims, keepdim, shape)), b.type_of(x).dtype)
    count = unreduce(b, b.sum(hit, dims, keepdim), dims, keepdim, shape)
    return b.div(b.mul(hit, unreduce(b, g, dims, keepdim, shape)), count), None, None


def to_index(b, g, x, dim, index, keepdim):
    """g routed along `dim` to the position `index` names in each row, zeros elsewhere (`keepdim`:
    g and index keep `dim`, as size 1): the backward of a pick of one element per row (max.dim and
    min.dim, which torch routes to the index they return; a gather of one index per row).

    The select is elementwise and IREE fuses it into its consumer, where a scatter materialises a
    zero-filled tensor the size of x (a language model's logits)."""
    shape, dim = b.shape(x), dim % len(b.shape(x))
    if not keepdim:
        g, index = b.aten.unsqueeze(g, dim), b.aten.unsqueeze(index, dim)
    # int32: GPUs without 64-bit integers (the portable Vulkan profile) cannot compare int64
    positions = b.literal(
        np.arange(shape[dim], dtype=np.int32).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    )
    hit = b.aten.eq.Tensor(b.cast(index, b.type_of(positions).dtype), positions)
    return b.aten.where.self(hit, g, b.full((), 0.0, b.type_of(g).dtype))


def routed(b, onehot, dim):
    """The g that to_index routed along `dim` into `onehot` (g kept as size 1 along dim), or None
    where `onehot` is anything else: its sum along dim (keepdim) is that g, as exactly one
    position of each row takes it, so a backward that sums it (a cross-entropy's log-softmax)
    needs no reduction over the logits. An index outside the positions, which would lose its
    row's g, reads out of bounds in the forward's gather already."""
    select = onehot.owner
    if getattr(select, "name", None) != "torch.aten.where.self":
        return None
    hit, zero = select.operands[0].owner, select.operands[2].owner
    shape = b.shape(onehot)
    if (
        getattr(hit, "name", None) != "torch.aten.eq.Tensor"
        or getattr(zero, "name", None) != "torch.aten.full"
        or constant_value(zero.operands[1]) != 0
        or b.shape(select.operands[1]) != shape[:dim] + (1,) + shape[dim + 1 :]
    ):
        return None
    positions = hit.operands[1].owner
    if getattr(positions, "name", None) != "torch.vtensor.literal":
        return None
    values = ir.DenseIntElementsAttr(positions.attributes["value"])
    along = tuple(shape[dim] if d == dim else 1 for d in range(len(shape)))
    if b.shape(hit.operands[1]) != along or [values[i] for i in range(len(values))] != list(range(shape[dim])):
        return None
    if b.shape(hit.operands[0])[dim] != 1:  # one index per row: a where of the model's own may compare more
        return None
    return select.operands[1]


@defrule("aten.max.dim", "aten.min.dim")
def max_dim(b, g, out, x, dim, keepdim):
    """g to the maximum (minimum) each row's index names: torch's pick among ties, not a share."""
    return to_index(b, g[0], x, dim, out[1], keepdim), None, None


@defrule("aten.cumsum")
def cumsum(b, g, out, x, dim, dtype):
    """The reversed cumulative sum of g: each element reaches every later position."""
    return b.aten.flip(b.aten.cumsum(b.aten.flip(g, [dim]), dim, None), [dim]), None, None


def vector_norm(b, g, out, x, order, dims, keepdim):
    """The cotangent of x for a p-norm over `dims`."""
    if order == float("inf"):  # max |x|: amax's ties shared, signed
        return b.mul(amax(b, g, out, b.aten.abs(x), dims, keepdim)[0], b.aten.sign(x))
    shape = b.shape(x)
    g, out = unreduce(b, g, dims, keepdim, shape), unreduce(b, out, dims, keepdim, shape)
    if order == 2:
        return b.mul(x, zero_where(b, b.aten.eq.Scalar(out, 0.0), b.div(g, out)))
    if order == 1:
        return b.mul(g, b.aten.sign(x))
    raise NotImplementedError(f"the {order}-norm's gradient is not implemented (the 1-, 2- and inf-norms are)")


@defrule("aten.linalg_vector_norm")
def linalg_vector_norm(b, g, out, x, order, dims, keepdim, dtype):
    """2-norm: g x / y, zero where y is 0 (as torch); 1-norm: g sign(x); inf-norm: g sign(x) where |x|
    is the maximum, shared among ties."""
    return vector_norm(b, g, out, x, order, dims, keepdim), None, None, None, None


@defrule("aten.norm.ScalarOpt_dim")
def norm(b, g, out, x, order, dims, keepdim):
    """As linalg_vector_norm (torch.norm with a dim; triplet_margin_loss and pairwise_distance)."""
    return vector_norm(b, g, out, x, 2 if order is None else order, dims, keepdim), None, None, None


# -- linear algebra -----------------------------------------------------------------------


@defrule("aten.mm", slices=mm_slices, flops=mm_flops)
def mm(b, g, out, x, w):
    return b.aten.mm(g, b.transpose(w)), b.aten.mm(b.transpose(x), g)


@defrule("aten.matmul", flops=matmul_flops)
def matmul(b, g, out, x, w):
    """torch.matmul as ONNX's MatMul lowers to it (the FX import decomposes it to mm and bmm): a
    1-D operand is a row (x) or column (w) matrix, batch dimensions broadcast."""
    xs, ws = b.shape(x), b.shape(w)
    x2 = b.reshape(x, (1, *xs)) if len(xs) == 1 else x
    w2 = b.reshape(w, (*ws, 1)) if len(ws) == 1 else w
    out2 = b.shape(out)
    out2 = out2[:-1] + (1,) + out2[-1:] if len(xs) == 1 else out2
    g2 = b.reshape(g, out2 + (1,) if len(ws) == 1 else out2)
    gx = b.sum_to(b.aten.matmul(g2, b.transpose(w2)), b.shape(x2))
    gw = b.sum_to(b.aten.matmul(b.transpose(x2), g2), b.shape(w2))
    return b.reshape(gx, xs), b.reshape(gw, ws)


@defrule("aten.addmm")
def addmm(b, g, out, bias, x, w, beta, alpha):
    gx = b.aten.mm(g, b.transpose(w))
    gw = b.aten.mm(b.transpose(x), g)
    if alpha != 1:
        gx, gw = b.mul(gx, alpha), b.mul(gw, alpha)
    return b.sum_to(b.mul(g, beta) if beta != 1 else g, b.shape(bias)), gx, gw, None, None


# -- shapes -------------------------------------------------------------------------------


@defrule("aten.permute", slices=permute_slices, free=True)
def permute(b, g, out, x, dims):
    if dims == [1, 0]:
        return b.matrix_transpose(g), None
    rank = len(dims)
    inverse = [0] * rank
    for i, d in enumerate(dims):
        inverse[d % rank] = i
    return b.aten.permute(g, inverse), None


@defrule("aten.transpose.int", slices=transpose_slices, free=True)
def transpose(b, g, out, x, dim0, dim1):
    if len(b.shape(x)) == 2 and dim0 % 2 != dim1 % 2:
        return b.matrix_transpose(g), None, None
    return b.transpose(g, dim0, dim1), None, None


@defrule("aten.t", slices=t_slices, free=True)
def t(b, g, out, x):
    return (b.matrix_transpose(g) if len(b.shape(x)) == 2 else g,)  # aten.t leaves rank 0 and 1 as they are


@defrule(
    "aten.view",
    "aten.reshape",
    "aten._unsafe_view",
    "prims.squeeze",
    "prims.collapse",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze",
    "aten.unsqueeze",
    "aten.flatten.using_ints",
    view=True,
    slices=reshape_slices,
)
def reshape_like(b, g, out, x, *shape_args):
    return (b.reshape(g, b.shape(x)),) + (None,) * len(shape_args)


@defrule("aten.expand", "aten.broadcast_to", slices=expand_slices, free=True)
def expand(b, g, out, x, size, *implicit):  # broadcast_to (ONNX's Expand) has no `implicit`
    return (b.sum_to(g, b.shape(x)), None) + (None,) * len(implicit)


@defrule("aten.clone", "aten.alias", "aten.contiguous")
def identity(b, g, out, x, *rest):
    return (g,) + (None,) * len(rest)


declare("aten.clone", slices=elementwise)
declare("aten.alias", free=True)


@defrule("aten.detach")
def detach(b, g, out, x):
    """No gradient: a stop-gradient (the frontend keeps it from becoming an alias)."""
    return (None,)


@defrule("prims.convert_element_type", "aten._to_copy", "aten.to.dtype")  # to.dtype: from ONNX's lowering
def convert(b, g, out, x, *rest):
    return (b.cast(g, b.type_of(x).dtype),) + (None,) * len(rest)


declare("prims.convert_element_type", slices=elementwise, free=True)


# -- selection ----------------------------------------------------------------------------


@defrule("aten.where.self", slices=elementwise)
def where(b, g, out, cond, x, y):
    zero = b.full((), 0.0, b.type_of(g).dtype)
    gx = b.aten.where.self(cond, g, zero)
    gy = b.aten.where.self(cond, zero, g)
    return None, b.sum_to(gx, b.shape(x)), b.sum_to(gy, b.shape(y))


@defrule("aten.gather")
def gather(b, g, out, x, dim, index, sparse_grad):
    """scatter_add of g into zeros; with one index per row (cross-entropy), where(position == index, g, 0)."""
    shape, dim = b.shape(x), dim % len(b.shape(x))
    if b.shape(index) == shape[:dim] + (1,) + shape[dim + 1 :]:
        return to_index(b, g, x, dim, index, keepdim=True), None, None, None
    return scatter_into_zeros(b, x, dim, index, g), None, None, None


# Fills the backward emits (no derivative rule needed): no FLOPs in the cost model.
declare("aten.full", "aten.zeros", "aten.ones", "aten.empty.memory_format", "aten.scalar_tensor", free=True)
