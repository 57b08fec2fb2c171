"""pock-backend-switch: give each convolution the implementation measured fastest on the target,
and choose whether IREE data-tiles the program's matmuls.

A convolution can run as IREE's linalg convolution ("direct": whatever the target's IREE flags
make of it, e.g. IREE's own im2col), as explicit im2col + one matmul ("im2col": also for
torch.aten.convolution_backward's weight and input gradients, the latter folded back with
col2im), or, depthwise, as per-tap multiply-adds of shifted input windows ("patches"). The choice comes
from pock_mlir/tuning/<target>.json (the nearest measured shape class), written by
`python -m bench.iree_study convs`; without measurements every op stays direct.

The choice is visible in the IR: the op doing the work carries `pock.backend = "<form>"` and
`pock.backend_reason = "<the measurements behind it>"` (TrainingProgram.backend_report()
lists them). Convolutions the forms do not cover (dilated, transposed, non-square) stay direct.

Data tiling (IREE packs matmul operands into the CPU's register-tile layout) is a flag of the
whole IREE compilation, so its choice marks the module: `pock.data_tiling = "data-tiled"` or
`"plain"`, with `pock.data_tiling_reason` (see choose_data_tiling); TrainingProgram.iree_flags()
adds the flag when the lowered module says "data-tiled".
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.cost import op_flops
from pock_mlir.torch_builder import TorchBuilder, decode_operand
from pock_mlir.torch_types import tensor_type_of
from pock_mlir.tuning import (Choice, ConvShape, choose_conv_form, choose_data_tiling, conv_forward_im2col,
                              conv_forward_patches, conv_input_grad_im2col, conv_weight_grad_im2col,
                              conv_weight_grad_patches)

from .base import ModulePass, PassError, functions, option

FORMS = ("direct", "im2col", "patches")
EMITTERS = {
    ("forward", "im2col"): lambda b, x, w, g, s: conv_forward_im2col(b, x, w, s),
    ("forward", "patches"): lambda b, x, w, g, s: conv_forward_patches(b, x, w, s),
    ("weight_grad", "im2col"): lambda b, x, w, g, s: conv_weight_grad_im2col(b, g, x, s),
    ("weight_grad", "patches"): lambda b, x, w, g, s: conv_weight_grad_patches(b, g, x, s),
    ("input_grad", "im2col"): lambda b, x, w, g, s: conv_input_grad_im2col(b, g, w, s),
}
WORK_OPS = ("torch.aten.mm", "torch.aten.sum.dim_IntList")  # the op of a form that carries the marks
CONVOLUTIONS = ("torch.aten.convolution", "torch.aten.convolution_backward")
MATMULS = ("torch.aten.mm", "torch.aten.bmm", "torch.aten.matmul")


def conv_shape(x, w, stride, padding, dilation, transposed, output_padding, groups) -> ConvShape | None:
    """The ConvShape of a plain 2-D convolution, or None for one the forms do not cover."""
    xt, wt = tensor_type_of(x), tensor_type_of(w)
    if xt is None or wt is None or xt.rank != 4 or transposed or any(output_padding or [0]):
        return None
    if len(set(stride)) != 1 or len(set(padding)) != 1 or set(dilation) != {1} or wt.shape[2] != wt.shape[3]:
        return None
    n, c, h, w_ = xt.shape
    return ConvShape(n, c, h, w_, wt.shape[0], wt.shape[2], stride[0], padding[0], groups)


def _mark(op, choice: Choice, what: str) -> None:
    op.attributes["pock.backend"] = ir.StringAttr.get(choice.form)
    op.attributes["pock.backend_reason"] = ir.StringAttr.get(f"{what}: {choice.reason}")


def _emit(op, emitter):
    """Emit a form before `op`; returns its result and the ops to mark: the matmuls and sums doing
    the work, or for a form made of elementwise ops, the one producing the result."""
    before = {o.operation for o in op.block.operations}
    result = emitter(TorchBuilder(ir.InsertionPoint(op), op.location))
    work = [o.operation for o in op.block.operations if o.operation not in before and o.name in WORK_OPS]
    return result, work or [result.owner]


@dataclass(frozen=True)
class BackendSwitchPass(ModulePass):
    name = "pock-backend-switch"
    description = ("Give each convolution (and convolution_backward) the form measured fastest on the target: "
                   "direct, im2col + matmul or depthwise patches; marks the choice as pock.backend. Marks the "
                   "module with whether IREE should data-tile its matmuls (pock.data_tiling)")
    target: str = option("host", "tuning table to choose by: pock_mlir/tuning/<target>.json")
    force: str = option("", "use this form wherever it is implemented instead of choosing: direct, im2col or patches")
    min_speedup: float = option(1.25, "choose a form other than direct only if measured at least this much faster "
                                      "(timings on a shared machine vary by 10-20%)")

    def apply(self, module: ir.Operation) -> None:
        if self.force and self.force not in FORMS:
            raise PassError(f"force must be one of {', '.join(FORMS)}, got '{self.force}'")
        ops = [op.operation for func in functions(module) for op in func.regions[0].blocks[0].operations]
        tiling = choose_data_tiling(self.target, any(op.name in CONVOLUTIONS for op in ops),
                                    max((op_flops(op) for op in ops if op.name in MATMULS), default=0))
        module.attributes["pock.data_tiling"] = ir.StringAttr.get(tiling.form)
        module.attributes["pock.data_tiling_reason"] = ir.StringAttr.get(tiling.reason)
        for func in functions(module):
            for op in list(func.regions[0].blocks[0].operations):
                op = op.operation
                if op.name == "torch.aten.convolution":
                    self._forward(op)
                elif op.name == "torch.aten.convolution_backward":
                    self._backward(op)

    def _choose(self, shape: ConvShape, op: str) -> Choice:
        if self.force:
            form = self.force if self.force in shape.forms(op) else "direct"
            return Choice(form, f"forced by force={self.force}")
        return choose_conv_form(self.target, shape, op, self.min_speedup)

    def _forward(self, op) -> None:
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = map(decode_operand, op.operands)
        shape = conv_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
        if shape is None:
            _mark(op, Choice("direct", "only the direct form covers dilated, transposed or non-square convolutions"),
                  "convolution")
            return
        choice = self._choose(shape, "forward")
        what = f"convolution {shape.kind()}"
        if choice.form == "direct":
            _mark(op, choice, what)
            return
        y, work = _emit(op, lambda b: EMITTERS["forward", choice.form](b, x, w, None, shape))
        if bias is not None:
            b = TorchBuilder(ir.InsertionPoint(op), op.location)
            y = b.add(y, b.reshape(bias, [1, shape.o, 1, 1]))
        for work_op in work:
            _mark(work_op, choice, what)
        op.results[0].replace_all_uses_with(y)
        op.erase()

    def _backward(self, op) -> None:
        g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = map(
            decode_operand, op.operands)
        shape = conv_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
        wanted = [bool(m) and bool(list(r.uses)) for m, r in zip(mask, op.results)]
        if shape is None:
            _mark(op, Choice("direct", "only the direct form covers dilated, transposed or non-square convolutions"),
                  "convolution_backward")
            return
        choices = {name: self._choose(shape, name) for name, want in zip(("input_grad", "weight_grad"), wanted) if want}
        replaced = {name: c for name, c in choices.items() if c.form != "direct"}
        if not replaced:
            _mark(op, next(iter(choices.values()), Choice("direct", "no gradient used")), f"backward {shape.kind()}")
            return
        results = {}
        for index, name in enumerate(("input_grad", "weight_grad")):
            if name in replaced:
                value, work = _emit(op, lambda b: EMITTERS[name, replaced[name].form](b, x, w, g, shape))
                for work_op in work:
                    _mark(work_op, replaced[name], f"{name} {shape.kind()}")
                results[index] = value
        b = TorchBuilder(ir.InsertionPoint(op), op.location)
        if wanted[2]:
            results[2] = b.sum(g, [0, 2, 3])
        direct = [name for name in choices if name not in replaced]
        if direct:  # what stays direct: a convolution_backward computing only that gradient
            keep = [name in direct for name in ("input_grad", "weight_grad")] + [False]
            operands = list(op.operands[:-1]) + [b.operand(keep)]
            types = [r.type if k else ir.Type.parse("!torch.none") for r, k in zip(op.results, keep)]
            rest = ir.Operation.create(op.name, results=types, operands=operands, loc=op.location,
                                       ip=ir.InsertionPoint(op))
            _mark(rest, choices[direct[0]], f"{direct[0]} {shape.kind()}")
            for index, k in enumerate(keep):
                if k:
                    results[index] = rest.results[index]
        for index, value in results.items():
            op.results[index].replace_all_uses_with(value)
        op.erase()
