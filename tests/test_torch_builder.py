"""TorchBuilder's result types against PyTorch's meta kernels: a pointwise op's type comes from its
operands' broadcast shape and PyTorch's CPU kernel on one element of each (pock_mlir/torch_builder.py),
which must be what the meta kernel gives, 0-d operands, scalars and mixed dtypes included."""

import subprocess
import sys

import pytest
import torch
from torch_mlir import ir

from pock_mlir.context import make_context
from pock_mlir.torch_builder import TorchBuilder, resolve_overload
from pock_mlir.torch_types import TensorType, parse_tensor_type

F32, F16, BF16, I64, I32, BOOL = torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool

# (op, operands): a tensor operand is (shape, dtype); anything else is passed as it is.
CASES = [
    ("aten.mul.Tensor", [((2, 1, 3), F32), ((4, 3), F32)]),
    ("aten.mul.Tensor", [((2, 3), F16), ((), F32)]),  # a 0-d tensor does not promote a dimensioned one
    ("aten.mul.Tensor", [((2, 3), I64), ((3,), F16)]),
    ("aten.add.Tensor", [((3,), BF16), ((2, 3), F16), 2]),
    ("aten.add.Scalar", [((2, 3), I64), 1.5, 1]),
    ("aten.sub.Tensor", [((), I64), ((), F32), 1]),
    ("aten.div.Tensor", [((2, 3), I64), ((2, 3), I32)]),  # true division: float
    ("aten.div.Scalar", [((4,), I64), 2]),
    ("aten.rsub.Scalar", [((2, 2), F32), 1, 1]),
    ("aten.pow.Tensor_Scalar", [((2, 3), F16), 2]),
    ("aten.pow.Scalar", [2.0, ((3,), I64)]),
    ("aten.where.self", [((2, 1), BOOL), ((1, 3), F32), ((), F32)]),
    ("aten.masked_fill.Scalar", [((2, 3), F32), ((1, 3), BOOL), 0.0]),
    ("aten.gt.Scalar", [((2, 3), F32), 0.5]),
    ("aten.eq.Tensor", [((2, 3), I64), ((3,), I64)]),
    ("aten.logical_and", [((2, 3), BOOL), ((2, 1), BOOL)]),
    ("aten.sqrt", [((5,), I64)]),
    ("aten.exp", [((2, 3), BF16)]),
    ("aten.sign", [((3,), I64)]),
    ("aten.abs", [((3,), F16)]),
    ("aten.abs", [((3,), BOOL)]),  # no CPU kernel for bool: the meta kernel, which accepts it, decides
    ("aten.clamp_min", [((2, 3), I64), 0.5]),
    ("aten.threshold_backward", [((2, 3), F32), ((2, 3), F32), 0.0]),
]


def _function_body():
    """A block of a new function to build ops into (with a context and location active)."""
    module = ir.Module.create()
    func = ir.Operation.create(
        "func.func",
        regions=1,
        ip=ir.InsertionPoint(module.body),
        attributes={"sym_name": ir.StringAttr.get("f"), "function_type": ir.TypeAttr.get(ir.FunctionType.get([], []))},
    )
    return module, func.regions[0].blocks.append()


def _argument(body, shape, dtype):
    return body.add_argument(ir.Type.parse(TensorType.of(shape, dtype).asm()), ir.Location.unknown())


@pytest.mark.parametrize("op, operands", CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CASES)])
def test_a_pointwise_result_type_is_the_meta_kernels(op, operands):
    with make_context(), ir.Location.unknown():
        module, body = _function_body()
        args = [_argument(body, *a) if isinstance(a, tuple) else a for a in operands]
        got = parse_tensor_type(TorchBuilder(ir.InsertionPoint(body), ir.Location.unknown()).op(op, *args).type)
    kernel, _ = resolve_overload(op)
    metas = [torch.empty(a[0], dtype=a[1], device="meta") if isinstance(a, tuple) else a for a in operands]
    specs = kernel._schema.arguments
    want = kernel(
        *[m for m, spec in zip(metas, specs) if not spec.kwarg_only],
        **{spec.name: m for m, spec in zip(metas, specs) if spec.kwarg_only},
    )
    assert (got.shape, got.dtype) == (tuple(want.shape), want.dtype)


def test_operands_that_do_not_broadcast_are_an_error_naming_the_op():
    with make_context(), ir.Location.unknown():
        module, body = _function_body()
        a, b = _argument(body, (2, 3), F32), _argument(body, (4,), F32)
        with pytest.raises(ValueError, match=r"cannot build torch\.aten\.mul\.Tensor on .*\[2,3\].*\[4\]"):
            TorchBuilder(ir.InsertionPoint(body), ir.Location.unknown()).aten.mul.Tensor(a, b)


def test_pock_opt_building_pointwise_ops_does_not_import_dynamo(tmp_path):
    """PyTorch's meta kernels for pointwise ops import torch._dynamo (about a second); the builder
    does not need them, so a pock-opt run whose rules emit only such ops does without it."""
    source = tmp_path / "relu.mlir"
    source.write_text(
        "func.func @f(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32> {\n"
        '  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : '
        "(!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>\n"
        "  %y = torch.aten.mul.Tensor %x, %p : !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32> -> !torch.vtensor<[2,3],f32>\n"
        "  %r = torch.aten.relu %y : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[2,3],f32>\n"
        "  %none = torch.constant.none\n"
        "  %loss = torch.aten.sum %r, %none : !torch.vtensor<[2,3],f32>, !torch.none -> !torch.vtensor<[],f32>\n"
        '  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>\n'
        "  return %g : !torch.vtensor<[2,3],f32>\n}\n"
    )
    probe = (
        "import sys; from pock_mlir.tools.pock_opt import main; code = main([sys.argv[1], '-p', 'pock-autodiff']); "
        "print('torch' in sys.modules, 'torch._dynamo' in sys.modules); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pock.grad" not in done.stdout and "torch.aten.mul.Tensor" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "True False"


# (operand types, dim): stack's type is its operands' shape with their count at dim (the builder's
# own rule, not PyTorch's meta kernel, which imports torch._dynamo), and their promoted dtype.
STACKS = [
    ([((2, 3), F32), ((2, 3), F32)], 0),
    ([((2, 3), F32), ((2, 3), F32), ((2, 3), F32)], 2),
    ([((2, 3), F16), ((2, 3), F32)], -1),
    ([((4,), I64), ((4,), BOOL)], -2),
    ([((), BF16), ((), BF16)], 0),
]


@pytest.mark.parametrize("operands, dim", STACKS)
def test_a_stack_result_type_is_the_meta_kernels(operands, dim):
    with make_context(), ir.Location.unknown():
        module, body = _function_body()
        tensors = [_argument(body, *a) for a in operands]
        got = parse_tensor_type(
            TorchBuilder(ir.InsertionPoint(body), ir.Location.unknown()).aten.stack(tensors, dim).type
        )
    want = torch.stack([torch.empty(s, dtype=d, device="meta") for s, d in operands], dim)
    assert (got.shape, got.dtype) == (tuple(want.shape), want.dtype)


@pytest.mark.parametrize(
    "shapes, dim, message",
    [([(2, 3), (3, 2)], 0, "stack expects each tensor to be equal size"), ([(2, 3), (2, 3)], 3, "out of range")],
)
def test_a_stack_of_unequal_shapes_or_a_dim_out_of_range_is_an_error_naming_the_op(shapes, dim, message):
    with make_context(), ir.Location.unknown():
        module, body = _function_body()
        tensors = [_argument(body, s, F32) for s in shapes]
        with pytest.raises(ValueError, match=rf"cannot build torch\.aten\.stack .*{message}"):
            TorchBuilder(ir.InsertionPoint(body), ir.Location.unknown()).aten.stack(tensors, dim)
