"""The rule table and the helpers rules share.

A rule is registered under the op's name without the `torch.` prefix (in
pock_mlir.op_facts.FACTS, with what else the compiler knows of the op) and is called as
`rule(b, g, out, *args)`: `b` is a TorchBuilder placed at the backward pass, `g` the
cotangent of the op's result (a tuple for several results, zeros where a result has none),
`out` its forward result(s), and `args` the forward operands, tensors as values and constants
as Python values. It returns one cotangent per operand, None where an operand has none
(constants, indices); for a tensor-list operand, a list with one cotangent per element.
The builder's helpers (`sum_to`, `expand_to`, ...) carry broadcasting, so rules read like
the maths. A rule raises NotImplementedError for attribute values it does not cover (say, a
transposed convolution); pock-autodiff reports that at the op's source line.
"""

from collections.abc import Callable

from pock_mlir.op_facts import declare
from pock_mlir.torch_builder import TorchBuilder

Rule = Callable[..., tuple]


def defrule(*names: str, **facts):
    """Register the decorated function as the derivative rule of `names`, with the ops' other
    facts as keywords (pock_mlir.op_facts.OpFacts: slices=, view=, free=, flops=)."""

    def register(fn: Rule) -> Rule:
        declare(*names, rule=fn, **facts)
        return fn

    return register


def reduced_size(shape, dims) -> int:
    """How many elements a reduction over `dims` (None or [] for all) combines."""
    size = 1
    for d in range(len(shape)) if not dims else dims:
        if not -len(shape) <= d < len(shape):
            raise ValueError(f"dimension {d} is out of range for a tensor of rank {len(shape)}")
        size *= shape[d]
    return size


def unreduce(b: TorchBuilder, g, dims, keepdim, shape):
    """Broadcast the cotangent of a reduction over `dims` back to the input `shape`."""
    rank = len(shape)
    dims = range(rank) if dims is None or dims == [] else [d % rank for d in dims]
    if not keepdim:
        for d in sorted(dims):
            g = b.aten.unsqueeze(g, d)
    return b.expand_to(g, shape)


def zero_where(b: TorchBuilder, cond, x):
    """x with the elements where `cond` holds set to zero."""
    return b.aten.where.self(cond, b.full((), 0.0, b.type_of(x).dtype), x)


def scatter_into_zeros(b: TorchBuilder, like, dim: int, index, g):
    """g added into zeros shaped as `like` at `index` along `dim`, a dimension counted from the front:
    IREE 3.13 crashed (SIGSEGV) compiling a scatter_add over dimension -1."""
    return b.aten.scatter_add(b.zeros_like(like), dim % len(b.shape(like)), index, g)
