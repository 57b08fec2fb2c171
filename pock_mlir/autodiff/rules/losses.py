"""Rules for the ops losses decompose into beyond the core ones: BCE-with-logits' stable form
max(x, 0) - x y + log1p(exp(-|x|)) uses abs, log1p and minimum."""

from .base import defrule


@defrule("aten.abs")
def abs_(b, g, out, x):
    """g sign(x) (zero at 0, as in torch)."""
    return (b.mul(g, b.aten.sign(x)),)


@defrule("aten.log1p")
def log1p(b, g, out, x):
    """g / (1 + x)."""
    return (b.div(g, b.add(x, 1.0)),)


def _pick(b, g, chosen, tied):
    """g where this operand was chosen, half of g where both tied (torch splits ties), else 0."""
    zero = b.full((), 0.0, b.type_of(g).dtype)
    return b.aten.where.self(chosen, g, b.aten.where.self(tied, b.mul(g, 0.5), zero))


@defrule("aten.minimum")
def minimum(b, g, out, x, y):
    """g to the smaller operand, split evenly on ties."""
    tied = b.aten.eq.Tensor(x, y)
    gx, gy = _pick(b, g, b.aten.lt.Tensor(x, y), tied), _pick(b, g, b.aten.gt.Tensor(x, y), tied)
    return b.sum_to(gx, b.shape(x)), b.sum_to(gy, b.shape(y))


@defrule("aten.maximum")
def maximum(b, g, out, x, y):
    """g to the larger operand, split evenly on ties."""
    tied = b.aten.eq.Tensor(x, y)
    gx, gy = _pick(b, g, b.aten.gt.Tensor(x, y), tied), _pick(b, g, b.aten.lt.Tensor(x, y), tied)
    return b.sum_to(gx, b.shape(x)), b.sum_to(gy, b.shape(y))
