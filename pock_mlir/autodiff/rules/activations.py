"""Rules for elementwise activations CNNs use beyond ReLU: sigmoid (SiLU and squeeze-excitation
gates), hardtanh (ReLU6) and clamp (Hardswish and Hardsigmoid decompose into x + 3 clamped to
[0, 6]). Each cotangent is g times the local slope; at a clamp's edges the slope follows torch.
"""

from pock_mlir.op_facts import elementwise

from .base import defrule


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
