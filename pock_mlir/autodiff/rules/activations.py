"""Rules for elementwise activations beyond ReLU: sigmoid (SiLU and squeeze-excitation gates),
hardtanh (ReLU6), clamp (Hardswish and Hardsigmoid decompose into x + 3 clamped to [0, 6]) and its
tensor-bounded form, leaky ReLU and ELU (SELU, CELU). Each cotangent is g times the local slope; at
a kink the slope follows torch.
"""

from pock_mlir.op_facts import elementwise

from .base import defrule, zero_where


def indicator(b, condition, like):
    """1.0 where `condition` holds, else 0.0, in `like`'s dtype."""
    return b.cast(condition, b.type_of(like).dtype)


@defrule("aten.sigmoid", slices=elementwise)
def sigmoid(b, g, out, x):
    """g y (1 - y)."""
    return (b.mul(g, b.mul(out, b.aten.rsub.Scalar(out, 1.0, 1))),)


@defrule("aten.hardtanh")
def hardtanh(b, g, out, x, min_val, max_val):
    """g where min < y < max, which is where min < x < max (torch's hardtanh_backward passes nothing
    at the edges)."""
    # The output, not x: the next layer's weight gradient keeps it anyway, so x need not be kept too.
    inside = b.aten.logical_and(b.aten.gt.Scalar(out, min_val), b.aten.lt.Scalar(out, max_val))
    return b.mul(g, indicator(b, inside, g)), None, None


@defrule("aten.clamp")
def clamp(b, g, out, x, min_val, max_val):
    """g where min <= x <= max (torch's clamp_backward passes g at the edges); a None bound is open."""
    bounds = [b.aten.ge.Scalar(x, min_val)] if min_val is not None else []
    bounds += [b.aten.le.Scalar(x, max_val)] if max_val is not None else []
    if not bounds:
        return g, None, None
    inside = bounds[0] if len(bounds) == 1 else b.aten.logical_and(*bounds)
    return b.mul(g, indicator(b, inside, g)), None, None


@defrule("aten.clamp.Tensor")
def clamp_tensor(b, g, out, x, min_val, max_val):
    """g to x where min <= x <= max, else to the bound that clamped it (cosine_similarity clamps its
    norms from below by a tensor)."""
    gx, grads = g, []
    for bound, outside in ((min_val, b.aten.lt.Tensor), (max_val, b.aten.gt.Tensor)):
        if bound is None:
            grads.append(None)
            continue
        clamped = outside(x, bound)
        gx = zero_where(b, clamped, gx)
        grads.append(b.sum_to(zero_where(b, b.aten.logical_not(clamped), g), b.shape(bound)))
    return b.sum_to(gx, b.shape(x)), *grads


@defrule("aten.elu", slices=elementwise)
def elu(b, g, out, x, alpha, scale, input_scale):
    """g scale where x > 0, else g input_scale (y + alpha scale) (SELU and CELU are ELUs too)."""
    negative = b.mul(b.aten.add.Scalar(out, alpha * scale, 1), input_scale)
    slope = b.aten.where.self(b.aten.gt.Scalar(x, 0.0), b.full((), float(scale), b.type_of(g).dtype), negative)
    return b.mul(g, slope), None, None, None


@defrule("aten.leaky_relu", slices=elementwise)
def leaky_relu(b, g, out, x, negative_slope):
    """g where x > 0, else g negative_slope."""
    slope = b.aten.where.self(
        b.aten.gt.Scalar(x, 0.0),
        b.full((), 1.0, b.type_of(g).dtype),
        b.full((), float(negative_slope), b.type_of(g).dtype),
    )
    return b.mul(g, slope), None
