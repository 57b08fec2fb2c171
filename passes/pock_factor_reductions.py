"""pock-factor-reductions: take the factors a sum does not vary over out of it, and share equal sums.

Differentiating a normalisation op by op sums the same product several times, each scaled by a
per-channel factor: batch norm's backward sums dy, dy * xhat, dy * w * (x - mean) and
-dy * w * rstd over the batch and the positions, four passes over the activations where
sum(dy) and sum(dy * (x - mean)) carry it all (w and rstd do not vary over the summed dims).
This pass rewrites sum(a * c), c constant along the summed dims (its size is 1 there, or a
scalar), as sum(a) * c, and gives equal sums of equal products one op, so those four become two.
A product it sums is built on the largest product of its factors already summed (dy * (x - mean)
on dy), so that a factor of that product (a ReLU6's mask) keeps one user and IREE fuses it.
Only `aten.sum.dim_IntList` with keepdim and no dtype, over `aten.mul.Tensor` and
`aten.mul.Scalar` trees; the sum's result type is kept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.torch_builder import TorchBuilder, constant_value, tensor_type_of

from .base import ModulePass, functions


def _factors(value: ir.Value) -> list:
    """The factors of a product of mul.Tensor and mul.Scalar ops: tensor values, or Python numbers."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return [value]
    if owner.name == "torch.aten.mul.Tensor" and all(tensor_type_of(v) is not None for v in owner.operands):
        return _factors(owner.operands[0]) + _factors(owner.operands[1])
    if owner.name == "torch.aten.mul.Scalar":
        try:
            scalar = constant_value(owner.operands[1])
        except ValueError:
            return [value]
        if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
            return _factors(owner.operands[0]) + [scalar]
    return [value]


def _constant_along(value: ir.Value, dims: tuple[int, ...], rank: int) -> bool:
    """Whether a factor of a rank-`rank` product has size 1 on each of `dims` (broadcasting aligns
    shapes on the right)."""
    shape = tuple(tensor_type_of(value).shape)
    padded = (1,) * (rank - len(shape)) + shape
    return all(padded[d] == 1 for d in dims)


@dataclass
class _Block:
    """One block's products and sums by their varying factors (in program order), built once each."""

    order: dict  # a value's position in the block
    products: dict
    sums: dict

    def product(self, b: TorchBuilder, factors: tuple) -> ir.Value:
        """The product of `factors`, built once, on the largest product of some of them already
        built: a batch norm's dy = g * mask then stays the one value that both sum(dy) and
        sum(dy * x) read, and the ReLU6 mask has that one user, which IREE fuses it into."""
        if len(factors) == 1:
            return factors[0]
        if factors not in self.products:
            built = [p for p in self.products if len(p) < len(factors) and not Counter(p) - Counter(factors)]
            part = max(built, key=len, default=factors[:-1])
            rest = tuple((Counter(factors) - Counter(part)).elements())
            self.products[factors] = b.mul(self.product(b, part), self.product(b, rest))
        return self.products[factors]


def _rewrite(op: ir.Operation, block: _Block) -> None:
    """sum(varying * constant * numbers) -> sum(varying) * constant * numbers, the sum shared."""
    source = op.operands[0]
    source_type, result_type = tensor_type_of(source), tensor_type_of(op.results[0])
    try:
        dims, keepdim, dtype = (constant_value(v) for v in op.operands[1:4])
    except ValueError:
        return
    if (
        source_type is None
        or keepdim is not True
        or dtype is not None
        or not dims
        or any(d is None or d < 0 for d in source_type.shape)
    ):
        return
    rank = len(source_type.shape)
    dims = tuple(sorted({d % rank for d in dims}))
    factors = _factors(source)
    numbers = [f for f in factors if not isinstance(f, ir.Value)]
    tensors = [f for f in factors if isinstance(f, ir.Value)]
    if any(f not in block.order or tensor_type_of(f).element != source_type.element for f in tensors):
        return
    varying = tuple(sorted((f for f in tensors if not _constant_along(f, dims, rank)), key=block.order.get))
    constant = [f for f in tensors if _constant_along(f, dims, rank)]
    if not varying:
        return
    key = (varying, dims)
    if not constant and not numbers:
        if len(varying) > 1:
            block.products.setdefault(varying, source)
        if key not in block.sums:
            block.sums[key] = op.results[0]
            return
    b = TorchBuilder(ir.InsertionPoint(op), op.location)
    if key not in block.sums:
        block.sums[key] = b.sum(block.product(b, varying), dims, keepdim=True)
    result = block.sums[key]
    for factor in constant:
        result = b.mul(result, factor)
    for number in numbers:
        result = b.aten.mul.Scalar(result, number)
    if tensor_type_of(result) != result_type:  # a constant factor broadcast the sum: left as it was
        return
    op.results[0].replace_all_uses_with(result)
    op.erase()


@dataclass(frozen=True)
class FactorReductionsPass(ModulePass):
    name = "pock-factor-reductions"
    description = (
        "Take factors constant along a sum's dims out of it (sum(a * c) -> sum(a) * c) and share equal "
        "sums: a normalisation's backward sums each product once"
    )

    def apply(self, module: ir.Operation) -> None:
        for func in functions(module):
            for region_block in func.regions[0].blocks:
                ops = [op.operation for op in region_block.operations]
                order = {arg: i - len(region_block.arguments) for i, arg in enumerate(region_block.arguments)}
                for i, op in enumerate(ops):
                    order.update({result: i for result in op.results})
                block = _Block(order, products={}, sums={})
                for op in ops:
                    if op.name == "torch.aten.sum.dim_IntList":
                        _rewrite(op, block)
