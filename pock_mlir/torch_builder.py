"""Emitting torch-dialect ops from Python.

`TorchBuilder.aten.<op>.<overload>(*args)` creates `torch.aten.<op>.<overload>` with constant
operands for Python values, and infers its result type by running the same ATen op on meta
tensors (a pointwise op's dtype on one CPU element: _run_on_meta), so derivative rules and
lowerings never compute shapes by hand. A handful of arithmetic helpers (`add`, `mul`, `sum_to`,
...) accept Python scalars as well as values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from torch_mlir import ir

from pock_mlir.torch_types import TensorType, parse_tensor_type, scalar_type_code, tensor_type_of

if TYPE_CHECKING:  # for the annotations only
    import torch

# PyTorch is imported when the first op is built (meta tensors infer its type), so that reading and
# rewriting IR without building ops stays torch-free (pock_mlir/torch_types.py).


def resolve_overload(qualified: str) -> tuple[torch._ops.OpOverload, str]:
    """'aten.sum.dim_IntList' -> (torch.ops.aten.sum.dim_IntList, 'torch.aten.sum.dim_IntList')."""
    import torch

    parts = qualified.split(".")
    namespace, op_name = parts[0], parts[1]
    overload = parts[2] if len(parts) > 2 else "default"
    packet = getattr(getattr(torch.ops, namespace), op_name)
    mlir_name = f"torch.{namespace}.{op_name}" + ("" if overload == "default" else f".{overload}")
    return getattr(packet, overload), mlir_name


def constant_value(value: ir.Value):
    """The Python value of a torch-dialect constant operand (int, float, bool, None, str,
    or a list of them); raises ValueError for a value computed at run time."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        raise ValueError("a block argument is not a compile-time constant")
    name = owner.name
    if name in ("torch.constant.int",):
        return ir.IntegerAttr(owner.attributes["value"]).value
    if name == "torch.constant.float":
        return ir.FloatAttr(owner.attributes["value"]).value
    if name == "torch.constant.bool":
        return ir.BoolAttr(owner.attributes["value"]).value
    if name == "torch.constant.none":
        return None
    if name in ("torch.constant.str", "torch.constant.device"):
        return ir.StringAttr(owner.attributes["value"]).value
    if name == "torch.prim.ListConstruct":
        return [constant_value(v) if tensor_type_of(v) is None else v for v in owner.operands]
    raise ValueError(f"{name} is not a compile-time constant")


def decode_operand(value: ir.Value):
    """A tensor operand stays an ir.Value; a constant operand becomes its Python value."""
    if tensor_type_of(value) is not None:
        return value
    return constant_value(value)


def _matrix_transpose_source(value: ir.Value):
    """The matrix that `value` is the transpose of (aten.t, transpose.int or permute [1, 0]), or None."""
    owner, matrix = value.owner, parse_tensor_type(value.type)
    if isinstance(owner, ir.Block) or matrix is None or len(matrix.shape) != 2:
        return None
    if owner.name == "torch.aten.t":
        return owner.operands[0]
    if owner.name == "torch.aten.transpose.int" and sorted(constant_value(v) % 2 for v in owner.operands[1:]) == [0, 1]:
        return owner.operands[0]
    if owner.name == "torch.aten.permute" and constant_value(owner.operands[1]) == [1, 0]:
        return owner.operands[0]
    return None


def _run_on_meta(overload: torch._ops.OpOverload, positional: list, keywords: dict):
    """The op's results on meta tensors. A pointwise op (PyTorch's tag: its result has its tensor
    operands' broadcast shape) gets its dtype from PyTorch's CPU kernel on one element of each
    operand, of the operand's rank (promotion treats 0-d tensors apart): PyTorch's meta kernels for
    these ops (and stack's) are Python that imports torch._dynamo on first call, the longer half of a
    pock-opt run."""
    import torch

    def element(a):
        return torch.ones((1,) * a.dim(), dtype=a.dtype) if isinstance(a, torch.Tensor) else a

    if overload == torch.ops.aten.stack.default and len({t.shape for t in positional[0]}) == 1:
        # stack's meta kernel is Python too: its result is its operands' shape with their count
        # inserted at dim; the CPU kernel on elements checks dim and gives the promoted dtype.
        tensors, dim = positional[0], positional[1] if len(positional) > 1 else 0
        dtype = overload([element(t) for t in tensors], dim).dtype
        shape = list(tensors[0].shape)
        shape.insert(dim % (len(shape) + 1), len(tensors))
        return torch.empty(shape, dtype=dtype, device="meta")
    arguments = [*positional, *keywords.values()]
    if (
        torch.Tag.pointwise not in overload.tags
        or len(overload._schema.returns) != 1
        or not all(isinstance(a, (torch.Tensor, bool, int, float, type(None))) for a in arguments)
    ):
        return overload(*positional, **keywords)
    shape = torch.broadcast_shapes(*(a.shape for a in arguments if isinstance(a, torch.Tensor)))
    try:
        dtype = overload(*map(element, positional), **{k: element(v) for k, v in keywords.items()}).dtype
    except RuntimeError:  # a dtype without a CPU kernel for this op: the meta kernel decides, or names the error
        return overload(*positional, **keywords)
    return torch.empty(shape, dtype=dtype, device="meta")


class _OpNamespace:
    """`b.aten.mm(...)`, `b.aten.sum.dim_IntList(...)`: attribute access names the op."""

    def __init__(self, builder: TorchBuilder, path: str):
        self._builder, self._path = builder, path

    def __getattr__(self, part: str) -> _OpNamespace:
        return _OpNamespace(self._builder, f"{self._path}.{part}")

    def __call__(self, *args):
        return self._builder.op(self._path, *args)


class TorchBuilder:
    """Creates torch-dialect ops before an insertion point, at one source location."""

    def __init__(self, ip: ir.InsertionPoint, loc: ir.Location, created: list | None = None):
        """created: a list to which every op this builder creates is appended (to find them
        without walking the block)."""
        self.ip, self.loc, self.created = ip, loc, created
        self.aten = _OpNamespace(self, "aten")
        self.prims = _OpNamespace(self, "prims")

    def at(self, loc: ir.Location) -> TorchBuilder:
        return TorchBuilder(self.ip, loc, self.created)

    # -- op creation -------------------------------------------------------------------

    def _create(self, name, result_types, operands, attributes=None) -> ir.Operation:
        op = ir.Operation.create(
            name, results=result_types, operands=operands, attributes=attributes or {}, loc=self.loc, ip=self.ip
        )
        if self.created is not None:
            self.created.append(op)
        return op

    def op(self, qualified: str, *args):
        """Create `torch.<qualified>` on args; returns its result, or a tuple for several."""
        overload, mlir_name = resolve_overload(qualified)
        positional, keywords = [], {}
        for spec, arg in zip(overload._schema.arguments, args):
            meta = "meta" if spec.name == "device" else self._meta(arg)
            if spec.kwarg_only:
                keywords[spec.name] = meta
            else:
                positional.append(meta)
        try:
            meta_out = _run_on_meta(overload, positional, keywords)
        except Exception as e:  # shape errors surface here, naming the op being built
            raise ValueError(f"cannot build {mlir_name} on {[self._describe(a) for a in args]}: {e}") from e
        outs = meta_out if isinstance(meta_out, (tuple, list)) else (meta_out,)
        # An output the op was asked not to compute (convolution_backward's mask) is none.
        result_types = [
            ir.Type.parse("!torch.none" if o is None else TensorType.of(o.shape, o.dtype).asm()) for o in outs
        ]
        operands = [self.operand(a) for a in args]
        op = self._create(mlir_name, result_types, operands)
        return op.results[0] if len(op.results) == 1 else tuple(op.results)

    def operator(self, name: str, shape, *args):
        """`torch.operator "torch.<name>"` on args, of a float32 result of `shape`: an op of pock's own
        that IREE does not know (pock-expand-custom expands it before IREE sees it)."""
        import torch

        result_type = ir.Type.parse(TensorType.of(tuple(shape), torch.float32).asm())
        operands = [self.operand(a) for a in args]
        return self._create(
            "torch.operator", [result_type], operands, {"name": ir.StringAttr.get(f"torch.{name}")}
        ).result

    def _meta(self, arg):
        if isinstance(arg, ir.Value):
            t = tensor_type_of(arg)
            if t is None:
                raise TypeError(f"expected a !torch.vtensor operand, got {arg.type}")
            import torch

            return torch.empty(t.shape, dtype=t.dtype, device="meta")
        if isinstance(arg, (list, tuple)):
            return [self._meta(a) for a in arg]
        return arg

    @staticmethod
    def _describe(arg):
        if isinstance(arg, ir.Value):
            return str(arg.type)
        return repr(arg)

    def operand(self, arg) -> ir.Value:
        """An SSA operand for a value or a Python constant."""
        if isinstance(arg, ir.Value):
            return arg
        if arg is None:
            return self._create("torch.constant.none", [ir.Type.parse("!torch.none")], []).result
        if isinstance(arg, bool):
            return self._create(
                "torch.constant.bool", [ir.Type.parse("!torch.bool")], [], {"value": ir.BoolAttr.get(arg)}
            ).result
        if isinstance(arg, int):
            return self._create(
                "torch.constant.int",
                [ir.Type.parse("!torch.int")],
                [],
                {"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), arg)},
            ).result
        if isinstance(arg, float):
            return self._create(
                "torch.constant.float",
                [ir.Type.parse("!torch.float")],
                [],
                {"value": ir.FloatAttr.get(ir.F64Type.get(), arg)},
            ).result
        if isinstance(arg, str):
            return self._create(
                "torch.constant.str", [ir.Type.parse("!torch.str")], [], {"value": ir.StringAttr.get(arg)}
            ).result
        if isinstance(arg, (list, tuple)):
            items = [self.operand(a) for a in arg]
            element = self._list_element_type(arg)
            return self._create("torch.prim.ListConstruct", [ir.Type.parse(f"!torch.list<{element}>")], items).result
        code = scalar_type_code(arg)  # a torch.dtype
        if code is not None:
            return self.operand(code)
        raise TypeError(f"cannot make a torch-dialect operand from {arg!r}")

    @staticmethod
    def _list_element_type(items) -> str:
        if all(isinstance(a, ir.Value) for a in items) and items:
            return "vtensor"
        if all(isinstance(a, bool) for a in items) and items:
            return "bool"
        if all(isinstance(a, int) and not isinstance(a, bool) for a in items):
            return "int"
        if all(isinstance(a, (int, float)) for a in items):
            return "float"
        raise TypeError(f"cannot make a torch list from {items!r}")

    # -- helpers that keep rules reading like the maths ---------------------------------

    @staticmethod
    def type_of(value: ir.Value) -> TensorType:
        t = tensor_type_of(value)
        if t is None:
            raise TypeError(f"expected a !torch.vtensor, got {value.type}")
        return t

    def shape(self, value) -> tuple[int, ...]:
        return self.type_of(value).shape

    def add(self, x, y):
        if isinstance(y, ir.Value):
            return self.aten.add.Tensor(x, y, 1)
        return self.aten.add.Scalar(x, y, 1)

    def sub(self, x, y):
        if isinstance(y, ir.Value):
            return self.aten.sub.Tensor(x, y, 1)
        return self.aten.sub.Scalar(x, y, 1)

    def mul(self, x, y):
        if isinstance(y, ir.Value):
            return self.aten.mul.Tensor(x, y)
        return self.aten.mul.Scalar(x, y)

    def div(self, x, y):
        if isinstance(y, ir.Value):
            return self.aten.div.Tensor(x, y)
        return self.aten.div.Scalar(x, y)

    def neg(self, x):
        return self.aten.neg(x)

    def transpose(self, x, dim0=-2, dim1=-1):
        return self.aten.transpose.int(x, dim0, dim1)

    def matrix_transpose(self, x):
        """x^T for a matrix x, folding what a weight gradient would otherwise compute twice: a
        transposed transpose is its source, and a fresh product (A B)^T is built as B^T A^T. A
        linear layer's forward is mm(x, W^T), so its weight gradient arrives here as mm(x^T, g);
        folded, it is the single matmul g^T x in W's own layout, and the optimizer update reads it
        in place instead of through a transpose (measured on the LLaMA bench step: IREE fuses the
        transpose into the update as strided accesses, ~30% slower on those dispatches)."""
        source = _matrix_transpose_source(x)
        if source is not None:
            return source
        owner = x.owner
        if not isinstance(owner, ir.Block) and owner.name == "torch.aten.mm" and not list(x.uses):
            a, b = owner.operands
            return self.aten.mm(self.matrix_transpose(b), self.matrix_transpose(a))
        return self.transpose(x)

    def reshape(self, x, shape):
        return self.aten.view(x, list(shape))

    def sum(self, x, dims, keepdim=False):
        return self.aten.sum.dim_IntList(x, list(dims), keepdim, None)

    def full(self, shape, fill: float, dtype=None):
        """A tensor of `shape` filled with `fill`, of torch.dtype `dtype` (float32 by default)."""
        if dtype is None:
            import torch

            dtype = torch.float32
        return self.aten.full(list(shape), fill, dtype, None, None, False)

    def zeros_like(self, x):
        return self.full(self.shape(x), 0.0, self.type_of(x).dtype)

    def ones_like(self, x):
        return self.full(self.shape(x), 1.0, self.type_of(x).dtype)

    def literal(self, array: np.ndarray):
        """A constant tensor holding `array` (torch.vtensor.literal)."""
        import torch

        array = np.require(array, requirements="C")
        result_type = ir.Type.parse(TensorType.of(array.shape, torch.from_numpy(array).dtype).asm())
        return self._create(
            "torch.vtensor.literal", [result_type], [], {"value": ir.DenseElementsAttr.get(array)}
        ).result

    def cast(self, x, dtype: torch.dtype):
        if self.type_of(x).dtype == dtype:
            return x
        return self.prims.convert_element_type(x, dtype)

    def expand_to(self, x, shape):
        """Broadcast x to shape (numpy rules)."""
        if self.shape(x) == tuple(shape):
            return x
        return self.aten.expand(x, list(shape), False)

    def sum_to(self, x, shape):
        """Undo broadcasting: sum x down to `shape` (the reverse of expand_to)."""
        shape = tuple(shape)
        x_shape = self.shape(x)
        if x_shape == shape:
            return x
        lead = len(x_shape) - len(shape)
        dims = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and x_shape[lead + i] != 1]
        if dims:
            x = self.sum(x, dims, keepdim=True)
        return self.reshape(x, shape)
